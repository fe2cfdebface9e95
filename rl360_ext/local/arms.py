"""The two arms of a fault A/B: rl360's hooks, and upstream Miles' defaults implemented from Miles' code.

Owns what the "upstream" arm does differently, as pure functions over the same samples:

- failures scored 0: upstream's Harbor example returns `reward` 0.0 on a timeout or an error
  (DESIGN.md, Miles extension contract), so an infrastructure failure enters the reward
  normalization as a 0 instead of being left out;
- the baseline Miles' default reward post-process computes
  (`miles/ray/rollout/train_data_conversion.py`, radixark/miles 31f1ca96:
  `_reward_group_segments` then `_normalize_rewards_by_rollout`): groups by `group_index` when
  every sample has one, else contiguous groups of `n_samples_per_prompt` when the batch is full,
  else **one whole-batch group**; per group, rewards minus their mean, divided by (unbiased std +
  1e-6) for grpo/gspo with std normalization when the group has more than one rollout and a
  nonzero std; siblings of one rollout share its reward;
- masked samples counted in the loss denominator: the trainer with Miles' default reducer and
  vanilla TIS (`UPSTREAM_TRAINER`).

`RL360_TRAINER` is rl360's side (`valid_sample_mean`, `valid_token_tis`); rl360's reward side is
`rl360_ext.rollout.rewards.valid_group_advantages`. The samples an upstream arm trains on are the
same samples (masked infra samples keep their zero loss masks: what an upstream run would have
trained on for a failed attempt that made model calls is not recoverable from them). It does not
run anything (the demo driver would).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from rl360_ext.outcomes.provenance import is_valid
from rl360_ext.rollout.rewards import STD_EPSILON, STD_NORMALIZED_ESTIMATORS, reward_value

RL360_TRAINER: dict[str, Any] = {}  # TrainerConfig's defaults are rl360's hooks
UPSTREAM_TRAINER: dict[str, Any] = {"pg_loss_reducer_path": None, "tis_function_path": None}


def upstream_raw_rewards(args: Any, samples: Sequence[Any]) -> list[float]:
    """The reward upstream's Harbor example hands Miles: the verifier's for a valid attempt, else 0.0."""
    reward_key = getattr(args, "reward_key", None)
    return [reward_value(s, reward_key) if is_valid(s) else 0.0 for s in samples]


def upstream_groups(args: Any, samples: Sequence[Any]) -> list[list[int]]:
    """Miles' `_reward_group_segments` without explicit prompt group sizes."""
    indices = [getattr(s, "group_index", None) for s in samples]
    if all(i is not None for i in indices):
        groups: dict[int, list[int]] = {}
        for position, index in enumerate(indices):
            groups.setdefault(int(index), []).append(position)  # type: ignore[arg-type]
        return list(groups.values())
    size = int(getattr(args, "n_samples_per_prompt", 1))
    if len(samples) == size * int(getattr(args, "rollout_batch_size", 0)):
        return [list(range(start, start + size)) for start in range(0, len(samples), size)]
    return [list(range(len(samples)))]


def upstream_advantages(args: Any, samples: Sequence[Any]) -> tuple[list[float], list[float]]:
    """Miles' default `(raw_rewards, rewards)` with failures scored 0 (`_normalize_rewards_by_rollout`)."""
    raw = upstream_raw_rewards(args, samples)
    if not getattr(args, "rewards_normalization", True):
        return raw, list(raw)
    normalize_std = getattr(args, "advantage_estimator", "grpo") in STD_NORMALIZED_ESTIMATORS and getattr(
        args, "grpo_std_normalization", True
    )
    rewards = [0.0] * len(samples)
    for positions in upstream_groups(args, samples):
        units: dict[Any, list[int]] = {}
        for position in positions:
            sample = samples[position]
            rollout_id = getattr(sample, "rollout_id", None)
            index = getattr(sample, "index", None)
            key = rollout_id if rollout_id is not None else index if index is not None else ("row", position)
            units.setdefault(key, []).append(position)
        shared = np.array([raw[unit[0]] for unit in units.values()], dtype=np.float64)
        centered = shared - shared.mean()
        if normalize_std and len(shared) > 1:
            std = float(shared.std(ddof=1))
            if std > 0 and math.isfinite(std):
                centered = centered / (std + STD_EPSILON)
        for unit, value in zip(units.values(), centered.tolist(), strict=True):
            for position in unit:
                rewards[position] = value
    return raw, rewards
