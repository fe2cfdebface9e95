"""Chunked prefill: the same logits, logprobs and routing as one forward, and a short request that
waits at most about one chunk per step behind a long prefill (the model lock is FIFO)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from rl360_ext.reference.engine.engine import EngineConfig, FairLock, TinyEngine
from rl360_ext.reference.engine.model import KVState
from rl360_ext.reference.engine.protocol import GenerateRequest, SamplingParams, decode_routed_experts


def _prompt(engine: TinyEngine, n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, engine.vocab_size, n)]


@pytest.mark.parametrize("chunk", [1, 7, 64, 256, 300])
def test_chunked_forward_equals_one_forward(chunk: int) -> None:
    engine = TinyEngine(EngineConfig(seed=3))
    tokens = np.asarray(_prompt(engine, 700, seed=1))
    whole_kv = KVState.empty(engine.model_config, 700)
    whole = engine.model.forward(tokens, whole_kv, logits_for="all")
    kv = KVState.empty(engine.model_config, 16)
    logits, routing = [], []
    for start in range(0, len(tokens), chunk):
        out = engine.model.forward(tokens[start : start + chunk], kv, logits_for="all")
        logits.append(out.logits)
        routing.append(out.routing)
    np.testing.assert_array_equal(np.concatenate(routing), whole.routing)
    np.testing.assert_allclose(np.concatenate(logits), whole.logits, rtol=0, atol=1e-12)
    np.testing.assert_allclose(kv.keys[:, :, :700], whole_kv.keys[:, :, :700], rtol=0, atol=1e-12)


def _full_request(prompt: list[int]) -> GenerateRequest:
    return GenerateRequest(
        list(prompt),
        SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True),
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=3,
        return_routed_experts=True,
    )


def test_chunked_prefill_serves_the_same_response_as_unchunked() -> None:
    responses = {}
    for chunk in (-1, 100, 512):
        engine = TinyEngine(EngineConfig(seed=2, chunked_prefill_size=chunk, kv_capacity=0))
        prompt = _prompt(engine, 1100, seed=4)
        responses[chunk] = engine.generate(_full_request(prompt))
        chunks = engine.counters["prefill_chunks"]
        assert chunks == (1 if chunk == -1 else -(-1099 // chunk)), chunks  # the last token decodes
    reference = responses[-1]
    layers, top_k = 4, 2
    for chunk in (100, 512):
        body = responses[chunk]
        assert body["output_ids"] == reference["output_ids"]
        meta, ref = body["meta_info"], reference["meta_info"]
        np.testing.assert_array_equal(
            decode_routed_experts(meta["routed_experts"], layers, top_k),
            decode_routed_experts(ref["routed_experts"], layers, top_k),
        )
        for key in ("input_token_logprobs", "output_token_logprobs"):
            got = np.array([row[0] if row[0] is not None else 0.0 for row in meta[key]])
            want = np.array([row[0] if row[0] is not None else 0.0 for row in ref[key]])
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        assert [row[1] for row in meta["input_token_logprobs"]] == [r[1] for r in ref["input_token_logprobs"]]


def test_chunked_prefill_with_a_cached_prefix_matches_a_cold_run() -> None:
    engine = TinyEngine(EngineConfig(seed=5, chunked_prefill_size=64))
    cold = TinyEngine(EngineConfig(seed=5, chunked_prefill_size=-1, kv_capacity=0))
    prompt = _prompt(engine, 400, seed=6)
    engine.generate(GenerateRequest(prompt[:300], SamplingParams(max_new_tokens=1, temperature=0.0)))

    def routed() -> GenerateRequest:
        params = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
        return GenerateRequest(list(prompt), params, return_routed_experts=True)

    warm = engine.generate(routed())
    assert warm["meta_info"]["cached_tokens"] >= 256
    reference = cold.generate(routed())
    assert warm["output_ids"] == reference["output_ids"]
    assert warm["meta_info"]["routed_experts"] == reference["meta_info"]["routed_experts"]


def test_fair_lock_hands_over_in_arrival_order() -> None:
    lock = FairLock()
    order: list[int] = []
    lock.acquire()
    threads = []
    for i in range(5):
        thread = threading.Thread(target=lambda i=i: (lock.acquire(), order.append(i), lock.release()))
        thread.start()
        threads.append(thread)
        while len(lock._waiters) < i + 1:  # each one queued before the next starts
            time.sleep(0.001)
    lock.release()
    for thread in threads:
        thread.join(5)
    assert order == [0, 1, 2, 3, 4]
    # the releasing thread cannot take it back while someone waits
    lock.acquire()
    got: list[str] = []
    waiter = threading.Thread(target=lambda: (lock.acquire(), got.append("waiter"), lock.release()))
    waiter.start()
    while not lock._waiters:
        time.sleep(0.001)
    lock.release()
    lock.acquire()
    got.append("releaser")
    lock.release()
    waiter.join(5)
    assert got == ["waiter", "releaser"]


def _short_behind_long(chunk: int, long_tokens: int) -> tuple[int, float, float, bool]:
    """(long-prefill chunks run while the short request was in flight, short latency s, long
    prefill s, whether the long prefill was still running when the short request finished)."""
    engine = TinyEngine(EngineConfig(seed=0, chunked_prefill_size=chunk, kv_capacity=0))
    long_prompt = _prompt(engine, long_tokens, seed=9)
    long_done = threading.Event()
    long_started = time.perf_counter()

    def long_request() -> None:
        engine.generate(GenerateRequest(long_prompt, SamplingParams(max_new_tokens=1, temperature=0.0)))
        long_done.set()

    thread = threading.Thread(target=long_request)
    thread.start()
    while engine.counters["prefill_chunks"] < (2 if chunk > 0 else 0) and not long_done.is_set():
        time.sleep(0.001)
    while chunk <= 0 and not engine._model_lock._held and not long_done.is_set():
        time.sleep(0.001)  # the one-chunk prefill is under way: it holds the model lock
    before = engine.counters["prefill_chunks"]
    started = time.perf_counter()
    engine.generate(GenerateRequest([5, 6], SamplingParams(max_new_tokens=2, temperature=0.0)))
    short_s = time.perf_counter() - started
    during = engine.counters["prefill_chunks"] - before - 1  # minus the short request's own chunk
    still_running = not long_done.is_set()
    thread.join(300)
    return during, short_s, time.perf_counter() - long_started, still_running


def test_short_request_waits_at_most_a_chunk_per_step_behind_a_long_prefill() -> None:
    during, short_s, long_s, still_running = _short_behind_long(chunk=128, long_tokens=4096)
    # the short request takes the model lock twice (its prefill chunk with the cache lookup, one
    # decode forward; sampling and the cache insert have locks of their own): with a FIFO lock the
    # long prefill runs at most one chunk before each.
    assert still_running, "the long prefill ended before the short request: nothing was measured"
    assert during <= 2, during
    assert short_s < long_s / 3, (short_s, long_s)


def test_without_chunking_the_short_request_waits_out_the_whole_prefill() -> None:
    _, short_s, long_s, _ = _short_behind_long(chunk=-1, long_tokens=2048)
    assert short_s > 0.3 * long_s, (short_s, long_s)  # it could only start after the long prefill


def test_abort_is_honoured_between_prefill_chunks() -> None:
    engine = TinyEngine(EngineConfig(seed=0, chunked_prefill_size=128, kv_capacity=0))
    prompt = _prompt(engine, 4096, seed=2)
    result: dict = {}
    thread = threading.Thread(
        target=lambda: result.update(
            engine.generate(GenerateRequest(prompt, SamplingParams(max_new_tokens=4), rid="long"))
        )
    )
    thread.start()
    while engine.counters["prefill_chunks"] < 2:
        time.sleep(0.001)
    assert engine.abort(rid="long", message="stop") == 1
    thread.join(60)
    assert result["meta_info"]["finish_reason"] == {"type": "abort", "message": "stop"}
    assert result["output_ids"] == [] and engine.counters["prefill_chunks"] < 4096 // 128
