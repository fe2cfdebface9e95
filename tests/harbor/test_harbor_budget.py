"""One deadline: the phase budgets of an attempt never add up to more than the client's deadline."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.harbor.budget import BudgetPolicy, max_queue_s, plan

POLICY = BudgetPolicy(
    environment_setup_s=120, agent_setup_s=30, max_verifier_s=600, margin_s=15, min_agent_s=10
)


def test_the_agent_gets_what_the_other_phases_leave() -> None:
    budget = plan(
        POLICY,
        deadline_s=3600,
        queue_s=100,
        task_environment_setup_s=600,
        task_verifier_s=300,
        task_agent_s=None,
    )
    assert budget.environment_setup_s == 120  # the server's setup budget caps the task's build timeout
    assert budget.verifier_s == 300  # the task's own verifier timeout, below the server's cap
    assert budget.agent_s == 3600 - 100 - 120 - 30 - 300 - 15


def test_the_task_agent_timeout_wins_when_shorter() -> None:
    budget = plan(
        POLICY, deadline_s=3600, queue_s=0, task_environment_setup_s=60, task_verifier_s=60, task_agent_s=3
    )
    assert budget.agent_s == 3  # below the floor, but asked for by the task, not forced by the deadline


def test_below_the_floor_the_attempt_is_refused() -> None:
    budget = plan(
        POLICY, deadline_s=200, queue_s=40, task_environment_setup_s=60, task_verifier_s=60, task_agent_s=None
    )
    assert not budget.sufficient and budget.agent_s is None


def test_queueing_longer_than_max_queue_leaves_less_than_the_floor() -> None:
    waited = max_queue_s(POLICY, 1000, task_environment_setup_s=60, task_verifier_s=60)
    assert plan(POLICY, 1000, waited, 60, 60, None).agent_s == pytest.approx(POLICY.min_agent_s)
    assert plan(POLICY, 1000, waited + 0.01, 60, 60, None).agent_s is None


def test_negative_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="margin_s"):
        BudgetPolicy(margin_s=-1)


@settings(max_examples=200, deadline=None)
@given(
    deadline=st.floats(1, 10_000),
    queue=st.floats(0, 10_000),
    setup=st.floats(0, 2_000),
    verifier=st.floats(0, 2_000),
    agent=st.none() | st.floats(0.1, 10_000),
)
def test_budgets_never_exceed_the_deadline(
    deadline: float, queue: float, setup: float, verifier: float, agent: float | None
) -> None:
    budget = plan(POLICY, deadline, queue, setup, verifier, agent)
    if budget.agent_s is None:
        return
    spent = budget.queue_s + budget.environment_setup_s + budget.agent_setup_s + budget.agent_s
    assert spent + budget.verifier_s + budget.margin_s <= deadline + 1e-6
    assert budget.environment_setup_s <= setup and budget.verifier_s <= verifier
    if agent is not None:
        assert budget.agent_s <= agent
