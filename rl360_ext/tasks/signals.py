"""Task health during training, from the policy's own attempts: the per-step `tasks/*` metrics.

Owns reading a step's groups (each the attempts at one task, before the dynamic-sampling filter
drops any) for what the filter would hide and what marks a vacuous verifier:
- `tasks/always_pass_groups`, `tasks/always_fail_groups`: groups whose valid attempts (at least
  two) all got the maximum, or all the floor; the filter drops both as zero-variance, so a task
  the policy can never fail or never pass disappears from the metrics unless counted here;
- `tasks/vacuous_signature_attempts`: valid attempts whose reward is above the floor although the
  attempt ended in an exception (a policy failure Harbor still graded, e.g. the agent crashed):
  marin #7784's signature of a verifier that passes whatever it is given; `vacuous_signature_tasks`
  names those tasks (sorted, at most `MAX_NAMED`) for the step record, since metrics stay numbers.
Which attempts are valid is `attempt_class` as recorded (`rl360_ext.outcomes`), never decided here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rl360_ext.outcomes.provenance import VALID

MAX_NAMED = 20
_TOLERANCE = 1e-9


def task_signals(
    groups: Sequence[Sequence[Mapping[str, Any]]], max_reward: float = 1.0, floor_reward: float = 0.0
) -> dict[str, int]:
    """The step's `tasks/*` metrics from its groups of attempt summaries (`attempt_class`,
    `reward`, `exception_type`)."""
    always_pass = always_fail = 0
    for group in groups:
        rewards = [
            a["reward"] for a in group if a.get("attempt_class") == VALID and a.get("reward") is not None
        ]
        if len(rewards) >= 2:
            always_pass += all(r >= max_reward - _TOLERANCE for r in rewards)
            always_fail += all(r <= floor_reward + _TOLERANCE for r in rewards)
    return {
        "tasks/groups": len(groups),
        "tasks/always_pass_groups": always_pass,
        "tasks/always_fail_groups": always_fail,
        "tasks/vacuous_signature_attempts": len(_vacuous(groups, floor_reward)),
    }


def vacuous_signature_tasks(
    groups: Sequence[Sequence[Mapping[str, Any]]], floor_reward: float = 0.0
) -> list[str]:
    """The tasks (`task` field) with the vacuous-verifier signature, sorted, at most `MAX_NAMED`."""
    named = {str(a["task"]) for a in _vacuous(groups, floor_reward) if a.get("task") is not None}
    return sorted(named)[:MAX_NAMED]


def _vacuous(groups: Sequence[Sequence[Mapping[str, Any]]], floor_reward: float) -> list[Mapping[str, Any]]:
    """Valid attempts above the floor that ended in an exception."""
    return [
        a
        for group in groups
        for a in group
        if a.get("attempt_class") == VALID
        and a.get("exception_type")
        and a.get("reward") is not None
        and a["reward"] > floor_reward + _TOLERANCE
    ]
