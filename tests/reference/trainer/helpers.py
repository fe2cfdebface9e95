"""Small models and Miles-shaped samples for the trainer's unit tests."""

from __future__ import annotations

from typing import Any

import numpy as np

from rl360_ext.reference.engine.model import KVState, ModelConfig, TinyMoEModel, init_weights, log_softmax
from rl360_ext.rollout.sample import Sample

SMALL = ModelConfig(
    vocab_size=40, layers=2, experts=4, top_k=2, d_model=16, heads=2, head_dim=8, expert_hidden=12
)


def small_weights(seed: int = 3) -> dict[str, np.ndarray]:
    return init_weights(SMALL, seed)


def rollout(
    weights: dict[str, np.ndarray],
    prompt: list[int],
    new_tokens: int,
    seed: int,
    config: ModelConfig = SMALL,
) -> tuple[list[int], list[float], np.ndarray]:
    """Sample `new_tokens` from the engine's model incrementally (KV cache, one token a step), as the
    engine decodes: (tokens, log-probs of the sampled tokens, routing of every position but the last)."""
    model = TinyMoEModel(config, weights)
    rng = np.random.default_rng(seed)
    kv = KVState.empty(config, len(prompt) + new_tokens + 1)
    out = model.forward(np.asarray(prompt), kv)
    tokens, logprobs, routing = list(prompt), [], [out.routing]
    for step in range(new_tokens):
        lp = log_softmax(out.logits[-1])
        token = int(rng.choice(len(lp), p=np.exp(lp)))
        tokens.append(token)
        logprobs.append(float(lp[token]))
        if step + 1 < new_tokens:
            out = model.forward(np.asarray([token]), kv)
            routing.append(out.routing)
    return tokens, logprobs, np.concatenate(routing)[: len(tokens) - 1]


def sample(
    weights: dict[str, np.ndarray],
    index: int,
    *,
    prompt_length: int = 6,
    response_length: int = 8,
    masked_span: tuple[int, int] | None = (3, 5),
    remove: bool = False,
    group_index: int = 0,
    version: int | None = 0,
) -> Any:
    """A merged-looking sample: prompt, response with a loss-mask-0 span (a tool output), R3 routing,
    sampled by weight version `version` (Miles' `weight_versions`; None: no version recorded)."""
    rng = np.random.default_rng(1000 + index)
    prompt = rng.integers(0, SMALL.vocab_size, prompt_length).tolist()
    tokens, logprobs, routing = rollout(weights, prompt, response_length, seed=index)
    mask = [1] * response_length
    if masked_span is not None:
        for position in range(*masked_span):
            mask[position] = 0
            logprobs[position] = 0.0
    return Sample(
        group_index=group_index,
        index=index,
        tokens=tokens,
        response_length=response_length,
        loss_mask=mask,
        rollout_log_probs=logprobs,
        rollout_routed_experts=routing.astype(np.int32),
        remove_sample=remove,
        reward=1.0,
        weight_versions=[] if version is None else [str(version)],
    )
