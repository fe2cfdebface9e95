"""Valid-reward dynamic filter: the `--dynamic-sampling-filter-path` hook.

Owns `check_valid_reward_nonzero_std(args, group, **kwargs)`: keep a group only if at least two
of its attempts are valid and their rewards differ. Infra attempts neither count as rewards nor
make a group "all equal". The result is Miles' own `DynamicFilterOutput(keep, reason)` when Miles
is importable (Miles wraps any other return type as `keep=<object>`, which is always truthy), else
an equivalent dataclass with the same fields. Every judged group is also recorded for the rollout
metrics hook (`rl360_ext.rollout.metrics.record_filter_decision`), which is how
reward/unfiltered_mean sees the groups this filter drops. Validity comes only from
`rl360_ext.outcomes.provenance`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rl360_ext.outcomes.provenance import is_valid
from rl360_ext.rollout.metrics import record_filter_decision
from rl360_ext.rollout.rewards import flatten_group, reward_value

INSUFFICIENT_VALID_REWARDS = "insufficient_valid_rewards"
ZERO_STD_VALID = "zero_std_valid"
STD_TOLERANCE = 1e-8  # Miles' check_reward_nonzero_std threshold

try:
    from miles.rollout.filter_hub.base_types import DynamicFilterOutput
except ImportError:

    @dataclass
    class DynamicFilterOutput:  # type: ignore[no-redef]
        """Same fields as Miles' `miles.rollout.filter_hub.base_types.DynamicFilterOutput`."""

        keep: bool
        reason: str | None = None


def check_valid_reward_nonzero_std(args: Any, group: Any, **kwargs: Any) -> DynamicFilterOutput:
    """Keep the group iff >= 2 attempts are valid and their rewards have nonzero std.

    `group` is Miles' group: a list of samples or of lists of samples. Reasons for a drop:
    "insufficient_valid_rewards" (fewer than two valid attempts) and "zero_std_valid"
    (every valid reward equal).
    """
    samples = flatten_group(group)
    reward_key = getattr(args, "reward_key", None)
    rewards = np.array([reward_value(s, reward_key) for s in samples if is_valid(s)], dtype=np.float64)
    if len(rewards) < 2:
        output = DynamicFilterOutput(keep=False, reason=INSUFFICIENT_VALID_REWARDS)
    elif rewards.std(ddof=1) > STD_TOLERANCE:
        output = DynamicFilterOutput(keep=True)
    else:
        output = DynamicFilterOutput(keep=False, reason=ZERO_STD_VALID)
    record_filter_decision(args, samples, output.keep, output.reason)
    return output
