"""Tasks a /run server may run: resolve a request's task name under --tasks-root and read its limits.

Owns the rule that a task is a directory below the tasks root (a relative name of at most
`MAX_TASK_NAME` characters without control characters; absolute paths, `..` and symlinks
leading out of the root are rejected), that nothing inside a task leaves it (a symlink whose
target is outside the task directory, or a FIFO/device/socket, makes the task invalid, naming
the path, every time it loads), and what rl360 reads from a Harbor task
before admission: its image group (for pinning), its resource reservation and the time limits
the deadline budget must respect. Harbor's own `Task` class parses and validates task.toml.
It does not own running the task.
"""

from __future__ import annotations

import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from harbor.environments.definition import environment_content_hash
from harbor.models.task.task import Task

from rl360_ext.harbor.admission import Reservation
from rl360_ext.harbor.errors import TaskInvalid, TaskNotFound, TaskPathRejected

__all__ = ["MAX_TASK_NAME", "TaskCatalog", "TaskInfo", "TaskInvalid", "TaskNotFound", "TaskPathRejected"]

MAX_TASK_NAME = 255
_FIELD = "task"


@dataclass(frozen=True)
class TaskInfo:
    name: str
    path: Path
    image_group: str
    reservation: Reservation
    environment_setup_s: float
    verifier_s: float
    agent_s: float | None


def image_group(task: Task) -> str:
    """[metadata] image_group, else the task's docker_image, else a hash of its environment/ dir."""
    declared = task.config.metadata.get("image_group")
    if isinstance(declared, str) and declared:
        return declared
    if task.config.environment.docker_image:
        return task.config.environment.docker_image
    return "env-" + environment_content_hash(task.paths.environment_dir, truncate=12)


class TaskCatalog:
    def __init__(self, root: Path, default_reservation: Reservation) -> None:
        self.root = root.resolve()
        if not self.root.is_dir():
            raise FileNotFoundError(f"tasks root {root} is not a directory")
        self.default_reservation = default_reservation
        self._cache: dict[Path, tuple[float, TaskInfo]] = {}

    def resolve(self, name: str) -> Path:
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
        try:
            path = (self.root / relative).resolve()
            if path != self.root and self.root not in path.parents:
                raise TaskPathRejected(_FIELD, f"task {name!r} resolves outside the tasks root")
            found = (path / "task.toml").is_file()
        except OSError as exc:
            raise TaskPathRejected(_FIELD, f"task {name!r} is not a usable path: {exc.strerror}") from exc
        if not found:
            raise TaskNotFound(_FIELD, f"no task {name!r} under the tasks root")
        return path

    @staticmethod
    def check_contained(name: str, path: Path) -> None:
        """Raise TaskInvalid, naming the path, for a link whose target leaves the task directory
        or a file that is neither regular, a directory nor a link."""
        for directory, dirnames, filenames in os.walk(path):
            for entry in (*dirnames, *filenames):
                full = Path(directory) / entry
                relative = full.relative_to(path).as_posix()
                mode = os.lstat(full).st_mode
                if stat.S_ISLNK(mode):
                    target = full.resolve()
                    if target != path and path not in target.parents:
                        raise TaskInvalid(
                            _FIELD, f"task {name!r}: {relative} is a link that leaves the task directory"
                        )
                elif not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    raise TaskInvalid(_FIELD, f"task {name!r}: {relative} is not a regular file or directory")

    def load(self, name: str) -> TaskInfo:
        path = self.resolve(name)
        self.check_contained(name, path)
        mtime = (path / "task.toml").stat().st_mtime
        cached = self._cache.get(path)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        try:
            task = Task(path)
        except (OSError, ValueError) as exc:
            raise TaskInvalid(_FIELD, f"task {name!r} is not a valid Harbor task: {exc}") from exc
        environment = task.config.environment
        reservation = Reservation(
            cpus=float(environment.cpus) if environment.cpus is not None else self.default_reservation.cpus,
            memory_mb=environment.memory_mb
            if environment.memory_mb is not None
            else self.default_reservation.memory_mb,
        )
        agent_s = task.config.agent.timeout_sec
        info = TaskInfo(
            name=name,
            path=path,
            image_group=image_group(task),
            reservation=reservation,
            environment_setup_s=float(environment.build_timeout_sec),
            verifier_s=float(task.config.verifier.timeout_sec),
            agent_s=float(agent_s) if agent_s is not None and math.isfinite(agent_s) else None,
        )
        self._cache[path] = (mtime, info)
        return info
