"""/generate semantics: logprob recompute, routed_experts delta, finish reasons, determinism, cache reuse."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.reference.engine.engine import EngineConfig, TinyEngine
from rl360_ext.reference.engine.protocol import GenerateRequest, SamplingParams, decode_routed_experts
from rl360_ext.reference.engine.server import create_app


@pytest.fixture(scope="module")
def routing_engine() -> TinyEngine:
    return TinyEngine(EngineConfig(seed=1))


def _generate(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/generate", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def _routing(engine: TinyEngine, meta: dict[str, Any]) -> np.ndarray:
    return decode_routed_experts(
        meta["routed_experts"], engine.model_config.layers, engine.model_config.top_k
    )


def test_full_forward_recompute_matches_generate_logprobs(
    client: TestClient, fresh_engine: TinyEngine
) -> None:
    prompt = fresh_engine.encode("<|im_start|>user\nfix the failing test<|im_end|>\n<|im_start|>assistant\n")
    expected_cached = 0
    for turn in range(3):  # later turns reuse the prefix cache: logprobs must not change
        sampling = {"max_new_tokens": 24, "temperature": 1.3, "top_p": 0.9, "sampling_seed": turn}
        body = _generate(client, input_ids=prompt, sampling_params=sampling, return_logprob=True)
        meta = body["meta_info"]
        reported = np.array([entry[0] for entry in meta["output_token_logprobs"]])
        assert [entry[1] for entry in meta["output_token_logprobs"]] == body["output_ids"]
        assert all(entry[2] is None for entry in meta["output_token_logprobs"])
        recomputed = fresh_engine.model.sequence_logprobs(prompt + body["output_ids"])[len(prompt) - 1 :]
        assert np.max(np.abs(recomputed - reported)) <= 1e-5
        assert meta["cached_tokens"] == expected_cached
        expected_cached = len(prompt) + len(body["output_ids"]) - 1  # all but the last token has KV
        prompt = prompt + body["output_ids"] + fresh_engine.encode("<|im_start|>user\nagain<|im_end|>\n")


def test_input_token_logprobs_from_logprob_start_len(engine: TinyEngine, prompt: list[int]) -> None:
    request = GenerateRequest(
        input_ids=prompt, sampling=SamplingParams(max_new_tokens=2), return_logprob=True, logprob_start_len=0
    )
    meta = engine.generate(request)["meta_info"]
    entries = meta["input_token_logprobs"]
    assert [e[1] for e in entries] == prompt and entries[0][0] is None
    full = engine.model.sequence_logprobs(prompt)
    assert np.max(np.abs(np.array([e[0] for e in entries[1:]]) - full)) <= 1e-5


@settings(max_examples=25)
@given(
    prompt_len=st.integers(1, 40),
    max_new=st.integers(0, 12),
    start_len=st.integers(0, 60),
    warm=st.booleans(),
)
def test_routed_experts_shape_and_start_len_delta(
    routing_engine: TinyEngine, prompt_len: int, max_new: int, start_len: int, warm: bool
) -> None:
    engine = routing_engine
    prompt = np.random.default_rng(prompt_len).integers(0, engine.vocab_size, prompt_len).tolist()
    if not warm:
        engine.flush_cache()

    def run(start: int) -> dict[str, Any]:
        sampling = SamplingParams(max_new_tokens=max_new, ignore_eos=True, sampling_seed=7)
        request = GenerateRequest(
            input_ids=prompt, sampling=sampling, return_routed_experts=True, routed_experts_start_len=start
        )
        return engine.generate(request)

    full, delta = run(0), run(start_len)
    assert full["output_ids"] == delta["output_ids"]
    rows = prompt_len + len(full["output_ids"]) - 1
    full_routing, delta_routing = _routing(engine, full["meta_info"]), _routing(engine, delta["meta_info"])
    assert full_routing.shape == (rows, engine.model_config.layers, engine.model_config.top_k)
    assert delta_routing.shape[0] == max(0, rows - start_len)
    assert np.array_equal(delta_routing, full_routing[start_len:])
    # every reported row is what one full forward over the sequence routes (same weights)
    sequence = prompt + full["output_ids"]
    assert np.array_equal(full_routing, engine.model.sequence_routing(sequence)[:rows])


def test_finish_reason_length(engine: TinyEngine, prompt: list[int]) -> None:
    body = engine.generate(GenerateRequest(prompt, SamplingParams(max_new_tokens=5, ignore_eos=True)))
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert body["meta_info"]["completion_tokens"] == 5 == len(body["output_ids"])


def test_finish_reason_stop_token_and_trim(engine: TinyEngine, prompt: list[int]) -> None:
    greedy = engine.generate(
        GenerateRequest(prompt, SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True))
    )
    target = greedy["output_ids"][4]
    first = greedy["output_ids"].index(target)
    params = SamplingParams(max_new_tokens=12, temperature=0, stop_token_ids=[target])
    body = engine.generate(GenerateRequest(prompt, params))
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": target}
    assert body["output_ids"] == greedy["output_ids"][: first + 1]  # the stop token stays in output_ids
    assert body["text"] == engine.decode(greedy["output_ids"][:first], skip_special_tokens=True)
    params.no_stop_trim = True
    untrimmed = engine.generate(GenerateRequest(prompt, params))
    assert untrimmed["text"] == engine.decode(greedy["output_ids"][: first + 1], skip_special_tokens=True)


def test_finish_reason_stop_string(engine: TinyEngine, prompt: list[int]) -> None:
    greedy = engine.generate(
        GenerateRequest(prompt, SamplingParams(max_new_tokens=16, temperature=0, ignore_eos=True))
    )
    raw = engine.decode(greedy["output_ids"])
    stop = raw[len(raw) // 2 : len(raw) // 2 + 2]
    body = engine.generate(
        GenerateRequest(prompt, SamplingParams(max_new_tokens=16, temperature=0, stop=[stop]))
    )
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert stop not in body["text"] and raw.startswith(body["text"])
    assert stop in engine.decode(body["output_ids"])


def test_eos_is_im_end(fresh_engine: TinyEngine, prompt: list[int]) -> None:
    eos = fresh_engine.eos_token_id
    assert fresh_engine.decode([eos]) == "<|im_end|>"
    params = SamplingParams(max_new_tokens=8, temperature=0, logit_bias={eos: 100.0})
    body = fresh_engine.generate(GenerateRequest(prompt, params))
    assert body["output_ids"] == [eos]
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": eos}
    assert body["text"] == ""
    params.ignore_eos = True
    assert len(fresh_engine.generate(GenerateRequest(prompt, params))["output_ids"]) == 8


def test_min_new_tokens_holds_back_eos(fresh_engine: TinyEngine, prompt: list[int]) -> None:
    eos = fresh_engine.eos_token_id
    params = SamplingParams(max_new_tokens=8, temperature=0, logit_bias={eos: 100.0}, min_new_tokens=3)
    body = fresh_engine.generate(GenerateRequest(prompt, params))
    assert len(body["output_ids"]) == 4 and body["output_ids"][-1] == eos


def test_skip_special_tokens_controls_text(engine: TinyEngine) -> None:
    prompt = engine.encode("<|im_start|>user\nhi<|im_end|>\n")
    bias = {engine.tokenizer.token_to_id("<think>"): 100.0}
    keep = SamplingParams(max_new_tokens=1, temperature=0, logit_bias=bias, skip_special_tokens=False)
    assert engine.generate(GenerateRequest(prompt, keep))["text"] == "<think>"
    keep.skip_special_tokens = True
    assert engine.generate(GenerateRequest(prompt, keep))["text"] == ""


def test_sampling_is_deterministic_per_seed(prompt: list[int]) -> None:
    def sample(engine_seed: int, sampling_seed: int | None) -> list[int]:
        engine = TinyEngine(EngineConfig(seed=engine_seed))
        params = SamplingParams(
            max_new_tokens=16, temperature=1.0, ignore_eos=True, sampling_seed=sampling_seed
        )
        return engine.generate(GenerateRequest(prompt, params))["output_ids"]

    assert sample(0, 11) == sample(0, 11)
    assert sample(0, None) == sample(0, None)  # engine-seeded sampler: same seed, same order -> same tokens
    assert sample(0, 11) != sample(0, 12)
    assert sample(0, 11) != sample(1, 11)


def test_shared_prefix_hits_cache(fresh_engine: TinyEngine, prompt: list[int]) -> None:
    params = SamplingParams(max_new_tokens=4, ignore_eos=True)
    first = fresh_engine.generate(GenerateRequest(prompt, params))
    assert first["meta_info"]["cached_tokens"] == 0
    branch = prompt + fresh_engine.encode("a different continuation")
    second = fresh_engine.generate(GenerateRequest(branch, params))
    assert second["meta_info"]["cached_tokens"] == len(prompt)
    follow_up = prompt + first["output_ids"] + fresh_engine.encode(" next turn")
    third = fresh_engine.generate(GenerateRequest(follow_up, params))
    assert third["meta_info"]["cached_tokens"] == len(prompt) + len(first["output_ids"]) - 1
    repeat = fresh_engine.generate(GenerateRequest(prompt, params))
    assert repeat["meta_info"]["cached_tokens"] == len(prompt) - 1  # the last prompt token is recomputed


def test_routing_comes_from_the_forward_that_wrote_the_kv(fresh_engine: TinyEngine, tmp_path) -> None:
    """Cached positions report the routing computed with their KV; after eviction they are re-routed."""
    from rl360_ext.reference.engine.model import init_weights, perturb_weights, save_weights

    engine = fresh_engine
    prompt = np.random.default_rng(3).integers(0, engine.vocab_size, 200).tolist()
    params = SamplingParams(max_new_tokens=1, ignore_eos=True)

    def routing_of(request_prompt: list[int]) -> tuple[np.ndarray, int]:
        request = GenerateRequest(request_prompt, params, return_routed_experts=True)
        meta = engine.generate(request)["meta_info"]
        return _routing(engine, meta)[: len(prompt) - 1], meta["cached_tokens"]

    old_routing, cached = routing_of(prompt)
    assert cached == 0
    path = save_weights(
        tmp_path / "w.npz", engine.model_config, perturb_weights(init_weights(engine.model_config, 0), 0.3, 1)
    )
    engine.update_weights_from_disk(str(path), "v1", flush_cache=False)
    new_full = engine.model.sequence_routing(prompt)[: len(prompt) - 1]
    assert not np.array_equal(old_routing, new_full)  # the update moved some routing decisions

    cached_routing, cached = routing_of(prompt)
    assert cached == len(prompt) - 1
    assert np.array_equal(cached_routing, old_routing)  # served from the cache: old forward's routing

    engine.flush_cache()  # evicts everything: the next request re-prefills and re-routes
    rerouted, cached = routing_of(prompt)
    assert cached == 0
    assert np.array_equal(rerouted, new_full)


def test_eviction_under_small_capacity_reroutes(prompt: list[int]) -> None:
    engine = TinyEngine(EngineConfig(kv_capacity=len(prompt) + 8))
    params = SamplingParams(max_new_tokens=4, ignore_eos=True)
    engine.generate(GenerateRequest(prompt, params))
    other = np.random.default_rng(9).integers(0, engine.vocab_size, len(prompt)).tolist()
    engine.generate(GenerateRequest(other, params))  # pushes the first prompt out (LRU)
    again = engine.generate(GenerateRequest(prompt, params))
    assert again["meta_info"]["cached_tokens"] < len(prompt) - 1
    assert engine.cache.stats.evicted_tokens > 0
    assert engine.cache.size_tokens <= len(prompt) + 8


def test_response_fields(client: TestClient, fresh_engine: TinyEngine) -> None:
    ids = fresh_engine.encode("hello")
    body = _generate(
        client,
        input_ids=ids,
        rid="req-1",
        return_prompt_token_ids=True,
        sampling_params={"max_new_tokens": 3},
    )
    meta = body["meta_info"]
    assert body["prompt_token_ids"] == ids
    assert meta["id"] == "req-1" and meta["prompt_tokens"] == len(ids) and meta["completion_tokens"] == 3
    assert meta["weight_version"] == "default"
    assert meta["weight_versions"] == [{"version": "default", "start": 0, "end": 3}]
    assert meta["e2e_latency"] > 0
    by_text = _generate(client, text="hello", sampling_params={"max_new_tokens": 3, "temperature": 0})
    by_ids = _generate(client, input_ids=ids, sampling_params={"max_new_tokens": 3, "temperature": 0})
    assert by_text["output_ids"] == by_ids["output_ids"]


def test_client_side_http_matches_logic_layer(engine: TinyEngine, prompt: list[int]) -> None:
    with TestClient(create_app(engine)) as client:
        sampling = {"max_new_tokens": 6, "temperature": 0.8, "sampling_seed": 5}
        over_http = _generate(client, input_ids=prompt, sampling_params=sampling)
    direct = engine.generate(
        GenerateRequest(prompt, SamplingParams(max_new_tokens=6, temperature=0.8, sampling_seed=5))
    )
    assert over_http["output_ids"] == direct["output_ids"]
