"""Rewards under rl360's rules: the `--custom-rm-path` and `--custom-reward-post-process-path` hooks.

Owns `verifier_reward(args, sample)`, the reward model for Miles' stock
`agentic_tool_call.generate` (it hands back the verifier's reward only for a valid attempt and
masks every other sample), `valid_group_advantages(args, samples) -> (raw_rewards, rewards)`,
which replaces Miles' GRPO reward normalization, and the small helpers every rollout hook uses to
read a sample's reward (`reward_value`) and to walk a Miles group (`flatten_group`). It does not
decide validity (the Harbor server's verdict, recorded by the agent function, is read through
`rl360_ext.outcomes.verdict` and `rl360_ext.outcomes.provenance`) and does not filter groups.

Rules:
- `verifier_reward` returns a reward only when the verdict the agent function recorded reads as
  valid (`reward_source == "verifier"`, a finite reward, no infra cause) and the session saw no
  5xx turn; otherwise it marks the sample with `mark_infra_sample` and returns None, never 0.
- Groups come from `Sample.group_index` (or explicit `prompt_group_sizes`). A sample without a
  group and no explicit sizes is an error: no whole-batch fallback, because a whole-batch
  baseline shifts every advantage (the field's +0.31).
- Baseline = mean reward over the group's valid samples; optional std normalization over the
  same samples (grpo/gspo with std normalization on, like Miles: `/(std + 1e-6)`, unbiased std).
- Infra samples get advantage 0 and raw reward NaN (unknown, never 0); a group with fewer than
  two valid samples contributes 0 to every member.
- Siblings of one compact rollout (same non-None `rollout_id`) count once, as Miles does.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rl360_ext.outcomes import verdict
from rl360_ext.outcomes.causes import Cause, infra_class
from rl360_ext.outcomes.infra import mark_infra_sample
from rl360_ext.outcomes.provenance import (
    ATTEMPT_CLASS,
    FLOOR,
    REWARD_SOURCE,
    UNCLASSIFIED,
    VALID,
    attempt_class,
    is_valid,
)
from rl360_ext.outcomes.verdict import worst_engine_failure
from rl360_ext.rollout.config import AgentConfig

GROUP_BASELINE_ESTIMATORS = ("grpo", "gspo", "reinforce_plus_plus_baseline")
STD_NORMALIZED_ESTIMATORS = ("grpo", "gspo")
STD_EPSILON = 1e-6


def flatten_group(group: Iterable[Any]) -> list[Any]:
    """The samples of a Miles group whose elements are samples or lists of samples."""
    flat: list[Any] = []
    for item in group:
        if isinstance(item, (list, tuple)):
            flat.extend(flatten_group(item))
        else:
            flat.append(item)
    return flat


def reward_value(sample: Any, reward_key: str | None = None) -> float:
    """The scalar reward of a valid sample (`reward[reward_key]` for dict rewards), as a float.

    Raises ValueError when the reward is missing or not a finite number: a valid attempt always
    carries a verifier reward, so anything else is a broken sample, not a 0.
    """
    reward = sample.get("reward") if isinstance(sample, Mapping) else getattr(sample, "reward", None)
    if isinstance(reward, Mapping):
        if reward_key is None:
            raise ValueError(f"sample {_where(sample)} has a dict reward; set --reward-key to pick one value")
        if reward_key not in reward:
            raise ValueError(f"sample {_where(sample)} reward has no key {reward_key!r}: {sorted(reward)}")
        reward = reward[reward_key]
    if isinstance(reward, bool) or not isinstance(reward, (int, float, np.integer, np.floating)):
        raise ValueError(f"valid sample {_where(sample)} has no numeric reward: {reward!r}")
    value = float(reward)
    if not math.isfinite(value):
        raise ValueError(f"valid sample {_where(sample)} has a non-finite reward: {value}")
    return value


def _where(sample: Any) -> str:
    get = sample.get if isinstance(sample, Mapping) else lambda key: getattr(sample, key, None)
    return f"(group_index={get('group_index')}, index={get('index')})"


def group_positions(
    samples: Sequence[Any], prompt_group_sizes: Sequence[int] | None = None
) -> list[list[int]]:
    """Row positions of each group: by explicit sizes (contiguous) or by `group_index`."""
    if prompt_group_sizes is not None:
        sizes = [int(size) for size in prompt_group_sizes]
        if any(size < 0 for size in sizes) or sum(sizes) != len(samples):
            raise ValueError(
                f"prompt_group_sizes must be non-negative and sum to the {len(samples)} samples, got {sizes}"
            )
        bounds = np.cumsum([0, *sizes]).tolist()
        return [list(range(start, end)) for start, end in itertools.pairwise(bounds) if end > start]
    groups: dict[Any, list[int]] = {}
    for position, sample in enumerate(samples):
        group_index = getattr(sample, "group_index", None)
        if group_index is None:
            raise ValueError(
                f"sample at position {position} {_where(sample)} has no group_index and no "
                "prompt_group_sizes were given; rl360 refuses to guess groups "
                "(a whole-batch baseline would shift every advantage)"
            )
        groups.setdefault(group_index, []).append(position)
    return list(groups.values())


def rollout_units(samples: Sequence[Any], positions: Sequence[int]) -> list[list[int]]:
    """Positions grouped by compact rollout: siblings sharing a non-None `rollout_id` form one unit."""
    units: dict[Any, list[int]] = {}
    for position in positions:
        rollout_id = getattr(samples[position], "rollout_id", None)
        units.setdefault(("row", position) if rollout_id is None else rollout_id, []).append(position)
    return list(units.values())


def _unit_reward(samples: Sequence[Any], unit: Sequence[int], reward_key: str | None) -> float | None:
    """The shared reward of a rollout unit, None when the unit is infra; siblings must agree."""
    classes = {attempt_class(samples[p]) for p in unit}
    if len(classes) > 1:
        raise ValueError(
            f"siblings of one rollout at positions {list(unit)} disagree on their class: {classes}"
        )
    if not is_valid(samples[unit[0]]):
        return None
    rewards = {reward_value(samples[p], reward_key) for p in unit}
    if len(rewards) > 1:
        raise ValueError(
            f"siblings of one rollout at positions {list(unit)} have different rewards {rewards}"
        )
    return rewards.pop()


def valid_group_advantages(
    args: Any, samples: Sequence[Any], *, prompt_group_sizes: Sequence[int] | None = None
) -> tuple[list[float], list[float]]:
    """Miles' `--custom-reward-post-process-path` hook: `(raw_rewards, rewards)` per sample.

    `raw_rewards[i]` is the verifier reward of a valid sample and NaN for an infra sample;
    `rewards[i]` is its advantage (0.0 for infra samples and for groups with < 2 valid rollouts).
    Reads `args.advantage_estimator`, `args.rewards_normalization`,
    `args.grpo_std_normalization` (False with `--disable-grpo-std-normalization`) and
    `args.reward_key`; missing attributes take Miles' defaults.
    """
    samples = list(samples)
    for position, sample in enumerate(samples):
        if isinstance(sample, (list, tuple)):
            raise TypeError(
                f"samples must be a flat list of samples; position {position} is a {type(sample).__name__}"
            )
    estimator = getattr(args, "advantage_estimator", "grpo")
    if estimator not in GROUP_BASELINE_ESTIMATORS:
        raise ValueError(
            f"valid_group_advantages computes group baselines for {GROUP_BASELINE_ESTIMATORS}; "
            f"advantage_estimator={estimator!r} does not use one; "
            "leave --custom-reward-post-process-path unset."
        )
    reward_key = getattr(args, "reward_key", None)
    raw_rewards = [reward_value(s, reward_key) if is_valid(s) else math.nan for s in samples]
    if not getattr(args, "rewards_normalization", True):
        return raw_rewards, [0.0 if math.isnan(r) else r for r in raw_rewards]
    advantages = [0.0] * len(samples)
    groups = group_positions(samples, prompt_group_sizes)

    normalize_std = estimator in STD_NORMALIZED_ESTIMATORS and getattr(args, "grpo_std_normalization", True)
    for positions in groups:
        valid_units = []
        for unit in rollout_units(samples, positions):
            reward = _unit_reward(samples, unit, reward_key)
            if reward is not None:
                valid_units.append((unit, reward))
        if len(valid_units) < 2:
            continue
        rewards = np.array([reward for _, reward in valid_units], dtype=np.float64)
        centered = rewards - rewards.mean()
        if normalize_std:
            std = rewards.std(ddof=1)
            if std > 0:
                centered = centered / (std + STD_EPSILON)
        for (unit, _), advantage in zip(valid_units, centered.tolist(), strict=True):
            for position in unit:
                advantages[position] = advantage
    return raw_rewards, advantages


# ---- the reward model for Miles' stock agentic_tool_call.generate -------------------------------------

NO_AGENT_RESULT = (
    "the sample carries no agent-function result: the agent function raised "
    "(Miles logged the exception and merged nothing)"
)


def classify_agent_metadata(metadata: Any, agent_timeout_policy: str = "score") -> tuple[str, str | None]:
    """(attempt class, detail) for the metadata Miles merged from rl360's agent function.

    No agent result at all -> "infra:aborted". Otherwise the verdict the agent function recorded
    is read (`rl360_ext.outcomes.verdict.attempt_class`), with what only the client side saw:
    the agent's own deadline and transport failures and the session's 5xx turns.
    """
    if not isinstance(metadata, Mapping) or (REWARD_SOURCE not in metadata and ATTEMPT_CLASS not in metadata):
        return infra_class(Cause.ABORTED), NO_AGENT_RESULT
    recorded = metadata.get(ATTEMPT_CLASS)
    cls = verdict.attempt_class(
        metadata,
        transport_error=metadata.get("transport_error"),
        client_deadline=bool(metadata.get("client_deadline")),
        gateway_status=worst_engine_failure(metadata),
        agent_timeout_policy=agent_timeout_policy,
    )
    unknown = isinstance(recorded, str) and recorded != cls and cls == UNCLASSIFIED
    return cls, f"unknown recorded class {recorded!r}" if unknown else None


def verifier_reward_value(result: Mapping[str, Any], reward_key: str | None) -> tuple[Any, str | None]:
    """Sample.reward of a valid attempt from the /run answer (or the metadata it became): (reward,
    None), the rewards dict with --reward-key, or (None, detail) when the wanted value is not there.
    The task's floor (a failure attributed to the policy, nothing graded) is the floor under any key."""
    if reward_key and result.get(REWARD_SOURCE) == FLOOR:
        return {reward_key: float(result["reward"])}, None
    if reward_key:
        rewards = result.get("rewards")
        if not isinstance(rewards, Mapping) or reward_key not in rewards:
            keys = sorted(rewards) if isinstance(rewards, Mapping) else rewards
            return None, f"--reward-key {reward_key!r} is not among the verifier's rewards {keys!r}"
        return dict(rewards), None
    reward = result["reward"]
    if isinstance(reward, Mapping):
        raise ValueError(
            f"the verifier's reward is a dict {sorted(reward)}; set --reward-key to pick one value"
        )
    return float(reward), None


