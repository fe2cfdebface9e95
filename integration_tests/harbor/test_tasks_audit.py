"""`rl360 tasks audit` as a real command: its own Harbor /run server, bubblewrap sandboxes, every
control on the broken-task corpus (each task gets its verdict) and on the demo's quiz tasks (ok)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rl360_ext.local.fixtures import health_tasks_root, quiz_task_names, tasks_root
from rl360_ext.util.procs import rl360_argv

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXPECTED = {
    "broken-env": ["broken_env"],
    "broken-oracle": ["broken_oracle"],
    "hackable-path-shim": ["hackable"],
    "hackable-reward-file": ["hackable"],
    "leaky-git": ["leaky"],
    "lint-invalid-config": ["lint"],
    "slow-oracle": ["slow_oracle"],
    "vacuous": ["vacuous"],
}


def audit(root: Path, out: Path) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    argv = rl360_argv("tasks", "audit", str(root), "--out", str(out), "--json")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), time.monotonic() - started


@dataclass(frozen=True)
class Audited:
    root: Path
    out: Path
    document: dict[str, Any]
    seconds: float


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Audited:
    """One audit over the corpus and the quiz tasks together (copied into one tasks root)."""
    root = tmp_path_factory.mktemp("tasks")
    for task in health_tasks_root().iterdir():
        shutil.copytree(task, root / task.name, symlinks=True)
    for name in quiz_task_names():
        shutil.copytree(tasks_root() / name, root / name, symlinks=True)
    out = tmp_path_factory.mktemp("audit-out")
    document, seconds = audit(root, out)
    return Audited(root, out, document, seconds)


def test_every_corpus_task_gets_its_verdict_and_every_quiz_task_is_ok(audited: Audited) -> None:
    verdicts = {entry["task"]: entry["verdicts"] for entry in audited.document["tasks"]}
    assert set(EXPECTED) == {p.name for p in health_tasks_root().iterdir()}  # a new example needs its line
    assert {t: verdicts[t] for t in EXPECTED} == EXPECTED
    assert {t: verdicts[t] for t in quiz_task_names()} == {t: ["ok"] for t in quiz_task_names()}
    for entry in audited.document["tasks"]:
        assert not any(a["attempt_class"] == "valid" for a in entry["evidence"]["retried_infra"])


def test_the_outputs_hold_every_task_and_quarantine_exactly_the_broken_ones(audited: Audited) -> None:
    quarantine = json.loads((audited.out / "quarantine.json").read_text())["tasks"]
    assert quarantine == {
        task: {"verdicts": verdicts, "undecided": []} for task, verdicts in EXPECTED.items()
    }
    lines = (audited.out / "task_health.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == audited.document["tasks"]


def test_a_second_audit_is_served_from_the_cache_without_a_server(audited: Audited, tmp_path: Path) -> None:
    shutil.copytree(audited.out / "cache", tmp_path / "cache")
    again, again_s = audit(audited.root, tmp_path)
    assert all(entry["evidence"]["cached"] for entry in again["tasks"])
    assert [e["verdicts"] for e in again["tasks"]] == [e["verdicts"] for e in audited.document["tasks"]]
    assert again_s < audited.seconds
