"""The reference trainer on a real merged sample: a tool-using conversation through a real session
server (--r3) and a real float64 tiny engine, converted to a Miles sample by the generate hook's
converter, recomputed and trained on.

Checks: the merged sample carries a tool-output span with loss mask 0 between sampled spans and
delta-R3 rows across turns; replaying those rows uses exactly the engine's experts and the
trainer's own top-k agrees on every row; the recomputed log-probs equal the engine's float64
log-probs of the same tokens to 1e-9, and the sampler's recorded ones (which the session stores as
float32) to float32 rounding; a train step on it reports those trust metrics and moves the weights,
and the engine's top-4 log-probs per generated token (the session server's --top-logprobs-num)
match the trainer's distribution at the sampling version (top-k KL <= 1e-9, overlap 1).
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from integration_tests.session.conftest import (
    END_OF_TURN_BIAS,
    SYSTEM,
    TOOLS,
    USER,
    merged,
    new_session,
    session_client,
    start_session_server,
)
from rl360_ext.local.services import start_engine
from rl360_ext.reference.engine.model import ModelConfig, init_weights
from rl360_ext.reference.engine.tokenizer import build_tokenizer
from rl360_ext.reference.trainer.trainer import Trainer, TrainerConfig
from rl360_ext.rollout.sample import Sample
from rl360_ext.rollout.sample_fill import fill_from_merged
from rl360_ext.sglang.top_logprobs import TOP_LOGPROBS_KEY
from rl360_ext.sglang.versions import RoutingSource
from rl360_ext.util.procs import running

pytestmark = pytest.mark.integration
SEED = 5
FLOAT32_ROUNDING = 2.0**-23  # relative spacing of float32 around a value: the session's storage


def _conversation(base_url: str) -> None:
    client = session_client(base_url)
    messages = [SYSTEM, USER]
    for turn in range(3):
        reply = client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, max_tokens=24, temperature=1.0, seed=turn,
            logit_bias=END_OF_TURN_BIAS,
        )  # fmt: skip
        messages.append(reply.choices[0].message.model_dump(exclude_none=True))
        messages.append(
            {"role": "tool", "tool_call_id": "call_0", "content": f"README.md\nsrc\ntests (turn {turn})"}
        )


def _engine_logprobs(engine_url: str, tokens: list[int]) -> np.ndarray:
    """The engine's float64 log-prob of every token given the ones before it (prefill, JSON floats)."""
    body = {
        "input_ids": tokens,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_logprob": True,
        "logprob_start_len": 0,
    }
    response = httpx.post(f"{engine_url}/generate", json=body, timeout=60)
    response.raise_for_status()
    entries = response.json()["meta_info"]["input_token_logprobs"]
    return np.array([np.nan if e[0] is None else e[0] for e in entries], dtype=np.float64)


def test_trainer_recomputes_a_real_merged_sample(log_dir) -> None:
    engine = start_engine(log_dir, "--seed", str(SEED), name="trainer-engine")
    server = start_session_server(
        log_dir, engine.url, "--r3", "--top-logprobs-num", "4", name="trainer-session"
    )
    with running(engine, server):
        session_id, base_url = new_session(server)
        _conversation(base_url)
        sample_wire = merged(server, session_id)
        tokens = sample_wire.tokens.astype(int).tolist()
        engine_logprobs = _engine_logprobs(engine.url, tokens)

    tokenizer = build_tokenizer()
    sample = Sample(group_index=0, index=0)
    filled, why = fill_from_merged(sample, sample_wire, tokenizer.decode)
    assert filled and why is None
    sample.metadata[TOP_LOGPROBS_KEY] = filled.metadata[TOP_LOGPROBS_KEY]  # as finish_sample copies it
    assert len(sample.metadata[TOP_LOGPROBS_KEY]["ids"]) == sample.response_length
    mask = np.asarray(sample.loss_mask)
    edges = np.flatnonzero(np.diff(mask))
    assert sample_wire.metadata["session"]["forks"] == [] and len(sample_wire.turns) >= 2
    assert mask[0] == 1 and len(edges) >= 2, "sampled spans around a masked tool-output span"
    assert sample_wire.turns[-1]["cached_tokens"] > 0
    sources = sample_wire.routing_source
    assert sources is not None and (sources != RoutingSource.PREFILL).any(), "rows of sampled tokens"

    config = ModelConfig(vocab_size=tokenizer.get_vocab_size())
    # the engine was never pushed to: its tokens carry SGLang's label "default", the seed weights
    trainer = Trainer(config, init_weights(config, SEED), TrainerConfig(unversioned_as=0))
    prompt = len(sample.tokens) - sample.response_length
    replayed, tape = trainer.model.forward(np.asarray(sample.tokens), prompt, sample.rollout_routed_experts)
    assert np.array_equal(tape.used_routing, sample.rollout_routed_experts)
    assert np.array_equal(np.sort(tape.own_routing, axis=-1), np.sort(sample.rollout_routed_experts, axis=-1))

    sampled = mask > 0
    expected = engine_logprobs[prompt:]
    assert np.abs(replayed - expected)[sampled].max() <= 1e-9
    recorded = np.asarray(sample.rollout_log_probs)
    bound = FLOAT32_ROUNDING * np.abs(recorded) + 1e-12
    assert (np.abs(replayed - recorded) <= bound)[sampled].all()

    before = {name: value.copy() for name, value in trainer.weights.items()}
    infra = Sample(
        group_index=0, index=1, tokens=sample.tokens[:prompt], rollout_log_probs=[], remove_sample=True
    )
    metrics = trainer.train_step([sample, infra], [1.0, 0.0])
    assert metrics["train/valid_samples"] == 1 and metrics["train/masked_samples"] == 1
    assert metrics["train/routing_agreement"] == 1.0
    assert metrics["train/logprob_abs_diff_max"] <= 1e-6
    assert metrics["train/parity_unscored_tokens"] == 0 and metrics["train/policy_lag_abs_diff_max"] == 0.0
    assert metrics["train/topk_kl"] <= 1e-9 and metrics["train/topk_overlap"] == 1.0
    assert metrics["train/loss_scale"] == pytest.approx(1.0)
    assert all(
        not np.array_equal(before[name], trainer.weights[name])
        for name in ("embed", "lm_head", "layers.0.router")
    )
