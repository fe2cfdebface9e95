"""A real `rl360 engine serve`: a 2-token request sent during a long prefill waits about one chunk,
not the whole prefill (chunked prefill on), against the same engine with chunking off; what it
waited for is counted in the engine's prefill chunks, not timed."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from rl360_ext.local.services import start_engine
from rl360_ext.util.procs import running

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LONG_PROMPT = 8192
VOCAB = 580


def _short_latency_behind_long_prefill(log_dir: Path, chunk: int) -> tuple[float, float, int, bool]:
    """(seconds the short request took, seconds the long request took, prefill chunks the engine ran
    while the short request waited (its own included), whether the long request was still running
    when the short one was answered)."""
    flags = ("--chunked-prefill-size", str(chunk), "--kv-capacity", "0")
    engine = start_engine(log_dir, *flags, name=f"chunk{chunk}")
    with running(engine):
        long_ids = [int(t) for t in np.random.default_rng(0).integers(3, VOCAB, LONG_PROMPT)]
        long_body = {"input_ids": long_ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        timings: dict[str, float] = {}

        def long_request() -> None:
            started = time.perf_counter()
            httpx.post(engine.url + "/generate", json=long_body, timeout=600).raise_for_status()
            timings["long"] = time.perf_counter() - started

        idle_busy_s = _state(engine.url)["model_busy_s"]
        thread = threading.Thread(target=long_request)
        thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until the long prefill holds the model
            state = _state(engine.url)
            if chunk > 0 and state["prefill_chunks"] >= 2:
                break  # two of its chunks ran: it is prefilling
            if chunk <= 0 and state["model_busy_s"] > idle_busy_s and state["prefill_chunks"] == 0:
                break  # its one chunk holds the model and has not ended
            time.sleep(0.01)
        short = {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
        chunks_before = _prefill_chunks(engine.url)
        started = time.perf_counter()
        httpx.post(engine.url + "/generate", json=short, timeout=600).raise_for_status()
        short_s = time.perf_counter() - started
        long_running = thread.is_alive()
        chunks_during = _prefill_chunks(engine.url) - chunks_before
        thread.join(600)
        return short_s, timings["long"], chunks_during, long_running


def _state(url: str) -> dict[str, Any]:
    return httpx.get(url + "/server_info", timeout=10).json()["internal_states"][0]


def _prefill_chunks(url: str) -> int:
    return int(_state(url)["prefill_chunks"])


def test_short_request_is_not_stuck_behind_a_long_prefill(tmp_path: Path) -> None:
    chunked_short, chunked_long, chunks, long_running = _short_latency_behind_long_prefill(tmp_path, 512)
    whole_short, whole_long, whole_chunks, _ = _short_latency_behind_long_prefill(tmp_path, -1)
    print(
        f"\n{LONG_PROMPT}-token prefill: a 2-token request took {chunked_short:.2f} s with 512-token chunks "
        f"(prefill {chunked_long:.1f} s, {chunks} chunks ran meanwhile), {whole_short:.2f} s unchunked "
        f"(prefill {whole_long:.1f} s)"
    )
    # What the short request waited for, counted, not timed (a busy machine moves times, not counts):
    # its own prefill and at most 4 of the 16 chunks the long prompt needs (a quarter), and the
    # long request was still prefilling when it was answered; unchunked, it waited for the long
    # prompt's one chunk, all 8192 tokens of it, to end.
    assert chunks <= 5 and long_running, (chunks, long_running)
    assert whole_chunks == 2, whole_chunks  # the long prompt's one chunk, then its own
    assert (chunks - 1) * 512 < (whole_chunks - 1) * LONG_PROMPT