def _verified_reward(args: Any, sample: Any) -> Any:
    policy = AgentConfig.from_args(args).agent_timeout_policy  # rl360's flag, or $RL360_AGENT_TIMEOUT_POLICY
    metadata = getattr(sample, "metadata", None)
    cls, detail = classify_agent_metadata(metadata, policy)
    if cls == VALID:
        reward, detail = verifier_reward_value(metadata, getattr(args, "reward_key", None))
        if detail is None:
            sample.metadata[ATTEMPT_CLASS] = VALID
            return reward
        cls = infra_class(Cause.REWARD_FILE_INVALID)
    mark_infra_sample(sample, cls, detail=detail, fallback_token_id=0)
    return None


async def verifier_reward(args: Any, sample: Any, **kwargs: Any) -> Any:
    """Miles' `--custom-rm-path` hook for the stock `agentic_tool_call.generate` with rl360's agent.

    Miles calls it as `await f(args, sample)` (or `await f(args, samples)` for a list, from
    `batched_async_rm`). Returns the verifier's reward (a float, or the rewards dict when
    `args.reward_key` is set) for a valid attempt, writing `metadata["attempt_class"] = "valid"`.
    Every other attempt is marked with `mark_infra_sample` (loss mask zeros, `remove_sample`,
    cause in metadata) and gets None, which Miles stores as `Sample.reward`: never 0.0.
    """
    if isinstance(sample, list):
        return [_verified_reward(args, one) for one in sample]
    return _verified_reward(args, sample)
