"""Truncated importance sampling with valid-only mismatch metrics: `--custom-tis-function-path`.

Owns `valid_token_tis(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, **kw)
-> (pg_loss, loss_masks, metrics)`, called by Miles' `policy_loss_function` with keyword
arguments (also `total_lengths`, `response_lengths`, `parallel_state`, `max_seq_lens`).
It keeps Miles' vanilla TIS: ratio = exp(train - rollout) per token, weights clamped to
[args.tis_clip_low, args.tis_clip] multiplied into pg_loss when `args.use_tis` (with only
`--get-mismatch-metrics` the loss is left alone), loss masks returned unchanged.

What it changes is the metrics. Miles reduces each per-token metric to a per-sample mean and
divides the sum by the number of samples in the step, masked samples included, so a burst of
infra samples drags "tis" toward 0 and hides a train/rollout mismatch. Here masked tokens are
neutralized (ratio 1, |Δ log p| 0, never inf * 0 = NaN) and every metric is scaled by (samples /
samples with an unmasked token) of the micro-batch, so after Miles' reduction "tis", "tis_abs",
"tis_clipfrac" and "logprob_abs_diff" (|train - rollout| log-prob) are means over valid samples'
unmasked tokens (exact for a single micro-batch; see rl360_ext.train.reducers for the
multi-micro-batch caveat). No torch import: the array namespace is taken from the inputs.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np


class _Numpy:
    cat = staticmethod(np.concatenate)
    where = staticmethod(np.where)
    exp = staticmethod(np.exp)
    clip = staticmethod(np.clip)

    @staticmethod
    def detach(x: Any) -> Any:
        return x


class _Torch:
    def __init__(self, torch: Any) -> None:
        self._torch = torch

    def cat(self, xs: Sequence[Any]) -> Any:
        return self._torch.cat(list(xs), dim=0)

    def where(self, condition: Any, x: Any, y: Any) -> Any:
        return self._torch.where(condition, x, y)

    def exp(self, x: Any) -> Any:
        return self._torch.exp(x)

    def clip(self, x: Any, low: float, high: float) -> Any:
        return self._torch.clamp(x, min=low, max=high)

    @staticmethod
    def detach(x: Any) -> Any:
        return x.detach().clone()


def _namespace(x: Any) -> Any:
    if type(x).__module__.split(".")[0] == "torch":
        return _Torch(sys.modules["torch"])
    return _Numpy()


def _local_masks(
    args: Any, loss_masks: Sequence[Any], n_tokens: int, kwargs: dict[str, Any]
) -> Sequence[Any]:
    """Masks aligned with the local (context-parallel) log-prob tokens."""
    if sum(len(mask) for mask in loss_masks) == n_tokens:
        return loss_masks
    try:
        from miles.backends.training_utils.cp_utils import get_local_response_loss_masks
    except ImportError as error:
        raise ValueError(
            f"loss masks cover {sum(len(m) for m in loss_masks)} tokens but log probs {n_tokens}; "
            "context-parallel slicing needs Miles"
        ) from error
    return get_local_response_loss_masks(
        kwargs["total_lengths"],
        kwargs["response_lengths"],
        loss_masks,
        getattr(args, "qkv_format", "thd"),
        kwargs.get("max_seq_lens"),
    )


def valid_token_tis(
    args: Any,
    *,
    pg_loss: Any,
    train_log_probs: Sequence[Any],
    rollout_log_probs: Sequence[Any],
    loss_masks: Sequence[Any],
    **kwargs: Any,
) -> tuple[Any, Sequence[Any], dict[str, Any]]:
    """Miles' vanilla TIS with metrics averaged over valid samples' unmasked tokens."""
    if not train_log_probs:
        return pg_loss, loss_masks, {}
    xp = _namespace(pg_loss)
    train = xp.cat(train_log_probs)
    rollout = xp.cat(rollout_log_probs)
    if len(train) != len(rollout) or len(train) != len(pg_loss):
        raise ValueError(
            f"pg_loss ({len(pg_loss)}), train ({len(train)}) and rollout ({len(rollout)}) log probs "
            "differ in length"
        )
    active = xp.cat(_local_masks(args, loss_masks, len(train), kwargs)) > 0
    log_ratio = xp.where(active, train - rollout, train * 0)
    ratio = xp.exp(log_ratio)
    weights = xp.clip(ratio, args.tis_clip_low, args.tis_clip)
    if getattr(args, "use_tis", False):
        pg_loss = pg_loss * weights
    valid = sum((mask.sum() > 0) * 1 for mask in loss_masks)
    scale = len(loss_masks) / valid.clip(min=1)
    metrics = {
        "tis": ratio * scale,
        "tis_clipfrac": (weights != ratio) * scale,
        "tis_abs": abs(ratio - 1) * scale,
        "logprob_abs_diff": abs(log_ratio) * scale,
    }
    return pg_loss, loss_masks, {key: xp.detach(value) for key, value in metrics.items()}
