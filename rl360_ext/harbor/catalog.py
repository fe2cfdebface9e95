"""Tasks a /run server may run: resolve a request's task name under --tasks-root and read its limits.

Owns the rule that a task is a directory below the tasks root (a relative name; absolute paths,
`..` and symlinks leading out of the root are rejected), and what rl360 reads from a Harbor task
before admission: its image group (for pinning), its resource reservation and the time limits
the deadline budget must respect. Harbor's own `Task` class parses and validates task.toml.
It does not own running the task.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from harbor.environments.definition import environment_content_hash
from harbor.models.task.task import Task

from rl360_ext.harbor.admission import Reservation


class TaskNotFound(LookupError):
    """No task directory with a task.toml under the tasks root has this name."""


class TaskPathRejected(ValueError):
    """The task name leaves the tasks root."""


class TaskInvalid(ValueError):
    """The task directory exists but Harbor cannot load it."""


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
        relative = PurePosixPath(name)
        if not name or relative.is_absolute() or ".." in relative.parts or "\\" in name:
            raise TaskPathRejected(f"task must be a relative path inside the tasks root, got {name!r}")
        path = (self.root / relative).resolve()
        if path != self.root and self.root not in path.parents:
            raise TaskPathRejected(f"task {name!r} resolves outside the tasks root")
        if not (path / "task.toml").is_file():
            raise TaskNotFound(f"no task {name!r} under the tasks root")
        return path

    def load(self, name: str) -> TaskInfo:
        path = self.resolve(name)
        mtime = (path / "task.toml").stat().st_mtime
        cached = self._cache.get(path)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        try:
            task = Task(path)
        except (OSError, ValueError) as exc:
            raise TaskInvalid(f"task {name!r} is not a valid Harbor task: {exc}") from exc
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
