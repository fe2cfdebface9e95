"""AdamW and gradient clipping over a dict of numpy tensors.

Owns the optimizer state (first and second moments, step count) and one update: Adam with bias
correction and decoupled weight decay (Loshchilov & Hutter; what Megatron's optimizer does with
`--weight-decay`), after clipping the global L2 norm to `clip_grad` (Megatron's `--clip-grad`,
1.0 in Miles), with an optional linear learning-rate warmup over the first steps (Megatron's
`--lr-warmup-iters`), and optional per-tensor learning rates (`lrs`: how Megatron's `--decoupled-lr`
gives the input embedding and the output layer their own rate). It does not compute gradients.
"""

from __future__ import annotations

import math

import numpy as np

Tensors = dict[str, np.ndarray]


def global_norm(grads: Tensors) -> float:
    """L2 norm over every tensor together."""
    return math.sqrt(sum(float(np.vdot(g, g)) for g in grads.values()))


class AdamW:
    """AdamW over named tensors; `step` updates the parameters in place."""

    def __init__(
        self,
        params: Tensors,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.98),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        lrs: dict[str, float] | None = None,
    ) -> None:
        if lr <= 0 or not 0 <= betas[0] < 1 or not 0 <= betas[1] < 1 or eps <= 0 or weight_decay < 0:
            raise ValueError(
                f"invalid AdamW settings: lr={lr}, betas={betas}, eps={eps}, weight_decay={weight_decay}"
            )
        unknown = sorted(set(lrs or {}) - set(params))
        if unknown or any(not (math.isfinite(v) and v > 0) for v in (lrs or {}).values()):
            raise ValueError(f"invalid per-tensor learning rates {lrs!r} (unknown tensors: {unknown})")
        self.params = params
        self.lr = lr
        self.lrs = dict(lrs or {})
        self.betas = betas
        self.eps = eps
        self.weight_decay = weight_decay
        self.warmup_steps = max(0, int(warmup_steps))
        self.steps = 0
        self.m = {name: np.zeros_like(p) for name, p in params.items()}
        self.v = {name: np.zeros_like(p) for name, p in params.items()}

    def step(self, grads: Tensors, clip_grad: float | None = None) -> float:
        """Clip (if `clip_grad`), update every parameter; returns the norm before clipping."""
        norm = global_norm(grads)
        scale = 1.0
        if clip_grad is not None and clip_grad > 0 and norm > clip_grad:
            scale = clip_grad / (norm + 1e-6)
        self.steps += 1
        b1, b2 = self.betas
        correction1 = 1 - b1**self.steps
        correction2 = 1 - b2**self.steps
        warmup = min(1.0, self.steps / self.warmup_steps) if self.warmup_steps else 1.0
        for name, param in self.params.items():
            lr = self.lrs.get(name, self.lr) * warmup
            g = grads[name] * scale
            self.m[name] = b1 * self.m[name] + (1 - b1) * g
            self.v[name] = b2 * self.v[name] + (1 - b2) * g * g
            update = (self.m[name] / correction1) / (np.sqrt(self.v[name] / correction2) + self.eps)
            if self.weight_decay:
                param *= 1 - lr * self.weight_decay
            param -= lr * update
        return norm
