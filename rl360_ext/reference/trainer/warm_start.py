"""Warm starts before RL: a base-model stage that tells prompts apart, then an answer-format head.

Owns the two supervised stages `rl360 demo` runs before its first rollout, and the measure of
what the first one achieves. Neither knows about tasks, answers or rewards.

- `fit_labels(model_config, weights, prompts, labels)`: the whole network (every tensor) trained
  with AdamW and cross-entropy to predict, at the end of each prompt, that prompt's label token.
  It stands in for pretraining: a random tiny model's final states after different prompts are
  nearly parallel (cosine ~0.99), so no head on top of them can answer differently per prompt,
  whereas a pretrained model's features already separate its inputs. Labels name an input (the
  caller picks one arbitrary token per distinct question); they are not answers.
- `fit_head(model_config, weights, prompts, tokens)`: the final-norm state at the end of each
  prompt is computed once with the training forward, then only `lm_head` is fitted (AdamW,
  cross-entropy toward the uniform distribution over `tokens`), so that after each prompt the
  model puts its mass on those tokens without preferring one. The rest of the network is
  unchanged. It is the "SFT for the answer format" step that precedes RL in practice, at the
  size of a linear probe: the policy starts answering with a letter at chance.
- `separation(features, groups)`: the mean cosine between the final states of prompts from
  different groups (1.0: indistinguishable).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rl360_ext.reference.engine.model import ModelConfig
from rl360_ext.reference.trainer.backward import TrainModel
from rl360_ext.reference.trainer.optim import AdamW


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


def separation(features: np.ndarray, groups: Sequence[int]) -> float:
    """Mean cosine similarity between rows of `features` whose `groups` differ."""
    groups = np.asarray(groups)
    if len(groups) != len(features) or len(set(groups.tolist())) < 2:
        raise ValueError("separation needs one group per feature row and at least two groups")
    unit = features / np.linalg.norm(features, axis=1, keepdims=True)
    cosines = unit @ unit.T
    return float(cosines[groups[:, None] != groups[None, :]].mean())


def fit_labels(
    model_config: ModelConfig,
    weights: dict[str, np.ndarray],
    prompts: Sequence[Sequence[int]],
    labels: Sequence[int],
    *,
    batch_size: int = 12,
    steps: int = 30,
    lr: float = 3e-3,
    seed: int = 0,
) -> tuple[dict[str, np.ndarray], float, int]:
    """New weights (every tensor trained), the mean probability of the labels in the last batch,
    and the optimizer steps taken.

    Each of `steps` steps draws `batch_size` prompts (a seeded shuffle, cycling), runs the
    training forward and backward of -log p(label | prompt) at the prompt's end, clips the
    gradient norm to 1 and takes one AdamW step. It runs every step even once the labels are
    likely: the labels are soon predicted from states that still share most of their direction,
    and the later steps are what pulls the states of different prompts apart (on the demo's
    quiz prompts, mean cosine 0.56 when the labels first reach p 0.99, about 0.1 after 30 steps).
    """
    if not prompts or len(prompts) != len(labels):
        raise ValueError(
            f"fit_labels needs one label per prompt, got {len(prompts)} prompts, {len(labels)} labels"
        )
    if batch_size < 1 or steps < 1:
        raise ValueError(f"batch_size and steps must be >= 1, got {batch_size} and {steps}")
    trained = {name: np.array(value, dtype=np.float64) for name, value in weights.items()}
    model = TrainModel(model_config, trained)
    optimizer = AdamW(trained, lr)
    order = np.random.default_rng(seed).permutation(len(prompts))
    mass = 0.0
    for step in range(steps):
        batch = [order[(step * batch_size + i) % len(order)] for i in range(min(batch_size, len(order)))]
        grads = {name: np.zeros_like(value) for name, value in trained.items()}
        probs = []
        for i in batch:
            prompt = list(prompts[i])
            log_prob, tape = model.forward(np.asarray([*prompt, labels[i]], dtype=np.int64), len(prompt))
            probs.append(float(np.exp(log_prob[0])))
            model.backward(tape, np.array([-1.0 / len(batch)]), grads)
        mass = float(np.mean(probs))
        optimizer.step(grads, 1.0)
    return trained, mass, steps


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
