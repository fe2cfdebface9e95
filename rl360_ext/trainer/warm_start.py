"""A format warm start: fit the LM head, on the frozen model's features, toward a set of tokens.

Owns `fit_head(model_config, weights, prompts, tokens)`: the final-norm state at the end of each
prompt is computed once with the training forward, then only `lm_head` is fitted (AdamW,
cross-entropy toward the uniform distribution over `tokens`), so that after each prompt the
model puts its mass on those tokens without preferring one. The rest of the network is
unchanged. It is the "SFT for the answer format" step that precedes RL in practice, at the size
of a linear probe: `rl360 demo` uses it so its policy starts answering a quiz with a letter at
chance instead of writing byte-level text. It does not know about tasks or rewards.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rl360_ext.tiny_engine.model import ModelConfig
from rl360_ext.trainer.backward import TrainModel
from rl360_ext.trainer.optim import AdamW


def head_features(
    model_config: ModelConfig, weights: dict[str, np.ndarray], prompts: Sequence[Sequence[int]]
) -> np.ndarray:
    """[len(prompts), d_model]: the final-norm state at the last position of each prompt."""
    model = TrainModel(model_config, weights)
    rows = []
    for prompt in prompts:
        sequence = np.asarray([*prompt, 0], dtype=np.int64)
        _, tape = model.forward(sequence, len(prompt))
        rows.append(tape.f[0])
    return np.stack(rows)


def fit_head(
    model_config: ModelConfig,
    weights: dict[str, np.ndarray],
    prompts: Sequence[Sequence[int]],
    tokens: Sequence[int],
    *,
    target_mass: float = 0.9,
    max_steps: int = 500,
    lr: float = 0.01,
) -> tuple[dict[str, np.ndarray], float]:
    """New weights (only the `tokens`' columns of `lm_head` differ) and the mean probability the
    fitted head gives `tokens` after the prompts.

    The columns are first set to their mean, so the tokens are exactly equally likely after any
    prompt, then moved together (AdamW on one shared column, cross-entropy toward the uniform
    distribution over `tokens`) until their mean total probability reaches `target_mass` (a head
    pushed to certainty would make every later update of the layers below swing the answer), or
    after `max_steps`.
    """
    if not prompts or not tokens:
        raise ValueError("fit_head needs at least one prompt and one target token")
    if not 0 < target_mass < 1:
        raise ValueError(f"target_mass must be in (0, 1), got {target_mass}")
    chosen = sorted(set(int(t) for t in tokens))
    features = head_features(model_config, weights, prompts)
    head = weights["lm_head"].astype(np.float64).copy()
    shared = {"column": head[:, chosen].mean(axis=1)}
    optimizer = AdamW(shared, lr)
    mass = 0.0
    for _ in range(max_steps + 1):
        head[:, chosen] = shared["column"][:, None]
        logits = features @ head
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        mass = float(probs[:, chosen].sum(axis=-1).mean())
        if mass >= target_mass or optimizer.steps == max_steps:
            break
        error = probs[:, chosen] - 1.0 / len(chosen)  # d CE / d logit of each chosen token
        optimizer.step({"column": features.T @ error.sum(axis=1) / len(features)})
    return {**weights, "lm_head": head}, mass
