"""Miles' train data, built from Miles-shaped samples the way Miles builds it.

Owns `train_data(samples, rewards, raw_rewards)`: the conversion Miles applies in
`miles/ray/rollout/train_data_conversion.py` (`convert_samples_to_train_data`, radixark/miles
31f1ca96) after the reward post-process hook: `tokens`, `response_lengths`, `rewards` (the
post-processed rewards, i.e. advantages), `raw_reward`, `loss_masks` (ones when a sample has none,
zeros when `remove_sample` is set, length checked against `response_length`),
`rollout_mask_sums` (per rollout; one sample per rollout here), `rollout_log_probs`,
`rollout_routed_experts`, `total_lengths`; and the GRPO returns Miles' `get_grpo_returns`
broadcasts (`miles/backends/training_utils/loss_hub/math_utils.py`: the sample's reward on every
response token, no KL since `kl_coef` is 0). Samples are duck-typed (`rl360_ext.rollout.sample`
or Miles' own `Sample`). It does not decide validity or compute advantages (the reward
post-process hook did).
"""

from __future__ import annotations

from collections.abc import Sequence
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
    rollout_mask_sums: list[float]
    sample_indices: list[int | None]

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

    def subset(self, positions: Sequence[int]) -> TrainData:
        def pick(values: list[Any] | None) -> list[Any] | None:
            return None if values is None else [values[i] for i in positions]

        return TrainData(
            tokens=[self.tokens[i] for i in positions],
            response_lengths=[self.response_lengths[i] for i in positions],
            total_lengths=[self.total_lengths[i] for i in positions],
            loss_masks=[self.loss_masks[i] for i in positions],
            rewards=[self.rewards[i] for i in positions],
            raw_rewards=[self.raw_rewards[i] for i in positions],
            rollout_log_probs=pick(self.rollout_log_probs),
            rollout_routed_experts=pick(self.rollout_routed_experts),
            rollout_mask_sums=[self.rollout_mask_sums[i] for i in positions],
            sample_indices=[self.sample_indices[i] for i in positions],
        )


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
    return TrainData(
        tokens=tokens,
        response_lengths=lengths,
        total_lengths=[len(t) for t in tokens],
        loss_masks=masks,
        rewards=[float(r) for r in rewards],
        raw_rewards=[float(r) for r in raw],
        rollout_log_probs=log_probs if have_log_probs else None,  # type: ignore[arg-type]
        rollout_routed_experts=routed if any(r is not None for r in routed) else None,
        rollout_mask_sums=[float(mask.sum()) for mask in masks],
        sample_indices=[_field(s, "index") for s in samples],
    )
