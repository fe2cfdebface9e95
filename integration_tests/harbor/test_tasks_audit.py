"""`rl360 tasks audit` as a real command: its own Harbor /run server, bubblewrap sandboxes, every
control on the broken-task corpus (each task gets its verdict, the hostile ones included: a check
an exit 0 forges, a test script that puts an agent-writable directory first on its own PATH, git
history in a repository another user owns, a runner that skips a conftest.py naming the audit)
and on the healthy example tasks (the demo's quiz tasks, fix-mean, fizzbuzz, slow-sum: ok).

The `flaky` example's oracle is right with probability 1/2 in each run (a coin in its sandbox:
independent sandboxes share nothing a run could count with), so it is audited on its own with 16
oracle runs: it misses its verdict only when all 16 coins agree, with probability 2^-15.
`vacuous-after-a-while` pays for anything once the agent phase took 5 s: it is audited on its own
with the timed controls waiting 15% to 20% of its 60 s budget (9 to 12 s); the shared audit's
controls wait at most 2% of a budget (1.2 s for a quiz task), so that it stays fast."""

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
from rl360_ext.tasks.verdicts import Control
from rl360_ext.util.procs import rl360_argv

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXPECTED = {
    "broken-env": ["broken_env"],
    "broken-oracle": ["broken_oracle"],
    "flaky-verifier": ["flaky_verifier"],
    "hackable-conftest": ["hackable"],
    "hackable-conftest-name-aware": ["hackable"],
    "hackable-exit-code": ["hackable"],
    "hackable-path-first": ["hackable"],
    "hackable-path-shim": ["hackable"],
    "hackable-reward-file": ["hackable"],
    "insensitive": ["insensitive"],
    "leaky-git": ["leaky"],
    "leaky-git-foreign-owner": ["leaky"],
    "lint-invalid-config": ["lint"],
    "slow-oracle": ["slow_oracle"],
    "vacuous": ["vacuous"],
}
# The control that finds each hostile task (a new control, or an old one made general).
FOUND_BY = {
    "hackable-exit-code": Control.WORK_PRODUCT_HIJACK,
    "hackable-path-first": Control.CANARY_PATH_SHIMS,
    "leaky-git-foreign-owner": Control.PROBE_LEAKS,
    "hackable-conftest-name-aware": Control.CANARY_CONFTEST,
}
# Audited alone, with --oracle-runs 16 (flaky) or longer pauses (vacuous-after-a-while): see the
# module docstring.
EXPECTED_ALONE = {"flaky": ["flaky"], "vacuous-after-a-while": ["vacuous"]}
# The shared audit's timed controls wait 0 to 2% of a task's agent budget.
SHORT_PAUSES = ("--idle-share-min", "0", "--idle-share-max", "0.02")
# The example tasks besides the quiz: healthy ones (ok), and the fault matrix's pass-through task,
# which accepts any answer by design.
EXAMPLES = {"fix-mean": ["ok"], "fizzbuzz": ["ok"], "slow-sum": ["ok"], "matrix-any-answer": ["vacuous"]}
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
    for name in [*quiz_task_names(), *EXAMPLES]:
        shutil.copytree(tasks_root() / name, root / name, symlinks=True)
    out = tmp_path_factory.mktemp("audit-out")
    document, seconds = audit(root, out, *SHORT_PAUSES)
    return Audited(root, out, document, seconds)


def test_every_corpus_task_gets_its_verdict_and_every_quiz_task_is_ok(audited: Audited) -> None:
    verdicts = {entry["task"]: entry["verdicts"] for entry in audited.document["tasks"]}
    corpus = {p.name for p in health_tasks_root().iterdir()}
    assert set(EXPECTED) | set(EXPECTED_ALONE) == corpus  # a new example needs its line
    assert {t: verdicts[t] for t in EXPECTED} == EXPECTED
    healthy = [*quiz_task_names(), *HEALTHY_VARIANTS]
    assert {t: verdicts[t] for t in healthy} == {t: ["ok"] for t in healthy}
    assert {t: verdicts[t] for t in EXAMPLES} == EXAMPLES
    for entry in audited.document["tasks"]:
        assert not any(a["attempt_class"] == "valid" for a in entry["evidence"]["retried_infra"])


