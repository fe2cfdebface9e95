"""Tasks a /run server may run: a request's task name under --tasks-root, its snapshot, its limits.

Owns the rule that a task is a directory below the tasks root (a relative name of at most
`MAX_TASK_NAME` characters without control characters; absolute paths and `..` are rejected),
loaded from one private snapshot (`rl360_ext.harbor.snapshot`: opened by descriptor, no link
followed in any segment of the name or inside the task, links that leave the task, link loops
and FIFOs/devices/sockets refused, naming the path, every time it loads); that nothing of the
server's environment reaches a task through its env tables (a `${...}` template in any `env`
or `headers` table of task.toml, at any depth, is refused unless every name in it is one the
operator allow-listed with --allow-env: the same answer whether the variable is set or not);
and what rl360 reads from a Harbor task before admission: its image group (for pinning), its
resource reservation and the time limits the deadline budget must respect. Harbor's own
`Task` class parses and validates task.toml (the snapshot's), once per snapshot: `harbor_task`
hands the trials that share a snapshot the one parsed `Task`. Every load returns a snapshot in
`TaskInfo.path` (shared with the loads of the same tree: `rl360_ext.harbor.snapshot`); `release`
drops it, and the last release removes it. It does not own running the task.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import threading
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.environments.definition import environment_content_hash
from harbor.models.task.file_filter import TaskFileFilter
from harbor.models.task.task import Task
from harbor.utils.file_selection import FileSelection

from rl360_ext.harbor.admission import Reservation
from rl360_ext.harbor.errors import TaskInvalid, TaskNotFound, TaskPathRejected
from rl360_ext.harbor.snapshot import Snapshot, SnapshotStore, TaskNameIsALink, TaskSnapshotRefused

__all__ = ["MAX_TASK_NAME", "TaskCatalog", "TaskInfo", "TaskInvalid", "TaskNotFound", "TaskPathRejected"]

MAX_TASK_NAME = 255
_FIELD = "task"
# Harbor fills `${NAME}` and `${NAME:-default}` (harbor.utils.env) in these tables from os.environ.
_RESOLVED_TABLES = frozenset({"env", "headers"})
_TEMPLATE_NAME = re.compile(r"\$\{([^}:]*)")
_CACHED_TASKS = 1024  # what was read from a snapshot, by its digest


class SnapshotFileFilter(TaskFileFilter):
    """Harbor's task-file filter (.harborignore rules) over a snapshot, which nothing changes
    once taken: each path's verdict and each directory's selection are computed once, not at
    every trial (the verifier selects the tests, walking them with `pathlib`, per attempt)."""

    def __init__(self, task_dir: Path | str) -> None:
        super().__init__(task_dir)
        self._excluded: dict[Path, bool] = {}
        self._selections: dict[Path, FileSelection] = {}

    def is_excluded(self, path: Path) -> bool:
        found = self._excluded.get(path)
        if found is None:
            found = self._excluded[path] = super().is_excluded(path)
        return found

    def select(self, source_dir: Path) -> FileSelection:
        found = self._selections.get(source_dir)
        if found is None:
            found = self._selections[source_dir] = super().select(source_dir)
        return found


class SnapshotTask(Task):
    """Harbor's `Task` of a snapshot, which nothing changes once taken: its content checksum
    (Harbor re-hashes the task's files at every trial's start) and its file selections are
    computed once."""

    def __init__(self, task_dir: Path | str) -> None:
        super().__init__(task_dir)
        self.file_filter = SnapshotFileFilter(self.file_filter.task_dir)

    @functools.cached_property
    def checksum(self) -> str:
        return super().checksum


@dataclass(frozen=True)
class TaskInfo:
    name: str
    path: Path
    image_group: str
    reservation: Reservation
    environment_setup_s: float
    verifier_s: float
    agent_s: float | None
    digest: str = ""
    """The snapshot's content digest: one tree, one digest (what a control is cached by)."""
    floor_reward: float | None = None
    """The task's `[metadata] floor_reward`, where it declares one."""


def image_group(task: Task) -> str:
    """[metadata] image_group, else the task's docker_image, else a hash of its environment/ dir."""
    declared = task.config.metadata.get("image_group")
    if isinstance(declared, str) and declared:
        return declared
    if task.config.environment.docker_image:
        return task.config.environment.docker_image
    return "env-" + environment_content_hash(task.paths.environment_dir, truncate=12)


def env_templates(config: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, list[str]]]:
    """(dotted key, names) of every value of an `env` or `headers` table, at any depth of a task's
    task.toml, that holds a `${` template."""
    if isinstance(config, dict):
        for key, value in config.items():
            here = (*path, str(key))
            if key in _RESOLVED_TABLES and isinstance(value, dict):
                for name, text in value.items():
                    if isinstance(text, str) and "${" in text:
                        yield ".".join((*here, str(name))), _TEMPLATE_NAME.findall(text)
            else:
                yield from env_templates(value, here)
    elif isinstance(config, list):
        for index, item in enumerate(config):
            yield from env_templates(item, (*path, str(index)))


