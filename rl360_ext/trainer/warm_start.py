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
    steps: int = 300,
    lr: float = 0.05,
) -> tuple[dict[str, np.ndarray], float]:
    """New weights (only `lm_head` differs) and the mean probability the fitted head gives `tokens`."""
    if not prompts or not tokens:
        raise ValueError("fit_head needs at least one prompt and one target token")
    features = head_features(model_config, weights, prompts)
    target = np.zeros(model_config.vocab_size)
    target[list(tokens)] = 1.0 / len(tokens)
    head = {"lm_head": weights["lm_head"].astype(np.float64).copy()}
    optimizer = AdamW(head, lr)
    for _ in range(steps):
        logits = features @ head["lm_head"]
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        optimizer.step({"lm_head": features.T @ (probs - target) / len(features)})
    logits = features @ head["lm_head"]
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    mass = float(probs[:, list(tokens)].sum(axis=-1).mean())
    return {**weights, "lm_head": head["lm_head"]}, mass
