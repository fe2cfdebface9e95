"""The estimators measured directly (`rl360 ab --gradient-draws`): from one policy, many
independent one-step batches, each arm's gradient (captured before clipping and AdamW) against
the clean expected gradient (`gradient_variance`), and each arm's advantages against the ones the
same attempts get without faults (`advantage_agreement`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rl360_ext.local.ab.config import OfflineConfig
from rl360_ext.local.ab.problem import OFFLINE_ARMS, Problem, Sampler, miles_args
from rl360_ext.local.ab.runs import arm_trainer, rollout_step
from rl360_ext.local.ab.stats import (
    paired_interval,
)
from rl360_ext.local.demo.modes import (
    BURST,
    CLEAN,
    RL360,
)
from rl360_ext.outcomes.provenance import is_valid
from rl360_ext.reference.engine.threads import single_blas_thread
from rl360_ext.rollout.filters import check_valid_reward_nonzero_std
from rl360_ext.rollout.metrics import REGISTRY
from rl360_ext.util.dotted import load_function


class _GradientRecorder:
    """Stands in for the trainer's AdamW: keeps the gradient it is handed, changes no weight."""

    def __init__(self) -> None:
        self.grads: list[np.ndarray] = []

    def step(self, grads: Mapping[str, np.ndarray], clip_grad: float | None = None) -> float:
        flat = np.concatenate([grads[name].ravel() for name in sorted(grads)])
        self.grads.append(flat)
        return float(np.linalg.norm(flat))


def gradient_variance(
    problem: Problem, config: OfflineConfig, mode: str, arms: Sequence[str], draws: int
) -> dict[str, dict[str, Any]]:
    """Per arm: bias and variance of the one-step policy gradient from `problem.weights`.

    Each draw is one step's batch (the plan of seed `first_seed + draw`, step 0, `mode`'s faults;
    the clean arm the same batch without faults), post-processed and trained on by the arm's
    rules with the optimizer replaced by a recorder. Against the clean arm's mean gradient g*:
    `bias` = |mean(g) - g*| / |g*|, `variance` = mean |g - mean(g)|^2 / |g*|^2, `mse` their
    sum (bias^2 + variance), `cosine` = cos(mean(g), g*), `draw_cosine` the mean over draws of
    cos(g, g*) (scale-free: what AdamW's direction sees), `draw_cosines` each draw's (the same
    draws in every arm: paired). A draw with no kept group is a zero gradient (no update)."""
    args = miles_args(config)
    recorded: dict[str, list[np.ndarray]] = {}
    with single_blas_thread():
        first = problem.first_weights(mode)
        sampler = Sampler(problem, first, config.temperature)
        size = sum(value.size for value in first.values())
        for arm in arms:
            post_process = load_function(OFFLINE_ARMS[arm].reward_post_process_path)
            trainer = arm_trainer(problem, arm, first)
            recorder = _GradientRecorder()
            trainer.optimizer = recorder  # type: ignore[assignment]
            grads = []
            for draw in range(draws):
                seed = config.first_seed + draw
                step = config.steps // 2 if mode == BURST else 0
                groups, _, _, _ = rollout_step(problem, config, sampler, mode, arm, seed, step, 0)
                kept = [g for g in groups if check_valid_reward_nonzero_std(args, g).keep]
                REGISTRY.drain()
                samples = [s for g in kept for s in g]
                recorder.grads.clear()
                if samples:
                    raw, advantages = post_process(args, samples)
                    trainer.train_step(samples, advantages, raw, policy_version=0)
                # a step with nothing valid to train on moves nothing: a zero gradient
                grads.append(recorder.grads[0] if recorder.grads else np.zeros(size))
            recorded[arm] = grads
    reference = np.mean(recorded[CLEAN], axis=0) if CLEAN in recorded else None
    out: dict[str, dict[str, Any]] = {}
    for arm, grads in recorded.items():
        stack = np.asarray(grads)
        mean = stack.mean(axis=0)
        spread = float(np.mean(np.sum((stack - mean) ** 2, axis=1)))
        entry: dict[str, Any] = {
            "draws": float(len(stack)),
            "norm": float(np.linalg.norm(mean)),
            "variance_abs": spread,
        }
        if reference is not None:
            scale = float(np.linalg.norm(reference)) or 1.0
            bias = float(np.linalg.norm(mean - reference)) / scale
            variance = spread / scale**2
            norms = np.linalg.norm(stack, axis=1)
            cosines = np.where(norms > 0, stack @ reference / (norms * scale + 1e-300), 0.0)
            entry.update(
                bias=bias,
                variance=variance,
                mse=bias**2 + variance,
                cosine=float(mean @ reference / (np.linalg.norm(mean) * scale + 1e-300)),
                draw_cosine=float(np.mean(cosines)),
                draw_cosine_sd=float(np.std(cosines, ddof=1)) if len(cosines) > 1 else 0.0,
                draw_cosines=cosines.tolist(),
            )
        out[arm] = entry
    if RL360 in out and "draw_cosines" in out[RL360]:
        for arm, entry in out.items():
            if arm != RL360:
                paired = paired_interval(entry["draw_cosines"], out[RL360]["draw_cosines"])
                entry["draw_cosine_minus_rl360"] = dataclasses.asdict(paired)
    return out


def advantage_agreement(
    problem: Problem, config: OfflineConfig, mode: str, arms: Sequence[str], draws: int
) -> dict[str, dict[str, float]]:
    """Per arm: how far its advantages are from the ones the same attempts get without faults.

    At `problem.weights` every arm samples the same tokens for an attempt (paired draws), so the
    clean arm's advantage of an attempt is what its group would have given it had no attempt
    failed. Over `draws` one-step batches (as `gradient_variance`), for every valid attempt in a
    group the arm trains on: `rmse` of (arm's advantage - clean's), and the mean signed error for
    right and wrong answers (`error_right`, `error_wrong`); 0 for the clean arm itself."""
    args = miles_args(config)
    sampler = Sampler(problem, problem.first_weights(mode), config.temperature)
    step = config.steps // 2 if mode == BURST else 0

    def advantages(arm: str, seed: int) -> dict[int, tuple[float, float]]:
        groups, _, _, _ = rollout_step(problem, config, sampler, mode, arm, seed, step, 0)
        kept = [g for g in groups if check_valid_reward_nonzero_std(args, g).keep]
        REGISTRY.drain()
        samples = [s for g in kept for s in g]
        if not samples:
            return {}
        _, values = load_function(OFFLINE_ARMS[arm].reward_post_process_path)(args, samples)
        return {s.index: (float(s.reward), a) for s, a in zip(samples, values, strict=True) if is_valid(s)}

    errors: dict[str, list[tuple[float, float]]] = {arm: [] for arm in arms}
    with single_blas_thread():
        for draw in range(draws):
            seed = config.first_seed + draw
            clean = advantages(CLEAN, seed)
            for arm in arms:
                for index, (reward, value) in advantages(arm, seed).items():
                    errors[arm].append((reward, value - clean.get(index, (reward, 0.0))[1]))
    out = {}
    for arm, pairs in errors.items():
        right = [e for r, e in pairs if r > 0]
        wrong = [e for r, e in pairs if r <= 0]
        out[arm] = {
            "attempts": float(len(pairs)),
            "rmse": float(np.sqrt(np.mean([e * e for _, e in pairs]))) if pairs else math.nan,
            "error_right": float(np.mean(right)) if right else math.nan,
            "error_wrong": float(np.mean(wrong)) if wrong else math.nan,
        }
    return out
