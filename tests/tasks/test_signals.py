"""The in-training task signals: groups the filter would hide, the vacuous-verifier signature, the
verifier's p95 against each task's timeout from the audit."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from rl360_ext.rollout.metrics import audited_verifier_timeouts, step_metrics
from rl360_ext.tasks.audit import verifier_timeout_s
from rl360_ext.tasks.health import TASK_HEALTH_FILE, TaskHealth, write_outputs
from rl360_ext.tasks.signals import (
    p95,
    task_signals,
    vacuous_signature_tasks,
    verifier_signals,
    verifier_timeouts,
)
from rl360_ext.tasks.verdicts import TaskVerdict


def attempt(
    reward: float | None, klass: str = "valid", exception: str | None = None, task: str = "t"
) -> dict:
    return {"attempt_class": klass, "reward": reward, "exception_type": exception, "task": task}


def test_zero_variance_groups_are_counted_as_always_pass_or_always_fail() -> None:
    groups = [
        [attempt(1.0), attempt(1.0), attempt(None, "infra:sandbox_lost")],
        [attempt(0.0), attempt(0.0)],
        [attempt(0.0), attempt(1.0)],
        [attempt(1.0)],  # one valid attempt says nothing about variance
        [attempt(0.5), attempt(0.5)],  # constant but neither maximum nor floor
    ]
    signals = task_signals(groups)
    assert (signals["tasks/always_pass_groups"], signals["tasks/always_fail_groups"]) == (1, 1)
    assert signals["tasks/groups"] == 5


def test_a_reward_next_to_an_exception_is_the_vacuous_signature() -> None:
    groups = [
        [attempt(1.0, exception="AgentNonzeroExitError", task="b"), attempt(0.0, exception="X", task="b")],
        [attempt(1.0, task="a"), attempt(0.3, exception="ContextLengthExceededError", task="a")],
        [attempt(None, "infra:verifier_crash", exception="VerifierCrash", task="c")],
    ]
    signals = task_signals(groups)
    assert signals["tasks/vacuous_signature_attempts"] == 2
    assert vacuous_signature_tasks(groups) == ["a", "b"]


attempts = st.builds(
    attempt,
    st.sampled_from([None, 0.0, 0.5, 1.0]),
    st.sampled_from(["valid", "infra:sandbox_lost"]),
    st.sampled_from([None, "AgentNonzeroExitError"]),
    st.sampled_from(["a", "b"]),
)


@given(st.lists(st.lists(attempts, max_size=5), max_size=6))
def test_signals_equal_a_brute_force_count(groups: list[list[dict[str, Any]]]) -> None:
    signals = task_signals(groups)
    valid = [
        [a["reward"] for a in g if a["attempt_class"] == "valid" and a["reward"] is not None] for g in groups
    ]
    assert signals["tasks/always_pass_groups"] == sum(len(r) > 1 and set(r) == {1.0} for r in valid)
    assert signals["tasks/always_fail_groups"] == sum(len(r) > 1 and set(r) == {0.0} for r in valid)
    marked = [
        a
        for g in groups
        for a in g
        if a["attempt_class"] == "valid" and a["exception_type"] and (a["reward"] or 0) > 0
    ]
    assert signals["tasks/vacuous_signature_attempts"] == len(marked)
    assert vacuous_signature_tasks(groups) == sorted({a["task"] for a in marked})


def timed(task: str, verifier_s: float | None, klass: str = "valid") -> dict[str, Any]:
    return {
        **attempt(1.0 if klass == "valid" else None, klass, task=task),
        "phase_timings": {"verifier": verifier_s},
    }


def test_the_verifier_p95_counts_every_attempt_whose_verifier_ran() -> None:
    assert p95([]) is None and p95([3.0]) == 3.0
    assert p95([float(i) for i in range(1, 101)]) == 95.0 and p95([1.0, 2.0, 10.0]) == 10.0
    attempts = [
        timed("a", 1.0),
        timed("a", 2.0),
        timed("b", 19.0, "infra:verifier_timeout"),
        timed("b", None),
    ]
    signals = verifier_signals(attempts, {})
    assert signals == {
        "tasks/verifier_p95_s": 19.0,  # the one cut off at its timeout counts
        "tasks/verifier_p95_timeout_frac": None,
        "tasks/verifier_near_timeout_tasks": None,
    }
    signals = verifier_signals(attempts, {"a": 20.0, "b": 20.0, "unseen": 1.0})
    assert signals["tasks/verifier_p95_timeout_frac"] == 19.0 / 20.0
    assert signals["tasks/verifier_near_timeout_tasks"] == 1
    assert verifier_signals([timed("a", 1.0)], {"b": 5.0})["tasks/verifier_near_timeout_tasks"] == 0


def test_timeouts_come_from_the_audit_s_task_health_next_to_the_quarantine(tmp_path: Path) -> None:
    health = [
        TaskHealth("a", [TaskVerdict.OK], {"verifier_timeout_s": 20.0, "undecided": []}),
        TaskHealth("b", [TaskVerdict.VACUOUS], {"verifier_timeout_s": 600.0, "undecided": []}),
        TaskHealth("old", [TaskVerdict.OK], {"undecided": []}),  # audited before the field existed
    ]
    _, quarantine = write_outputs(health, tmp_path)
    assert verifier_timeouts(tmp_path / TASK_HEALTH_FILE) == {"a": 20.0, "b": 600.0}
    assert verifier_timeouts(tmp_path / "missing.jsonl") == {}
    flags = SimpleNamespace(rl360_harbor_url="http://h", rl360_quarantine_file=str(quarantine))
    assert audited_verifier_timeouts(flags) == {"a": 20.0, "b": 600.0}
    assert audited_verifier_timeouts(SimpleNamespace(rl360_harbor_url="http://h")) == {}
    (tmp_path / TASK_HEALTH_FILE).write_text("not json\n")
    assert verifier_timeouts(tmp_path / TASK_HEALTH_FILE) == {}  # a warning, never a stopped step
    trained = [{**timed("a", 12.0), "group_index": 0, "render_mismatch": None, "domain": None}]
    metrics = step_metrics(trained, None, {"a": 20.0})
    assert (
        metrics["tasks/verifier_p95_timeout_frac"] == 0.6
        and metrics["tasks/verifier_near_timeout_tasks"] == 1
    )


def test_the_audit_records_each_task_s_verifier_timeout(tmp_path: Path) -> None:
    task = tmp_path / "t"
    (task / "tests").mkdir(parents=True)
    (task / "task.toml").write_text('schema_version = "1.4"\n[verifier]\ntimeout_sec = 20.0\n')
    assert verifier_timeout_s(task) == 20.0
    (task / "task.toml").write_text('schema_version = "1.4"\n')
    assert verifier_timeout_s(task) == 600.0  # Harbor's default