class TaskCatalog:
    def __init__(
        self,
        root: Path,
        default_reservation: Reservation,
        snapshots: SnapshotStore,
        allowed_env: tuple[str, ...] = (),
    ) -> None:
        self.root = root.resolve()
        if not self.root.is_dir():
            raise FileNotFoundError(f"tasks root {root} is not a directory")
        self.default_reservation = default_reservation
        self.snapshots = snapshots
        self.allowed_env = frozenset(allowed_env)
        self._read_before: dict[str, TaskInfo] = {}
        self._parsed: dict[Path, Task] = {}  # Harbor's Task of each live snapshot, by its path
        self._lock = threading.Lock()  # loads run in threads

    @staticmethod
    def resolve(name: str) -> PurePosixPath:
        """The task's path relative to the tasks root; raises TaskPathRejected for a name that is not one."""
        if len(name) > MAX_TASK_NAME:
            raise TaskPathRejected(
                _FIELD, f"task name is {len(name)} characters long; at most {MAX_TASK_NAME}"
            )
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
            raise TaskPathRejected(_FIELD, f"task name contains a control character: {name!r}")
        relative = PurePosixPath(name)
        if not name or relative.is_absolute() or ".." in relative.parts or "\\" in name:
            raise TaskPathRejected(
                _FIELD, f"task must be a relative path inside the tasks root, got {name!r}"
            )
        return relative

    def _snapshot(self, name: str) -> Snapshot:
        relative = self.resolve(name)
        try:
            return self.snapshots.take(self.root, relative)
        except TaskNameIsALink as exc:
            raise TaskPathRejected(
                _FIELD, f"task {name!r}: {exc}; task paths are never followed through links"
            ) from exc
        except TaskSnapshotRefused as exc:
            raise TaskInvalid(_FIELD, f"task {name!r}: {exc}") from exc
        except FileNotFoundError as exc:
            raise TaskNotFound(_FIELD, f"no task {name!r} under the tasks root") from exc
        except OSError as exc:
            raise TaskInvalid(_FIELD, f"task {name!r} could not be read: {exc.strerror or exc}") from exc

    def _check_env(self, name: str, path: Path) -> None:
        """Refuse templates in task.toml as written (before Harbor parses it, so no model of it
        can hide or rename a table); an unparsable file is left to Harbor's own error."""
        try:
            written = tomllib.loads((path / "task.toml").read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            return
        for key, names in env_templates(written):
            if not names or not set(names) <= self.allowed_env:
                raise TaskInvalid(
                    _FIELD,
                    f"task {name!r}: {key} uses a ${{...}} template; the server fills no task value "
                    "from its own environment except variables its operator allow-listed (--allow-env)",
                )

    def load(self, name: str) -> TaskInfo:
        """The task's snapshot and what admission needs from it; `release` the result when done.
        A snapshot whose tree was read before (same digest) is not parsed again."""
        snapshot = self._snapshot(name)
        try:
            with self._lock:
                known = self._read_before.get(snapshot.digest)
            if known is not None:
                return dataclasses.replace(known, name=name, path=snapshot.path)
            info = dataclasses.replace(self._read(name, snapshot.path), digest=snapshot.digest)
        except BaseException:
            self.snapshots.release(snapshot.path)
            raise
        with self._lock:
            if len(self._read_before) >= _CACHED_TASKS:
                self._read_before.pop(next(iter(self._read_before)))
            self._read_before[snapshot.digest] = info
        return info

    def release(self, info: TaskInfo) -> None:
        """Drop the snapshot a `load` returned (removed with its parsed Task by the last release)."""
        if self.snapshots.release(info.path):
            with self._lock:
                self._parsed.pop(info.path, None)

    def harbor_task(self, path: Path) -> Task:
        """Harbor's `Task` of a live snapshot (a `TaskInfo.path`), parsed on the first call for that
        snapshot; every trial of it shares the object (Harbor reads a Task, it never changes one)."""
        with self._lock:
            task = self._parsed.get(path)
        if task is None:
            task = SnapshotTask(path)
            with self._lock:
                task = self._parsed.setdefault(path, task)
        return task

    def _read(self, name: str, path: Path) -> TaskInfo:
        self._check_env(name, path)
        try:
            task = SnapshotTask(path)
        except (OSError, ValueError) as exc:
            raise TaskInvalid(_FIELD, f"task {name!r} is not a valid Harbor task: {exc}") from exc
        with self._lock:
            self._parsed.setdefault(path, task)
        environment = task.config.environment
        reservation = Reservation(
            cpus=float(environment.cpus) if environment.cpus is not None else self.default_reservation.cpus,
            memory_mb=environment.memory_mb
            if environment.memory_mb is not None
            else self.default_reservation.memory_mb,
        )
        agent_s = task.config.agent.timeout_sec
        floor = task.config.metadata.get("floor_reward")
        return TaskInfo(
            name=name,
            path=path,
            image_group=image_group(task),
            reservation=reservation,
            environment_setup_s=float(environment.build_timeout_sec),
            verifier_s=float(task.config.verifier.timeout_sec),
            agent_s=float(agent_s) if agent_s is not None and math.isfinite(agent_s) else None,
            floor_reward=_finite(floor),
        )


def _finite(value: object) -> float | None:
    """A task.toml number as a finite float, or None (absent, not a number, a bool, inf, nan)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)
