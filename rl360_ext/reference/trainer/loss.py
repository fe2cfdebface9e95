"""Miles' policy loss on numpy: PPO-clip, TIS, the pg-loss reducer and the micro-batch scaling.

Owns the loss of one micro-batch and its gradient with respect to each response token's
log-prob, in the order Miles' `policy_loss_function` computes it
(`miles/backends/training_utils/loss_hub/losses.py`, radixark/miles 31f1ca96):
`ppo_kl = old - new` and advantages zeroed outside the loss mask; `compute_policy_loss`
(`loss_hub/math_utils.py`: ratio = exp(-ppo_kl), max of the unclipped and the
[1 - eps_clip, 1 + eps_clip_high]-clipped surrogate, clipfrac where the clipped one is larger);
the TIS function called with Miles' keyword contract (`--custom-tis-function-path`, default
`vanilla_tis`, the numpy mirror of `loss_hub/corrections.py:vanilla_tis_function`); the pg-loss
reducer built with Miles' contract `f(total_lengths, response_lengths, loss_masks,
calculate_per_token_loss)` (`--custom-pg-loss-reducer-function-path`, default
`sum_of_sample_mean`, the mirror of `cp_utils.get_sum_of_sample_mean` with
`rollout_mask_sums` as denominators); and `loss_function`'s scaling
(`miles/backends/training_utils/loss.py`): the micro-batch loss divided by the step's sample
count (masked samples included), or, with per-token loss, by the token count.

The gradient: TIS weights are detached (computed from the trainer's pre-update log-probs), and a
reducer is linear in its input; its coefficients are read per sample (one indicator each) and
checked on a seeded random vector, then, when that disagrees, per token (one unit vector each)
and checked again; with the checks at zero and on the real input a reducer that is not linear is
refused with a ValueError, and a linear one is never differentiated with the wrong weights. It
does not run the model (`backward.py`) or own the step (`trainer.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

Reducer = Callable[[np.ndarray], Any]
ReducerFactory = Callable[..., Reducer]
TisFunction = Callable[..., tuple[Any, Sequence[Any], dict[str, Any]]]
LOG_RATIO_LIMIT = 20.0  # Miles' _safe_clamp_log_ratio bound on the log-ratio before exp


def sum_of_sample_mean(
    total_lengths: Sequence[int],
    response_lengths: Sequence[int],
    loss_masks: Sequence[np.ndarray],
    calculate_per_token_loss: bool = False,
    *,
    denominators: Sequence[float] | None = None,
) -> Reducer:
    """Miles' default reducer (cp_size 1): per-sample masked mean (sum per token with per-token loss)."""
    dens = [float(m.sum()) for m in loss_masks] if denominators is None else [float(d) for d in denominators]

    def reduce(x: np.ndarray) -> Any:
        total = 0.0
        start = 0
        for length, mask, den in zip(response_lengths, loss_masks, dens, strict=True):
            piece = (x[start : start + length] * mask).sum()
            total = total + (piece if calculate_per_token_loss else piece / max(den, 1.0))
            start += length
        return total

    return reduce


def vanilla_tis(
    args: Any,
    *,
    pg_loss: np.ndarray,
    train_log_probs: Sequence[np.ndarray],
    rollout_log_probs: Sequence[np.ndarray],
    loss_masks: Sequence[np.ndarray],
    **kwargs: Any,
) -> tuple[np.ndarray, Sequence[np.ndarray], dict[str, np.ndarray]]:
    """Miles' `vanilla_tis_function`: weights clamp(exp(train - rollout)) multiplied into pg_loss."""
    tis = np.exp(np.concatenate(train_log_probs) - np.concatenate(rollout_log_probs))
    weights = np.clip(tis, args.tis_clip_low, args.tis_clip)
    metrics = {"tis": tis, "tis_clipfrac": (weights != tis).astype(np.float64), "tis_abs": np.abs(tis - 1)}
    return pg_loss * weights, loss_masks, metrics


