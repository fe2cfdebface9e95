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
trained on for a failed attempt that made model calls is not recoverable from them; Miles itself
zeroes the loss mask of a `remove_sample` sample and keeps it in the batch,
`train_data_conversion.py` `convert_samples_to_train_data`, and `loss_function` in
`miles/backends/training_utils/loss.py` divides every micro-batch by the step's rollout count).

`ARM_RULES` names each arm's rules by the `rules` setting of `rl360 demo` (`DemoConfig.rules`):
the reward post-process hook's dotted path and the trainer settings. `advantage_metrics` is the
advantage shift the A/B report draws: over a step's valid trained samples, the mean advantage the
arm's hook gave them minus the mean `valid_group_advantages` gives the same samples (their own
groups' valid baseline; 0 up to rounding, since each group's valid advantages are centred), so
rl360's arm reads 0 by construction and a positive value is how far a rule that scores failures 0
pushes every valid sample up. It does not run anything (`rl360_ext.local.ab.compare` does).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rl360_ext.outcomes.provenance import is_valid
from rl360_ext.rollout.rewards import (
    STD_EPSILON,
    STD_NORMALIZED_ESTIMATORS,
    reward_value,
    valid_group_advantages,
)

RL360_TRAINER: dict[str, Any] = {}  # TrainerConfig's defaults are rl360's hooks
UPSTREAM_TRAINER: dict[str, Any] = {"pg_loss_reducer_path": None, "tis_function_path": None}
RL360_RULES = "rl360"
UPSTREAM_RULES = "upstream"
RL360_REWARD_POST_PROCESS = "rl360_ext.rollout.rewards.valid_group_advantages"
UPSTREAM_REWARD_POST_PROCESS = "rl360_ext.local.demo.arms.upstream_advantages"
ADVANTAGE_SHIFT = "advantage/shift"
ADVANTAGE_VALID_MEAN = "advantage/valid_mean"
ADVANTAGE_REFERENCE_MEAN = "advantage/reference_valid_mean"
ADVANTAGE_VALID_SAMPLES = "advantage/valid_samples"

ADVANTAGE_KIND = "advantage"  # one per step: {"kind", "rollout_id", "metrics": {"advantage/...": x}}


@dataclass(frozen=True)
class ArmRules:
    """What one arm runs differently: its reward post-process hook and its trainer settings."""

    reward_post_process_path: str
    trainer: dict[str, Any] = field(default_factory=dict)  # TrainerConfig fields


ARM_RULES: dict[str, ArmRules] = {
    RL360_RULES: ArmRules(RL360_REWARD_POST_PROCESS, RL360_TRAINER),
    UPSTREAM_RULES: ArmRules(UPSTREAM_REWARD_POST_PROCESS, UPSTREAM_TRAINER),
}


def arm_rules(name: str) -> ArmRules:
    """The rules called `name`; a ValueError names the known ones."""
    if name not in ARM_RULES:
        raise ValueError(f"rules must be one of {', '.join(ARM_RULES)}, got {name!r}")
    return ARM_RULES[name]


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


def advantage_metrics(args: Any, samples: Sequence[Any], advantages: Sequence[float]) -> dict[str, float]:
    """The step's advantage shift (module docstring) and its parts; {} without a valid sample.

    `advantages` are what the arm's reward post-process hook returned for `samples` (the kept
    samples of one step, every group with its `group_index`)."""
    if len(advantages) != len(samples):
        raise ValueError(f"{len(samples)} samples but {len(advantages)} advantages")
    valid = [position for position, sample in enumerate(samples) if is_valid(sample)]
    if not valid:
        return {}
    _, reference = valid_group_advantages(args, samples)
    own = float(np.mean([advantages[p] for p in valid]))
    base = float(np.mean([reference[p] for p in valid]))
    return {
        ADVANTAGE_VALID_MEAN: own,
        ADVANTAGE_REFERENCE_MEAN: base,
        ADVANTAGE_SHIFT: own - base,
        ADVANTAGE_VALID_SAMPLES: float(len(valid)),
    }
