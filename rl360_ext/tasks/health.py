"""The task audit's records: one task's health (`TaskHealth`: verdicts and the evidence behind
them), the files the audit writes (`task_health.jsonl`, `quarantine.json`) and reading them back
(`read_health`, `read_quarantine`, cached by the file's identity for callers per attempt). What
the verdicts are is decided in `rl360_ext.tasks.audit`."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from rl360_ext.tasks.verdicts import TaskVerdict

TASK_HEALTH_FILE = "task_health.jsonl"
QUARANTINE_FILE = "quarantine.json"


@dataclass
class TaskHealth:
    """The audit's result for one task: its verdicts and the evidence behind them."""

    task: str
    verdicts: list[TaskVerdict]
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def quarantined(self) -> bool:
        """Anything but a clean `ok`: a finding, or a control no valid attempt could decide."""
        return self.verdicts != [TaskVerdict.OK]

    def as_json(self) -> dict[str, Any]:
        return {"task": self.task, "verdicts": [str(v) for v in self.verdicts], "evidence": self.evidence}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TaskHealth:
        return cls(data["task"], [TaskVerdict(v) for v in data["verdicts"]], dict(data["evidence"]))


def read_health(path: Path) -> TaskHealth | None:
    try:
        return TaskHealth.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def document(results: Sequence[TaskHealth]) -> dict[str, Any]:
    """The `--json` document: `{"tasks": [{"task", "verdicts", "evidence"}, ...]}`."""
    return {"tasks": [r.as_json() for r in results]}


def write_outputs(results: Sequence[TaskHealth], out_dir: Path) -> tuple[Path, Path]:
    """task_health.jsonl (one task a line) and quarantine.json (every task not clean `ok`: its verdicts
    and undecided controls), in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    health_path, quarantine_path = out_dir / TASK_HEALTH_FILE, out_dir / QUARANTINE_FILE
    health_path.write_text("".join(json.dumps(r.as_json(), sort_keys=True) + "\n" for r in results))
    quarantine = {
        "tasks": {
            r.task: {"verdicts": [str(v) for v in r.verdicts], "undecided": r.evidence.get("undecided", [])}
            for r in results
            if r.quarantined
        }
    }
    quarantine_path.write_text(json.dumps(quarantine, indent=2, sort_keys=True) + "\n")
    return health_path, quarantine_path


def read_quarantine(path: Path) -> Mapping[str, tuple[str, ...]]:
    """The quarantined tasks of a quarantine.json (the audit's, or the training-time tracker's
    quarantine_live.json, same format): name -> its verdicts and undecided controls. Cached by the
    file's identity, size and mtime, so a caller per attempt pays a stat and a lookup, whatever the
    list's size. A file that is not one is a ValueError naming it."""
    stat = path.stat()
    return _read_quarantine(str(path), stat.st_ino, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _read_quarantine(path: str, inode: int, mtime_ns: int, size: int) -> Mapping[str, tuple[str, ...]]:
    try:
        tasks = json.loads(Path(path).read_text())["tasks"]
        return MappingProxyType(
            {
                str(name): (
                    *(str(v) for v in entry["verdicts"]),
                    *(f"undecided:{c}" for c in entry["undecided"]),
                )
                for name, entry in tasks.items()
            }
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(
            f"{path} is not a quarantine.json of rl360 (tasks audit or tracker): {exc!r}"
        ) from exc
