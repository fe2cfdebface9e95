"""Miles' train data, built from Miles-shaped samples the way Miles builds it.

Owns `train_data(samples, rewards, raw_rewards)`: the conversion Miles applies in
`miles/ray/rollout/train_data_conversion.py` (`convert_samples_to_train_data`, radixark/miles
31f1ca96) after the reward post-process hook: `tokens`, `response_lengths`, `rewards` (the
post-processed rewards, i.e. advantages), `raw_reward`, `loss_masks` (ones when a sample has none,
zeros when `remove_sample` is set, length checked against `response_length`),
`rollout_ids` (a sample's `rollout_id`, else its `index`) and `rollout_mask_sums` (every sample
carries the loss-mask total of its whole rollout, `_compute_rollout_mask_sums`), `rollout_log_probs`,
`rollout_routed_experts`, `total_lengths`; the global batches of Miles' rollout-side schedule
(`global_batches`, `miles/utils/dp_schedule.py` `build_dp_schedule` at dp_size 1: whole rollouts
per step, `num_rollouts` the loss divides by); and the GRPO returns Miles' `get_grpo_returns`
broadcasts (`miles/backends/training_utils/loss_hub/math_utils.py`: the sample's reward on every
response token, no KL since `kl_coef` is 0). Samples are duck-typed (`rl360_ext.rollout.sample`
or Miles' own `Sample`). It does not decide validity or compute advantages (the reward
post-process hook did).
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class TrainData:
    """One step's train data, per sample (lists line up with the samples)."""

    tokens: list[np.ndarray]  # int64 [total_length]
    response_lengths: list[int]
    total_lengths: list[int]
    loss_masks: list[np.ndarray]  # float64 [response_length]
    rewards: list[float]  # post-processed (advantages)
    raw_rewards: list[float]
    rollout_log_probs: list[np.ndarray] | None  # float64 [response_length]
    rollout_routed_experts: list[np.ndarray | None] | None  # int32 [total_length - 1, layers, top_k]
    rollout_mask_sums: list[float]  # the loss-mask total of the sample's whole rollout
    sample_indices: list[int | None]
    rollout_ids: list[Hashable]  # Miles' rollout_ids: rollout_id, else index, else ("row", position)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def valid(self) -> list[bool]:
        """Samples with at least one loss-masked-in token (what every reducer counts as valid)."""
        return [bool(mask.sum() > 0) for mask in self.loss_masks]

    def advantages(self) -> list[np.ndarray]:
        """GRPO returns: each sample's reward on every response token (Miles' `get_grpo_returns`)."""
        return [
            np.full(length, reward, np.float64)
            for length, reward in zip(self.response_lengths, self.rewards, strict=True)
        ]


def _field(sample: Any, name: str) -> Any:
    return sample.get(name) if isinstance(sample, dict) else getattr(sample, name, None)


def train_data(
    samples: Sequence[Any], rewards: Sequence[float], raw_rewards: Sequence[float] | None = None
) -> TrainData:
    """Miles' `convert_samples_to_train_data` over `samples`, with the hook's `(raw_rewards, rewards)`."""
    if len(rewards) != len(samples):
        raise ValueError(f"{len(samples)} samples but {len(rewards)} rewards")
    raw = list(raw_rewards) if raw_rewards is not None else list(rewards)
    if len(raw) != len(samples):
        raise ValueError(f"{len(samples)} samples but {len(raw)} raw_rewards")
    tokens, lengths, masks, log_probs, routed = [], [], [], [], []
    for position, sample in enumerate(samples):
        ids = np.asarray(_field(sample, "tokens") or [], dtype=np.int64)
        length = int(_field(sample, "response_length") or 0)
        if not 0 <= length <= len(ids):
            raise ValueError(f"samples[{position}].response_length {length} is outside [0, {len(ids)}]")
        if length and length == len(ids):
            raise ValueError(f"samples[{position}] has no prompt token before its response")
        mask = _field(sample, "loss_mask")
        mask = np.ones(length) if mask is None else np.asarray(mask, dtype=np.float64)
        if len(mask) != length:
            raise ValueError(
                f"samples[{position}].loss_mask has {len(mask)} entries, response_length is {length}"
            )
        if _field(sample, "remove_sample"):
            mask = np.zeros(length)
        lp = _field(sample, "rollout_log_probs")
        if lp is not None and len(lp) != length:
            raise ValueError(
                f"samples[{position}].rollout_log_probs has {len(lp)} entries, response_length is {length}"
            )
        experts = _field(sample, "rollout_routed_experts")
        if experts is not None and len(ids) and len(experts) != len(ids) - 1:
            raise ValueError(
                f"samples[{position}].rollout_routed_experts has {len(experts)} rows, expected {len(ids) - 1}"
            )
        tokens.append(ids)
        lengths.append(length)
        masks.append(mask)
        log_probs.append(None if lp is None else np.asarray(lp, dtype=np.float64))
        routed.append(None if experts is None else np.asarray(experts, dtype=np.int32))
    have_log_probs = all(lp is not None for lp in log_probs) and bool(samples)
    rollout_ids = [_rollout_id(sample, position) for position, sample in enumerate(samples)]
    return TrainData(
        tokens=tokens,
        response_lengths=lengths,
        total_lengths=[len(t) for t in tokens],
        loss_masks=masks,
        rewards=[float(r) for r in rewards],
        raw_rewards=[float(r) for r in raw],
        rollout_log_probs=log_probs if have_log_probs else None,  # type: ignore[arg-type]
        rollout_routed_experts=routed if any(r is not None for r in routed) else None,
        rollout_mask_sums=rollout_mask_sums(rollout_ids, masks),
        sample_indices=[_field(s, "index") for s in samples],
        rollout_ids=rollout_ids,
    )


