"""The trainer sees the sampler's tokens: recompute the merged sample with the engine's model.

A multi-turn, tool-using conversation goes through the official openai client -> session server
(--r3) -> tiny engine (seed 3, its prefix cache on). The merged sample is then scored by one full
forward of the same model (same seed, same weights): its logprobs must match the ones recorded
at sampling time on every masked-in token, and its routing must match the delta-R3 rows.
"""

from __future__ import annotations

import numpy as np
import pytest

from rl360_ext.local.services import start_engine
from rl360_ext.reference.engine.model import ModelConfig, TinyMoEModel
from rl360_ext.reference.engine.tokenizer import build_tokenizer
from rl360_ext.util.procs import running

from .conftest import (
    END_OF_TURN_BIAS,
    LS_CALL,
    SYSTEM,
    TOOLS,
    USER,
    merged,
    new_session,
    session_client,
    start_session_server,
)

pytestmark = pytest.mark.integration
SEED, LAYERS, EXPERTS, TOP_K = 3, 3, 6, 2


def test_recomputed_logprobs_and_routing_match_the_sampler(log_dir) -> None:
    engine_flags = [
        "--seed",
        str(SEED),
        "--layers",
        str(LAYERS),
        "--experts",
        str(EXPERTS),
        "--top-k",
        str(TOP_K),
    ]
    engine = start_engine(log_dir, *engine_flags, name="e2e-engine")
    server = start_session_server(log_dir, engine.url, "--r3", name="e2e-session")
    with running(engine, server):
        session_id, base_url = new_session(server)
        client = session_client(base_url)
        messages = [SYSTEM, USER]
        for turn in range(4):
            reply = client.chat.completions.create(
                model="policy", messages=messages, tools=TOOLS, max_tokens=40, temperature=0.9, seed=turn,
                logit_bias=END_OF_TURN_BIAS,
            )  # fmt: skip
            messages.append(reply.choices[0].message.model_dump(exclude_none=True))
            if turn % 2 == 0:
                messages += [
                    {"role": "assistant", "content": None, "tool_calls": [LS_CALL]},
                    {"role": "tool", "tool_call_id": "call_0", "content": f"output of step {turn}"},
                ]
            else:
                messages.append({"role": "user", "content": "Keep going."})
        sample = merged(server, session_id)

    assert sample.metadata["session"]["forks"] == []
    kept = len(sample.turns)
    assert kept == 4 or sample.turns[-1]["finish_reason"] == "length"
    assert kept >= 2, "the test needs at least two turns to exercise the prefix cache and delta R3"
    assert any(t["cached_tokens"] > 0 for t in sample.turns[1:])

    config = ModelConfig(
        vocab_size=build_tokenizer().get_vocab_size(), layers=LAYERS, experts=EXPERTS, top_k=TOP_K
    )
    model = TinyMoEModel.from_seed(config, SEED)
    tokens = sample.tokens.astype(np.int64)
    recomputed = model.sequence_logprobs(tokens)  # [i] = logprob of token i + 1
    sampled = np.nonzero(sample.loss_mask)[0]
    assert sampled.size > 0 and sampled.min() >= 1
    difference = np.abs(recomputed[sampled - 1] - sample.rollout_log_probs[sampled])
    assert difference.max() <= 1e-4, f"max |logprob difference| {difference.max():.2e} on masked-in tokens"

    routing = model.sequence_routing(tokens[:-1])
    assert sample.routed_experts.shape == routing.shape
    assert np.array_equal(np.sort(sample.routed_experts, axis=-1), np.sort(routing, axis=-1))
