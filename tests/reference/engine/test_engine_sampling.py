"""Sampling filters, penalties and the routed-experts codec."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.reference.engine.engine import TinyEngine
from rl360_ext.reference.engine.protocol import (
    GenerateRequest,
    SamplingParams,
    decode_routed_experts,
    encode_routed_experts,
)
from rl360_ext.reference.engine.sampling import adjusted_logits, sample_token


@settings(max_examples=60)
@given(
    seed=st.integers(0, 10_000),
    top_k=st.sampled_from([-1, 1, 2, 5]),
    top_p=st.floats(0.05, 1.0),
    min_p=st.floats(0.0, 0.9),
    temperature=st.floats(0.1, 2.0),
)
def test_sampled_token_is_inside_every_filter(
    seed: int, top_k: int, top_p: float, min_p: float, temperature: float
) -> None:
    logits = np.random.default_rng(seed).normal(0, 3, 50)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    token = sample_token(logits, params, np.random.default_rng(seed), banned=[])
    probs = np.exp((logits - logits.max()) / temperature)
    probs /= probs.sum()
    rank = int(np.sum(probs > probs[token]))
    if top_k > 0:
        assert rank < top_k
    assert np.sum(probs[probs > probs[token]]) < top_p or rank == 0
    assert probs[token] >= min_p * probs.max() - 1e-12


def test_greedy_and_banned_tokens() -> None:
    logits = np.array([0.0, 5.0, 1.0])
    assert sample_token(logits, SamplingParams(temperature=0), np.random.default_rng(0), banned=[]) == 1
    assert sample_token(logits, SamplingParams(temperature=0), np.random.default_rng(0), banned=[1]) == 2


def test_penalties_push_repeated_tokens_down() -> None:
    logits = np.array([2.0, 2.0, -1.0])
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    adjusted = adjusted_logits(logits, params, [0, 0, 2])
    assert adjusted[0] == pytest.approx(2.0 / 2.0 - 1.0 - 0.25)
    assert adjusted[1] == 2.0
    assert adjusted[2] == pytest.approx(-1.0 * 2.0 - 0.5 - 0.25)
    assert np.array_equal(adjusted_logits(logits, SamplingParams(logit_bias={2: 3.0}), []), [2.0, 2.0, 2.0])


@settings(max_examples=40)
@given(rows=st.integers(0, 30), layers=st.integers(1, 5), top_k=st.integers(1, 4), data=st.data())
def test_routed_experts_codec_round_trips(rows: int, layers: int, top_k: int, data: st.DataObject) -> None:
    values = data.draw(
        st.lists(st.integers(0, 2**31 - 1), min_size=rows * layers * top_k, max_size=rows * layers * top_k)
    )
    routing = np.array(values, np.int32).reshape(rows, layers, top_k)
    decoded = decode_routed_experts(encode_routed_experts(routing), layers, top_k)
    assert decoded.dtype == np.int32 and np.array_equal(decoded, routing)


def test_routed_experts_codec_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError):
        decode_routed_experts(encode_routed_experts(np.zeros((3, 2, 2), np.int32)), 5, 2)


def test_top_logprobs_and_text_in_logprobs(engine: TinyEngine, prompt: list[int]) -> None:
    request = GenerateRequest(
        prompt,
        SamplingParams(max_new_tokens=3, temperature=0),
        return_logprob=True,
        top_logprobs_num=4,
        return_text_in_logprobs=True,
    )
    meta = engine.generate(request)["meta_info"]
    for (logprob, token, text), top in zip(
        meta["output_token_logprobs"], meta["output_top_logprobs"], strict=True
    ):
        assert text == engine.decode([token])
        assert len(top) == 4 and top[0][1] == token and top[0][0] == logprob  # greedy = most likely
        assert [entry[0] for entry in top] == sorted((entry[0] for entry in top), reverse=True)
