"""Known-good controls (issue 34): the audit's evidence by digest, one control regrade per task
digest shared by the attempts that ask, a wait bounded by the attempt's deadline."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from rl360_ext.harbor.admission import Reservation
from rl360_ext.harbor.catalog import TaskInfo
from rl360_ext.harbor.controls import KnownGoodControls, known_good_of, read_task_health
from rl360_ext.outcomes.attribution import AttributionRule, Control, LimitHit, Phase, Resource
from rl360_ext.outcomes.known_good import KnownGood
from rl360_ext.outcomes.verdict import TrialFacts
from rl360_ext.util.tree_digest import task_digest

HEALTHY = KnownGood(True, Control.REGRADE, "graded")


def task(tmp_path: Path, digest: str = "snap-1") -> TaskInfo:
    (tmp_path / "task.toml").write_text("x = 1\n")
    return TaskInfo("t", tmp_path, "g", Reservation(1.0, 256), 10.0, 5.0, 5.0, digest=digest)


def audit_line(digest: str, **verifier: object) -> str:
    return json.dumps(
        {"task": "t", "verdicts": ["ok"], "evidence": {"digest": digest, "oracle": {"verifier": verifier}}}
    )


def test_the_audits_task_health_is_read_by_digest(tmp_path: Path) -> None:
    path = tmp_path / "task_health.jsonl"
    path.write_text(audit_line("a", graded=3, failed=0) + "\n\n" + audit_line("b", graded=0, failed=2) + "\n")
    evidence = read_task_health(path)
    assert (evidence["a"].healthy, evidence["b"].healthy) == (True, False)
    assert evidence["a"].control == Control.AUDIT
    path.write_text('{"task": "t"}\n')
    with pytest.raises(ValueError, match=r"task_health.jsonl:1: not a task audit record"):
        read_task_health(path)
    with pytest.raises(ValueError, match="cannot be read"):
        read_task_health(tmp_path / "missing.jsonl")


async def test_one_regrade_per_digest_answers_every_attempt_that_asks(tmp_path: Path) -> None:
    controls = KnownGoodControls(AttributionRule.REGRADE, {}, max_running=2)
    release = asyncio.Event()
    runs = 0

    async def control() -> KnownGood:
        nonlocal runs
        runs += 1
        await release.wait()
        return HEALTHY

    info = task(tmp_path)
    waiting = [asyncio.create_task(controls.known_good(info, control, 30)) for _ in range(5)]
    await asyncio.sleep(0)
    release.set()
    assert await asyncio.gather(*waiting) == [HEALTHY] * 5
    assert await controls.known_good(info, control, 30) == HEALTHY
    assert runs == 1 and controls.counts["regrade_started"] == 1 and controls.counts["regrade_cached"] == 5


async def test_an_attempt_waits_no_longer_than_its_deadline_and_the_control_goes_on(tmp_path: Path) -> None:
    controls = KnownGoodControls(AttributionRule.REGRADE, {}, max_running=1)
    release = asyncio.Event()

    async def control() -> KnownGood:
        await release.wait()
        return HEALTHY

    info = task(tmp_path)
    early = await controls.known_good(info, control, 0.01)
    assert (early.healthy, early.control) == (None, Control.NONE) and "deadline" in early.detail
    release.set()
    assert await controls.known_good(info, control, 30) == HEALTHY  # the same control, finished


async def test_a_control_that_cannot_run_is_no_evidence_and_is_tried_again(tmp_path: Path) -> None:
    controls = KnownGoodControls(AttributionRule.REGRADE, {}, max_running=1)
    calls = 0

    async def control() -> KnownGood:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("no sandbox")
        return HEALTHY

    info = task(tmp_path)
    failed = await controls.known_good(info, control, 30)
    assert failed.healthy is None and "could not run" in failed.detail
    assert await controls.known_good(info, control, 30) == HEALTHY and calls == 2


async def test_the_evidence_rule_takes_the_audits_answer_and_regrade_ignores_it(tmp_path: Path) -> None:
    info = task(tmp_path)
    audited = {task_digest(tmp_path): KnownGood(False, Control.AUDIT, "failed in the audit")}

    async def control() -> KnownGood:
        return HEALTHY

    by_evidence = KnownGoodControls(AttributionRule.EVIDENCE, audited, max_running=1)
    assert (await by_evidence.known_good(info, control, 30)).control == Control.AUDIT
    assert by_evidence.counts["audit"] == 1 and by_evidence.counts["regrade_started"] == 0
    always = KnownGoodControls(AttributionRule.REGRADE, audited, max_running=1)
    assert await always.known_good(info, control, 30) == HEALTHY


@pytest.mark.parametrize(
    ("facts", "healthy"),
    [
        (TrialFacts(rewards={"reward": 1.0}, verifier_started=True), True),
        (
            TrialFacts(
                exception_type="VerifierTimeoutError", exception_phase=Phase.VERIFIER, verifier_started=True
            ),
            False,
        ),
        (
            TrialFacts(
                rewards={"reward": 1.0},
                verifier_started=True,
                limit_hits=(LimitHit(Phase.VERIFIER, Resource.MEMORY),),
            ),
            False,
        ),
        (TrialFacts(exception_type="NonZeroAgentExitCodeError", exception_phase=Phase.AGENT), None),
        (TrialFacts(exception_type="SandboxBuildFailedError", exception_phase=Phase.ENVIRONMENT_SETUP), None),
    ],
)
def test_a_control_trial_reads_as_healthy_failing_or_no_evidence(
    facts: TrialFacts, healthy: bool | None
) -> None:
    answer = known_good_of(facts)
    assert (answer.healthy, answer.control) == (healthy, Control.REGRADE)
