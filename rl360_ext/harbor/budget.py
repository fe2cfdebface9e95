"""One deadline: split the client's remaining deadline into per-phase budgets for a trial.

Owns the arithmetic that makes the agent's own timeout fire before the client's deadline:

    agent_timeout = deadline_s - queue_s - environment_setup_s - agent_setup_s - verifier_s - margin_s

where each subtracted term is also the timeout the phase runs under (the environment start, the
agent setup and the verifier are cut off at their budget), and margin_s covers Harbor's own
bookkeeping (log collection, teardown) and the response. A healthy run therefore answers before
the client gives up; when the agent's share falls below `min_agent_s` the attempt is refused with
`insufficient_budget` before any sandbox starts. It does not own timing the phases or running them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class BudgetPolicy:
    """Server-wide budget settings (seconds)."""

    environment_setup_s: float = 120.0
    agent_setup_s: float = 30.0
    max_verifier_s: float = 600.0
    margin_s: float = 15.0
    min_agent_s: float = 10.0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")


@dataclass(frozen=True)
class TrialBudget:
    """Per-phase budgets of one attempt; `agent_s` is None when the attempt cannot run."""

    deadline_s: float
    queue_s: float
    environment_setup_s: float
    agent_setup_s: float
    verifier_s: float
    margin_s: float
    agent_s: float | None

    @property
    def sufficient(self) -> bool:
        return self.agent_s is not None

    def as_dict(self) -> dict[str, float | None]:
        return asdict(self)


def fixed_cost_s(policy: BudgetPolicy, task_environment_setup_s: float, task_verifier_s: float) -> float:
    """Seconds every attempt of this task needs besides queueing and the agent."""
    return (
        min(policy.environment_setup_s, task_environment_setup_s)
        + policy.agent_setup_s
        + min(policy.max_verifier_s, task_verifier_s)
        + policy.margin_s
    )


def max_queue_s(
    policy: BudgetPolicy, deadline_s: float, task_environment_setup_s: float, task_verifier_s: float
) -> float:
    """How long an attempt may wait for admission before it can no longer get `min_agent_s`."""
    return deadline_s - fixed_cost_s(policy, task_environment_setup_s, task_verifier_s) - policy.min_agent_s


def plan(
    policy: BudgetPolicy,
    deadline_s: float,
    queue_s: float,
    task_environment_setup_s: float,
    task_verifier_s: float,
    task_agent_s: float | None,
) -> TrialBudget:
    """Budgets for an attempt that has waited `queue_s` of its `deadline_s`.

    `task_*` are the task's own limits from task.toml (environment build timeout, verifier
    timeout, agent timeout or None for unbounded); the budgets never exceed them. The floor
    applies to what the deadline leaves, not to a task that asks for a shorter agent timeout.
    """
    environment_setup_s = min(policy.environment_setup_s, task_environment_setup_s)
    verifier_s = min(policy.max_verifier_s, task_verifier_s)
    left = deadline_s - queue_s - environment_setup_s - policy.agent_setup_s - verifier_s - policy.margin_s
    agent_s = min(left, task_agent_s) if task_agent_s is not None else left
    return TrialBudget(
        deadline_s=deadline_s,
        queue_s=queue_s,
        environment_setup_s=environment_setup_s,
        agent_setup_s=policy.agent_setup_s,
        verifier_s=verifier_s,
        margin_s=policy.margin_s,
        agent_s=agent_s if left >= policy.min_agent_s else None,
    )
