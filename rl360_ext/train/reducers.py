"""Policy-loss reducers whose normalizer ignores masked samples: `--custom-pg-loss-reducer-function-path`.

Owns `valid_sample_mean` and `constant_normalizer` (Dr. GRPO), both
`f(total_lengths, response_lengths, loss_masks, calculate_per_token_loss) -> Callable[[x], scalar]`
as Miles' `policy_loss_function` calls them once per micro-batch (cp_size == 1; `x` is the
concatenated per-token pg_loss of the micro-batch). Written only with operations torch tensors and
numpy arrays share (slicing, `*`, `.sum()`, `.clip(min=...)`, comparison), so Miles passes torch
tensors and the tests pass numpy arrays; this module never imports torch. It does not compute
losses, advantages or TIS weights.

What Miles does with the result: it divides the micro-batch value by the step's sample (rollout)
count, masked samples included, or, with `calculate_per_token_loss`, by the token count where a
fully masked sample still counts one token. A masked sample therefore shrinks every gradient
(23 masked of 56 -> x0.59). These reducers multiply by (micro-batch samples / micro-batch samples
with at least one unmasked token) (per-token: clamped token count / unmasked token count), so
after Miles' division a micro-batch contributes the mean over its valid samples. With the whole
step in one micro-batch this is exact and adding or removing masked samples changes nothing;
with several micro-batches each contributes its own valid mean weighted by its share of samples
(a micro-batch with no valid sample contributes 0). The reducer sees only its micro-batch, so
this is the closest a reducer can get; the exact step-wide fix is an upstream change that
normalizes by the step's valid count.

The Dr. GRPO constant: `configure(constant=...)`, else $RL360_PG_LOSS_CONSTANT, else
`rl360_pg_loss_constant` on Megatron's global args when Miles has set them
(`add_arguments` registers `--rl360-pg-loss-constant`).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

PG_LOSS_CONSTANT_ENV = "RL360_PG_LOSS_CONSTANT"

_configured_constant: float | None = None

Reducer = Callable[[Any], Any]


def configure(*, constant: float | None) -> None:
    """Set (or clear with None) the Dr. GRPO constant for this process."""
    global _configured_constant
    _configured_constant = (
        None if constant is None else _checked_constant(constant, "configure(constant=...)")
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rl360-pg-loss-constant",
        type=float,
        default=None,
        help="Dr. GRPO constant for rl360_ext.train.reducers.constant_normalizer (e.g. max response length).",
    )


def _checked_constant(value: Any, source: str) -> float:
    try:
        constant = float(value)
    except (TypeError, ValueError) as error:
        raise ValueError(f"Dr. GRPO constant from {source} is not a number: {value!r}") from error
    if not math.isfinite(constant) or constant <= 0:
        raise ValueError(f"Dr. GRPO constant from {source} must be a positive finite number, got {constant}")
    return constant


def pg_loss_constant() -> float:
    """The configured Dr. GRPO constant; a ValueError says where to set it when there is none."""
    if _configured_constant is not None:
        return _configured_constant
    if (value := os.environ.get(PG_LOSS_CONSTANT_ENV)) is not None:
        return _checked_constant(value, f"${PG_LOSS_CONSTANT_ENV}")
    global_vars = sys.modules.get("megatron.training.global_vars")
    if global_vars is not None:
        try:
            value = getattr(global_vars.get_args(), "rl360_pg_loss_constant", None)
        except AssertionError:  # Megatron asserts when args were never set
            value = None
        if value is not None:
            return _checked_constant(value, "--rl360-pg-loss-constant")
    raise ValueError(
        "constant_normalizer needs a constant: set --rl360-pg-loss-constant, "
        f"${PG_LOSS_CONSTANT_ENV}, or call rl360_ext.train.reducers.configure(constant=...)"
    )


def _split(x: Any, response_lengths: Sequence[int]) -> list[Any]:
    total = sum(response_lengths)
    if len(x) != total:
        raise ValueError(
            f"pg_loss has {len(x)} tokens but response_lengths sum to {total}; rl360 reducers support "
            "context parallelism size 1 only"
        )
    pieces, start = [], 0
    for length in response_lengths:
        pieces.append(x[start : start + length])
        start += length
    return pieces


def _check_inputs(response_lengths: Sequence[int], loss_masks: Sequence[Any]) -> None:
    if len(response_lengths) != len(loss_masks):
        raise ValueError(f"{len(response_lengths)} response_lengths but {len(loss_masks)} loss_masks")
    for i, (length, mask) in enumerate(zip(response_lengths, loss_masks, strict=True)):
        if len(mask) != length:
            raise ValueError(f"loss_masks[{i}] has {len(mask)} entries, response_lengths[{i}] is {length}")


def _valid_sample_scale(loss_masks: Sequence[Any]) -> Any:
    """samples / samples with at least one unmasked token (1 when none is valid)."""
    valid = sum((mask.sum() > 0) * 1 for mask in loss_masks)
    return len(loss_masks) / valid.clip(min=1)


def _sample_reducer(
    response_lengths: Sequence[int], loss_masks: Sequence[Any], denominators: Sequence[Any]
) -> Reducer:
    scale = _valid_sample_scale(loss_masks)

    def reduce(x: Any) -> Any:
        total: Any = 0
        for x_i, mask, denominator in zip(_split(x, response_lengths), loss_masks, denominators, strict=True):
            total = total + (x_i * mask).sum() / denominator
        return total * scale

    return reduce


def _token_reducer(response_lengths: Sequence[int], loss_masks: Sequence[Any]) -> Reducer:
    clamped_tokens = sum(mask.sum().clip(min=1) for mask in loss_masks)
    unmasked_tokens = sum(mask.sum() for mask in loss_masks).clip(min=1)
    scale = clamped_tokens / unmasked_tokens

    def reduce(x: Any) -> Any:
        total: Any = 0
        for x_i, mask in zip(_split(x, response_lengths), loss_masks, strict=True):
            total = total + (x_i * mask).sum()
        return total * scale

    return reduce


def _empty_reducer(x: Any) -> Any:
    return x.sum() * 0


def valid_sample_mean(
    total_lengths: Sequence[int],
    response_lengths: Sequence[int],
    loss_masks: Sequence[Any],
    calculate_per_token_loss: bool = False,
) -> Reducer:
    """Per-sample token mean, averaged over samples with at least one unmasked token.

    `total_lengths` is unused (Miles passes it; it matters only for context parallelism).
    """
    _check_inputs(response_lengths, loss_masks)
    if not loss_masks:
        return _empty_reducer
    if calculate_per_token_loss:
        return _token_reducer(response_lengths, loss_masks)
    return _sample_reducer(response_lengths, loss_masks, [mask.sum().clip(min=1) for mask in loss_masks])


def constant_normalizer(
    total_lengths: Sequence[int],
    response_lengths: Sequence[int],
    loss_masks: Sequence[Any],
    calculate_per_token_loss: bool = False,
) -> Reducer:
    """Dr. GRPO: each sample's masked token sum divided by a constant, averaged over valid samples."""
    if calculate_per_token_loss:
        raise ValueError(
            "constant_normalizer needs calculate_per_token_loss=False: with per-token loss Megatron "
            "divides by the token count, so a constant normalizer cannot apply"
        )
    _check_inputs(response_lengths, loss_masks)
    constant = pg_loss_constant()
    if not loss_masks:
        return _empty_reducer
    return _sample_reducer(response_lengths, loss_masks, [constant] * len(loss_masks))
