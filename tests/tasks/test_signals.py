"""The in-training task signals: groups the filter would hide, the vacuous-verifier signature."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from rl360_ext.tasks.signals import task_signals, vacuous_signature_tasks


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