def compute_policy_loss(
    ppo_kl: np.ndarray,
    advantages: np.ndarray,
    eps_clip: float,
    eps_clip_high: float,
    eps_clip_c: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pg_loss, clipfrac, d pg_loss / d new log-prob) per token, as Miles' `compute_policy_loss`
    (`loss_hub/math_utils.py`): the clipped surrogate, then with `eps_clip_c` (> 1, `--eps-clip-c`)
    dual-clip PPO: where the advantage is negative the loss is at most `-eps_clip_c * A`, a
    constant (no gradient) once the ratio passes `eps_clip_c`. clipfrac counts the first clip only,
    as Miles does."""
    if eps_clip_c is not None and not eps_clip_c > 1.0:
        raise ValueError(f"eps_clip_c (dual-clip PPO's lower bound) must be > 1.0, got {eps_clip_c}")
    ratio = np.exp(np.clip(-ppo_kl, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    unclipped = -ratio * advantages
    clipped = -np.clip(ratio, 1 - eps_clip, 1 + eps_clip_high) * advantages
    is_clipped = clipped > unclipped
    pg_loss = np.maximum(unclipped, clipped)
    inside = np.abs(-ppo_kl) < LOG_RATIO_LIMIT
    grad = np.where(is_clipped | ~inside, 0.0, -ratio * advantages)
    if eps_clip_c is not None:
        bound = -eps_clip_c * advantages
        dual = (advantages < 0) & (bound < pg_loss)
        pg_loss = np.where(dual, bound, pg_loss)
        grad = np.where(dual, 0.0, grad)
    return pg_loss, is_clipped.astype(np.float64), grad


def reducer_coefficients(
    reducer: Reducer, response_lengths: Sequence[int], masks: Sequence[np.ndarray], seed: int = 0
) -> np.ndarray:
    """Per-token coefficients c with reducer(y) == sum(c * y) for every y, or a ValueError.

    A reducer the trainer can differentiate is linear in its input. First the per-sample reading
    (Miles' reducers are per-sample weighted masked sums): sample i's weight is its value on the
    indicator of sample i over its mask count, on every loss-masked-in token. That reading is
    checked on a seeded random vector (both signs on every position): a linear reducer whose true
    coefficients differ anywhere (one that weights tokens by position, say) disagrees there with
    probability 1. Then the coefficients are read one token at a time (its unit vector) and
    checked again, so any linear reducer gets its exact gradient; a reducer that still disagrees,
    or is not 0 at zero, is not linear and raises. The caller checks the value on the real input."""
    total = int(sum(response_lengths))
    if len(masks) != len(response_lengths):
        raise ValueError(f"{len(response_lengths)} response_lengths but {len(masks)} loss masks")
    probe = np.zeros(total)
    origin = float(reducer(probe))
    if not np.isclose(origin, 0.0, rtol=0, atol=1e-12):
        raise ValueError(f"the pg-loss reducer is not linear: its value at zero is {origin}, not 0")
    random = np.random.default_rng(seed).standard_normal(total)
    coefficients = np.zeros(total)
    start = 0
    for length, mask in zip(response_lengths, masks, strict=True):
        end = start + length
        count = float(mask.sum())
        if count > 0:
            probe[start:end] = 1.0
            coefficients[start:end] = float(reducer(probe)) / count * mask
            probe[start:end] = 0.0
        start = end
    if _agrees(reducer, coefficients, random):
        return coefficients
    for j in range(total):
        probe[j] = 1.0
        coefficients[j] = float(reducer(probe))
        probe[j] = 0.0
    check_linear(reducer, coefficients, random, "a random probe")
    return coefficients


def _agrees(reducer: Reducer, coefficients: np.ndarray, values: np.ndarray) -> bool:
    value, expected = float(reducer(values)), float((coefficients * values).sum())
    # relative to the reducer's own magnitude (no absolute floor: a reducer whose coefficients are
    # 1e-9 apart must not pass as uniform because they are small)
    scale = max(float(np.abs(coefficients * values).sum()), abs(value))
    return abs(value - expected) <= 1e-9 * scale


def check_linear(reducer: Reducer, coefficients: np.ndarray, values: np.ndarray, what: str) -> float:
    """reducer(values), checked against sum(coefficients * values) (ValueError when they differ)."""
    if not _agrees(reducer, coefficients, values):
        raise ValueError(
            f"the pg-loss reducer is not linear in its input (on {what}: value {float(reducer(values))}, "
            f"coefficient sum {float((coefficients * values).sum())}); the reference trainer cannot "
            "differentiate it"
        )
    return float(reducer(values))


@dataclass
class MicroBatchResult:
    """One micro-batch's scaled loss, the gradient per sample's response log-probs, and its facts."""

    loss: float
    dlogprobs: list[np.ndarray]
    pg_clipfrac: list[float]  # per sample: fraction of loss-masked-in tokens clipped (nan if none)
    tis_clipfrac: list[float]  # per sample, same denominators
    tis_metrics: dict[str, float]  # the TIS function's metrics reduced as Miles reduces them
    coefficient_sums: list[float]  # per sample: sum of its tokens' gradient scale (loss_scale probe)


def micro_batch_loss(
    *,
    args: Any,
    new_log_probs: Sequence[np.ndarray],
    old_log_probs: Sequence[np.ndarray],
    trainer_scored_log_probs: Sequence[np.ndarray],
    rollout_log_probs: Sequence[np.ndarray] | None,
    advantages: Sequence[np.ndarray],
    loss_masks: Sequence[np.ndarray],
    response_lengths: Sequence[int],
    total_lengths: Sequence[int],
    denominators: Sequence[float],
    normalizer: float,
    tis_function: TisFunction | None,
    reducer_factory: ReducerFactory | None,
) -> MicroBatchResult:
    """Miles' `policy_loss_function` then `loss_function`'s scaling by `normalizer`.

    `normalizer` is the step's sample count (or token count with per-token loss): what
    `loss_function` divides by. The mask-weighted masks the TIS function returns feed the
    reducer, as Miles passes `modified_response_masks`.
    """
    per_token = bool(getattr(args, "calculate_per_token_loss", False))
    masks = [np.asarray(m, dtype=np.float64) for m in loss_masks]
    active = np.concatenate(masks) > 0 if masks else np.zeros(0, bool)
    new = np.concatenate(new_log_probs)
    ppo_kl = np.where(active, np.concatenate(old_log_probs) - new, 0.0)
    adv = np.where(active, np.concatenate(advantages), 0.0)
    pg_loss, clipfrac, dpg = compute_policy_loss(
        ppo_kl, adv, args.eps_clip, args.eps_clip_high, getattr(args, "eps_clip_c", None)
    )
    tis_weights = np.ones_like(pg_loss)
    tis_reduced: dict[str, float] = {}
    pg_masks: Sequence[np.ndarray] = masks
    use_tis = bool(getattr(args, "use_tis", False))
    if use_tis and rollout_log_probs is None:
        raise ValueError("use_tis needs rollout_log_probs on every sample")
    if use_tis:
        tis = tis_function or vanilla_tis
        kwargs = {
            "train_log_probs": list(trainer_scored_log_probs),
            "rollout_log_probs": list(rollout_log_probs or []),
            "loss_masks": masks,
            "total_lengths": list(total_lengths),
            "response_lengths": list(response_lengths),
            "parallel_state": None,
            "max_seq_lens": None,
        }
        weighted, pg_masks, metrics = tis(args, pg_loss=np.ones_like(pg_loss), **kwargs)
        tis_weights = np.asarray(weighted, dtype=np.float64)
        pg_masks = [np.asarray(m, dtype=np.float64) for m in pg_masks]
        metric_reducer = sum_of_sample_mean(
            total_lengths, response_lengths, masks, per_token, denominators=denominators
        )
        tis_reduced = {
            key: float(metric_reducer(np.asarray(value))) / normalizer for key, value in metrics.items()
        }
    weighted_loss = pg_loss * tis_weights
    if reducer_factory is None:
        reducer = sum_of_sample_mean(
            total_lengths, response_lengths, pg_masks, per_token, denominators=denominators
        )
    else:
        reducer = reducer_factory(list(total_lengths), list(response_lengths), list(pg_masks), per_token)
    coefficients = reducer_coefficients(reducer, response_lengths, pg_masks)
    value = check_linear(reducer, coefficients, weighted_loss, "the step's pg loss")
    grad = coefficients * tis_weights * dpg / normalizer
    pieces, clip_rates, tis_rates, sums = [], [], [], []
    tis_clipped = (
        (tis_weights != _unclipped_tis(trainer_scored_log_probs, rollout_log_probs)) if use_tis else None
    )
    start = 0
    for length, mask in zip(response_lengths, masks, strict=True):
        end = start + length
        pieces.append(grad[start:end])
        count = mask.sum()
        clip_rates.append(float((clipfrac[start:end] * mask).sum() / count) if count else float("nan"))
        rate = (
            float((tis_clipped[start:end] * mask).sum() / count)
            if tis_clipped is not None and count
            else float("nan")
        )
        tis_rates.append(rate)
        sums.append(float(coefficients[start:end].sum()) / normalizer)
        start = end
    return MicroBatchResult(value / normalizer, pieces, clip_rates, tis_rates, tis_reduced, sums)


def _unclipped_tis(trainer_scored: Sequence[np.ndarray], rollout: Sequence[np.ndarray] | None) -> np.ndarray:
    return np.exp(np.concatenate(trainer_scored) - np.concatenate(rollout or []))
