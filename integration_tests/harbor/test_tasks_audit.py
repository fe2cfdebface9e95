"""`rl360 tasks audit` as a real command: its own Harbor /run server, bubblewrap sandboxes, every
control on the broken-task corpus (each task gets its verdict) and on the demo's quiz tasks (ok).

The `flaky` example's oracle is right with probability 1/2 in each run (a coin in its sandbox:
independent sandboxes share nothing a run could count with), so it is audited on its own with 16
oracle runs: it misses its verdict only when all 16 coins agree, with probability 2^-15."""

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
    "flaky-verifier": ["flaky_verifier"],
    "hackable-conftest": ["hackable"],
    "hackable-path-shim": ["hackable"],
    "hackable-reward-file": ["hackable"],
    "insensitive": ["insensitive"],
    "leaky-git": ["leaky"],
    "lint-invalid-config": ["lint"],
    "slow-oracle": ["slow_oracle"],
    "vacuous": ["vacuous"],
}
# Audited alone, with --oracle-runs 16 (see the module docstring).
EXPECTED_ALONE = {"flaky": ["flaky"]}
# Healthy variants made from a corpus task for this test: the conftest runner's test root is
# /tests, which the sandbox replaces whole before grading (the conftest canary's conftest.py there,
# in HOME and in tmp never reaches the verifier).
HEALTHY_VARIANTS = {"conftest-in-tests-root": "hackable-conftest"}


def audit(root: Path, out: Path, *flags: str) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    argv = rl360_argv("tasks", "audit", str(root), "--out", str(out), "--json", *flags)
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
        if task.name not in EXPECTED_ALONE:
            shutil.copytree(task, root / task.name, symlinks=True)
    for name, source in HEALTHY_VARIANTS.items():
        shutil.copytree(health_tasks_root() / source, root / name, symlinks=True)
    test_sh = root / "conftest-in-tests-root" / "tests" / "test.sh"
    test_sh.write_text(test_sh.read_text().replace("run_tests.py /app", "run_tests.py /tests"))
    for name in quiz_task_names():
        shutil.copytree(tasks_root() / name, root / name, symlinks=True)
    out = tmp_path_factory.mktemp("audit-out")
    document, seconds = audit(root, out)
    return Audited(root, out, document, seconds)


def test_every_corpus_task_gets_its_verdict_and_every_quiz_task_is_ok(audited: Audited) -> None:
    verdicts = {entry["task"]: entry["verdicts"] for entry in audited.document["tasks"]}
    corpus = {p.name for p in health_tasks_root().iterdir()}
    assert set(EXPECTED) | set(EXPECTED_ALONE) == corpus  # a new example needs its line
    assert {t: verdicts[t] for t in EXPECTED} == EXPECTED
    healthy = [*quiz_task_names(), *HEALTHY_VARIANTS]
    assert {t: verdicts[t] for t in healthy} == {t: ["ok"] for t in healthy}
    for entry in audited.document["tasks"]:
        assert not any(a["attempt_class"] == "valid" for a in entry["evidence"]["retried_infra"])


def test_the_outputs_hold_every_task_and_quarantine_exactly_the_broken_ones(audited: Audited) -> None:
    quarantine = json.loads((audited.out / "quarantine.json").read_text())["tasks"]
    assert quarantine == {
        task: {"verdicts": verdicts, "undecided": []} for task, verdicts in EXPECTED.items()
    }
    lines = (audited.out / "task_health.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == audited.document["tasks"]
    page = (audited.out / "task_health.html").read_text()
    assert all(f"<td>{entry['task']}</td>" in page for entry in audited.document["tasks"])


def test_a_second_audit_is_served_from_the_cache_without_a_server(audited: Audited, tmp_path: Path) -> None:
    shutil.copytree(audited.out / "cache", tmp_path / "cache")
    again, again_s = audit(audited.root, tmp_path)
    assert all(entry["evidence"]["cached"] for entry in again["tasks"])
    assert [e["verdicts"] for e in again["tasks"]] == [e["verdicts"] for e in audited.document["tasks"]]
    assert again_s < audited.seconds


def test_the_flaky_oracle_is_flaky(tmp_path: Path) -> None:
    root = tmp_path / "tasks"
    for name in EXPECTED_ALONE:
        shutil.copytree(health_tasks_root() / name, root / name, symlinks=True)
    document, _ = audit(root, tmp_path / "out", "--oracle-runs", "16", "--no-cache")
    verdicts = {entry["task"]: entry["verdicts"] for entry in document["tasks"]}
    assert verdicts == EXPECTED_ALONE
    (entry,) = document["tasks"]
    assert 0 < entry["evidence"]["oracle"]["passed"] < entry["evidence"]["oracle"]["valid"] == 16