def _rollout_id(sample: Any, position: int) -> Hashable:
    """Miles' `s.rollout_id if s.rollout_id is not None else s.index`; a sample with neither is its
    own rollout (as Miles' `_normalize_rewards_by_rollout` keys it, `("row", position)`)."""
    for name in ("rollout_id", "index"):
        value = _field(sample, name)
        if value is not None:
            return value
    return ("row", position)


def rollout_mask_sums(rollout_ids: Sequence[Hashable], masks: Sequence[np.ndarray]) -> list[float]:
    """Miles' `_compute_rollout_mask_sums`: each sample carries the loss-mask total of all samples
    of its rollout, so the default reducer takes one token-weighted mean per rollout."""
    totals: dict[Hashable, float] = {}
    for rollout, mask in zip(rollout_ids, masks, strict=True):
        totals[rollout] = totals.get(rollout, 0.0) + float(mask.sum())
    return [totals[rollout] for rollout in rollout_ids]


@dataclass(frozen=True)
class GlobalBatch:
    """One optimizer step's samples and the rollout count Miles' `loss_function` divides by."""

    positions: list[int]
    num_rollouts: int


def global_batches(
    rollout_ids: Sequence[Hashable],
    steps_per_rollout: int = 1,
    global_batch_size: int | None = None,
    dynamic: bool = False,
) -> tuple[list[GlobalBatch], list[int]]:
    """(global batches, dropped sample positions) of one rollout, as Miles' `build_dp_schedule`
    plans them: siblings of one rollout id stay in one step; each step takes `global_batch_size`
    whole rollouts (the count the loss divides by, `num_rollouts`) and trailing rollouts that do
    not fill a step are dropped (no `--allow-partial-train-step`). `dynamic` is
    `--use-dynamic-global-batch-size` at dp_size 1 (`_compute_dynamic_global_batch_size`: one step
    over every rollout). With neither, the rollout's rollouts split into `steps_per_rollout`
    nearly equal steps (Miles derives `global_batch_size` from its fixed rollout size; a reference
    trainer step has none). ValueError when the rollout holds fewer rollouts than one step needs."""
    by_rollout: dict[Hashable, list[int]] = {}
    for position, rollout in enumerate(rollout_ids):
        by_rollout.setdefault(rollout, []).append(position)
    groups = list(by_rollout.values())
    if not groups:
        return [], []
    if dynamic:
        sizes = [len(groups)]
    elif global_batch_size is not None:
        if len(groups) < global_batch_size:
            raise ValueError(
                f"{len(groups)} rollouts in this step but global_batch_size is {global_batch_size} "
                "(Miles: need at least one full step)"
            )
        sizes = [global_batch_size] * (len(groups) // global_batch_size)
    else:
        parts = max(1, min(steps_per_rollout, len(groups)))
        bounds = np.linspace(0, len(groups), parts + 1).round().astype(int)
        sizes = [int(b - a) for a, b in itertools.pairwise(bounds)]
    batches, start = [], 0
    for size in sizes:
        picked = groups[start : start + size]
        batches.append(GlobalBatch(sorted(p for group in picked for p in group), size))
        start += size
    dropped = sorted(p for group in groups[start:] for p in group)
    return batches, dropped
