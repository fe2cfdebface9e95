"""The task fixtures rl360 ships: one tree of Harbor tasks under `local/tasks/`.

Owns where the tasks live and which are which: the example coding tasks (fix-mean, fizzbuzz,
slow-sum), the fault tasks (fault-*), the demo's quiz tasks (quiz-NN) and the fault matrix's
pass-through task (matrix-any-answer), and the task audit's corpus of broken tasks
(`health/`, one per verdict of `rl360 tasks audit`). The Harbor server serves any tasks root; this is the one
the demo, the fault matrix, the benches and `rl360 harbor serve`'s default point it at.
"""

from __future__ import annotations

from pathlib import Path


def tasks_root() -> Path:
    """The directory of rl360's task fixtures (package data)."""
    return Path(__file__).resolve().parent / "tasks"


def health_tasks_root() -> Path:
    """The task audit's corpus of broken tasks: each task's `[metadata] health` names its verdict."""
    return tasks_root() / "health"


def quiz_task_names(root: Path | None = None) -> list[str]:
    """The demo's quiz tasks under `root` (default: rl360's fixtures), sorted."""
    root = root or tasks_root()
    return sorted(
        p.name for p in root.iterdir() if p.name.startswith("quiz-") and (p / "task.toml").is_file()
    )
