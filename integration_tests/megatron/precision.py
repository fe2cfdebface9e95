"""Megatron's float32 islands, and a context that lifts them to float64 for the parity checks.

Owns the finding and the lift. With `params_dtype=torch.float64` Megatron-core (miles-main) still
computes two things in float32, whatever the model's dtype:

- rotary position embeddings: `RotaryEmbedding.inv_freq` is built float32 (its frequencies and
  cos/sin follow), and `rope_utils._apply_rotary_pos_emb_bshd` casts the rotated tensor with
  `.float()`;
- the router's gates: `moe_utils.topk_routing_with_score_function` takes
  `torch.softmax(..., dtype=torch.float32)` of the top-k logits.

Measured on the tiny engine's model these cost up to ~1e-6 in a token's log-prob (RoPE most of
it), so the 1e-9 forward and 1e-6 gradient checks run inside `float64_islands`, which rebuilds
the rotary frequencies in float64, rotates without the cast (the same formula: x cos + rotate_half(x)
sin, half-split) and takes the router softmax in the input's dtype; the stock gap is measured and
reported beside it. Each patched name is checked to exist first; everything is restored on exit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from integration_tests.megatron.cpu_shims import torch_with


def _rotate_exact(
    t: Any, freqs: Any, rotary_interleaved: bool = False, multi_latent_attention: bool = False,
    mscale: float = 1.0,
) -> Any:  # fmt: skip
    import torch

    if rotary_interleaved or multi_latent_attention:
        raise ValueError("float64_islands rotates the half-split layout only (the tiny engine's)")
    rot = freqs.shape[-1]
    x, rest = t[..., :rot], t[..., rot:]
    x1, x2 = torch.chunk(x, 2, dim=-1)
    rotated = x * (torch.cos(freqs) * mscale) + torch.cat((-x2, x1), dim=-1) * (torch.sin(freqs) * mscale)
    return torch.cat((rotated.to(t.dtype), rest), dim=-1)


def _softmax_in_input_dtype(torch_module: Any) -> Any:
    def softmax(x: Any, dim: int = -1, dtype: Any = None) -> Any:
        del dtype
        return torch_module.softmax(x, dim=dim)

    return softmax


@contextlib.contextmanager
def float64_islands(
    model: Any, rope_theta: float, *, rope: bool = True, router: bool = True
) -> Iterator[None]:
    """Inside: `model`'s RoPE (base `rope_theta`) and every router softmax in the model's dtype.

    `rope` / `router` False leave that island as Megatron has it (to measure each one's share).
    See the module docstring for what is lifted and why.
    """
    import torch
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(rope_utils, "_apply_rotary_pos_emb_bshd"):
        raise RuntimeError("rope_utils._apply_rotary_pos_emb_bshd is gone: the RoPE lift needs updating")
    routing = moe_utils.topk_routing_with_score_function
    if "softmax" not in routing.__code__.co_names:
        raise RuntimeError(
            "topk_routing_with_score_function no longer calls softmax: the lift needs updating"
        )
    rotary = model.rotary_pos_emb
    forward = type(rotary).forward
    if not hasattr(forward, "cache_clear") or not hasattr(rotary, "inv_freq"):
        raise RuntimeError(
            "RotaryEmbedding no longer caches forward / holds inv_freq: the lift needs updating"
        )
    dtype = next(model.parameters()).dtype
    dim = rotary.inv_freq.shape[0] * 2
    saved_inv_freq, saved_rotate, saved_torch = (
        rotary.inv_freq,
        rope_utils._apply_rotary_pos_emb_bshd,
        moe_utils.torch,
    )
    if rope:
        rotary.inv_freq = 1.0 / (rope_theta ** (torch.arange(0, dim, 2, dtype=dtype) / dim))
        rope_utils._apply_rotary_pos_emb_bshd = _rotate_exact
    if router:
        moe_utils.torch = torch_with(torch, softmax=_softmax_in_input_dtype(torch))
    forward.cache_clear()
    try:
        yield
    finally:
        rotary.inv_freq = saved_inv_freq
        rope_utils._apply_rotary_pos_emb_bshd = saved_rotate
        moe_utils.torch = saved_torch
        forward.cache_clear()