def test_each_hostile_task_is_found_by_its_control(audited: Audited) -> None:
    evidence = {entry["task"]: entry["evidence"] for entry in audited.document["tasks"]}
    for task, control in FOUND_BY.items():
        assert control in evidence[task]["found_by"], (task, evidence[task]["found_by"])
    # the fixed fix-mean: both stubs leave its check without its nonce, so the reward is the floor
    runs = evidence["fix-mean"][Control.WORK_PRODUCT_HIJACK]["runs"]
    assert [(r["attempt_class"], r["reward"]) for r in runs] == [("valid", 0.0)] * 2
    # the oracle's verifier graded within its budget in every healthy task (what attribution reads)
    assert all(evidence[t]["oracle"]["verifier"]["graded"] == 3 for t in [*quiz_task_names(), *EXAMPLES])


def test_the_outputs_hold_every_task_and_quarantine_exactly_the_broken_ones(audited: Audited) -> None:
    quarantine = json.loads((audited.out / "quarantine.json").read_text())["tasks"]
    broken = {**EXPECTED, **{task: v for task, v in EXAMPLES.items() if v != ["ok"]}}
    assert quarantine == {task: {"verdicts": verdicts, "undecided": []} for task, verdicts in broken.items()}
    lines = (audited.out / "task_health.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == audited.document["tasks"]
    page = (audited.out / "task_health.html").read_text()
    assert all(f"<td>{entry['task']}</td>" in page for entry in audited.document["tasks"])


def test_a_second_audit_is_served_from_the_cache_without_a_server(audited: Audited, tmp_path: Path) -> None:
    shutil.copytree(audited.out / "cache", tmp_path / "cache")
    again, again_s = audit(audited.root, tmp_path, *SHORT_PAUSES)
    assert all(entry["evidence"]["cached"] for entry in again["tasks"])
    assert [e["verdicts"] for e in again["tasks"]] == [e["verdicts"] for e in audited.document["tasks"]]
    assert again_s < audited.seconds


def test_the_flaky_oracle_is_flaky(tmp_path: Path) -> None:
    root = tmp_path / "tasks"
    shutil.copytree(health_tasks_root() / "flaky", root / "flaky", symlinks=True)
    document, _ = audit(root, tmp_path / "out", "--oracle-runs", "16", "--no-cache", *SHORT_PAUSES)
    verdicts = {entry["task"]: entry["verdicts"] for entry in document["tasks"]}
    assert verdicts == {"flaky": EXPECTED_ALONE["flaky"]}
    (entry,) = document["tasks"]
    assert 0 < entry["evidence"]["oracle"]["passed"] < entry["evidence"]["oracle"]["valid"] == 16


def test_a_verifier_that_pays_after_a_while_meets_a_nop_as_slow_as_a_policy(tmp_path: Path) -> None:
    """The nop control waits 9 to 12 s (15% to 20% of the 60 s budget) before it finishes: the
    verifier, which grades honestly when the agent phase was short, pays it (vacuous)."""
    root = tmp_path / "tasks"
    shutil.copytree(health_tasks_root() / "vacuous-after-a-while", root / "vacuous-after-a-while")
    pauses = ("--idle-share-min", "0.15", "--idle-share-max", "0.2")
    document, _ = audit(root, tmp_path / "out", "--no-cache", *pauses)
    (entry,) = document["tasks"]
    assert entry["verdicts"] == EXPECTED_ALONE["vacuous-after-a-while"]
    timed = [a for a in entry["evidence"]["nop"]["attempts"] if a["agent"] != "nop"]
    assert len(timed) == 2 and all(a["agent_s"] >= 9.0 and a["reward"] == 1.0 for a in timed)
