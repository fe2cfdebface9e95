"""In-flight weight updates: `weight_versions` spans by SGLang's rules, and what each mode keeps.

The reference below restates SGLang's bookkeeping (scheduler.record_weight_version_change ->
utils/weight_versions.py): an update to a new label records (old label, output tokens so far) for
every live request that has output; the spans fold those events with (current label, total).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl360_ext.reference.engine.engine import EngineConfig, TinyEngine
from rl360_ext.reference.engine.model import init_weights, perturb_weights, save_weights
from rl360_ext.reference.engine.protocol import GenerateRequest, SamplingParams
from rl360_ext.reference.engine.response import _version_spans


def sglang_spans(updates: list[tuple[int, str]], first: str, total: int) -> list[dict[str, Any]]:
    """SGLang's spans for one request: `updates` are (output tokens at the update, new label)."""
    events: list[tuple[str, int]] = []
    current = first
    for at, label in updates:
        if label == current:
            continue  # record_weight_version_change ignores an unchanged label
        if at > 0:
            events.append((current, at))  # only requests with output record an event
        current = label
    spans: list[dict[str, Any]] = []
    for label, end in [*events, (current, total)]:
        end = min(end, total)
        if spans and end <= spans[-1]["end"]:
            continue
        if spans and spans[-1]["version"] == label:
            spans[-1]["end"] = end
            continue
        spans.append({"version": label, "start": spans[-1]["end"] if spans else 0, "end": end})
    return spans


@st.composite
def update_plans(draw: st.DrawFn) -> tuple[int, list[tuple[int, str]]]:
    total = draw(st.integers(0, 30))
    points = sorted(draw(st.lists(st.integers(0, total), max_size=5)))
    labels = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=len(points), max_size=len(points)))
    return total, list(zip(points, labels, strict=True))


@given(update_plans())
def test_per_token_labels_give_sglangs_spans(plan: tuple[int, list[tuple[int, str]]]) -> None:
    """The engine labels each token with the version it was sampled under; run-length spans of
    those labels are exactly SGLang's event-folded spans, for any update times and labels."""
    total, updates = plan
    labels: list[str] = []
    current = "a"
    pending = list(updates)
    for index in range(total):
        while pending and pending[0][0] <= index:
            current = pending.pop(0)[1]
        labels.append(current)
    for _, label in pending:
        current = label
    assert _version_spans(labels, current) == sglang_spans(updates, "a", total)


class _Background:
    def __init__(self, engine: TinyEngine, request: GenerateRequest) -> None:
        self.engine, self.result, self.error = engine, None, None
        self.thread = threading.Thread(target=self._run, args=(request,), daemon=True)
        self.thread.start()

    def _run(self, request: GenerateRequest) -> None:
        try:
            self.result = self.engine.generate(request)
        except Exception as err:  # surfaced through join()
            self.error = err

    def join(self) -> dict[str, Any]:
        self.thread.join(timeout=60)
        assert self.error is None and self.result is not None
        return self.result


def _wait(predicate: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "engine state never matched"
        time.sleep(0.002)


@pytest.fixture(scope="module")
def weight_files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    engine = TinyEngine(EngineConfig(seed=0, layers=1))
    base = init_weights(engine.model_config, 0)
    out = tmp_path_factory.mktemp("weights")
    return [
        str(save_weights(out / f"w{i}.npz", engine.model_config, perturb_weights(base, 0.3, i)))
        for i in range(1, 4)
    ]


PROMPT = list(range(5, 30))
MAX_NEW = 40
STEP_S = 0.003  # each forward sleeps this long, so a pause lands well before the request ends


def _slow_engine() -> TinyEngine:
    engine = TinyEngine(EngineConfig(seed=0, layers=1))
    forward = engine.model.forward

    def slow_forward(*args: Any, **kwargs: Any) -> Any:
        time.sleep(STEP_S)
        return forward(*args, **kwargs)

    engine.model.forward = slow_forward  # type: ignore[method-assign]
    return engine


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    points=st.lists(st.integers(0, MAX_NEW // 2), min_size=1, max_size=2, unique=True).map(sorted),
    mode=st.sampled_from(["in_place", "retract"]),
)
def test_updates_within_a_request(weight_files: list[str], points: list[int], mode: str) -> None:
    """Pause (mode) at chosen output counts, update, continue: spans split exactly where the pauses
    held the request, `num_retractions` counts retract pauses, and every token's logprob is that of
    the weights its span names: before the first update the old weights' over the whole sequence;
    after a retract (KV recomputed at the new version) the new weights' over the whole sequence."""
    engine = _slow_engine()
    request = GenerateRequest(
        PROMPT,
        SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True, temperature=0),
        rid="r",
        return_logprob=True,
    )
    job: _Background | None = None
    held: list[int] = []
    for number, point in enumerate(points, start=1):
        if job is None and point == 0:
            engine.pause(mode)  # before the request is admitted: all of it runs on the new weights
            job = _Background(engine, request)
            _wait(lambda: any(s["waiting"] for s in engine.inflight()))
        else:
            if job is None:
                job = _Background(engine, request)
            _wait(lambda p=point: any(s["output_tokens"] >= p for s in engine.inflight()))
            engine.pause(mode)
            _wait(lambda: all(s["waiting"] for s in engine.inflight()))
        (status,) = engine.inflight()  # still in flight: the pause held it
        held.append(status["output_tokens"])
        flush = mode == "retract"
        success, _ = engine.update_weights_from_disk(weight_files[number - 1], f"v{number}", flush)
        assert success
        engine.resume()
    assert job is not None
    meta = job.join()["meta_info"]
    output = job.result["output_ids"]  # type: ignore[index]
    assert len(output) == MAX_NEW
    updates = [(at, f"v{n}") for n, at in enumerate(held, start=1)]
    assert meta["weight_versions"] == sglang_spans(updates, "default", MAX_NEW)
    assert meta["weight_version"] == f"v{len(points)}"
    # a retract pause takes KV from a request that stepped since it last had its KV recomputed
    # (one still waiting from the previous pause holds none, as SGLang retracts only running ones)
    stepped = [at > before for at, before in zip(held, [0, *held[:-1]], strict=True)]
    retracted = sum(stepped) if mode == "retract" else 0
    assert meta["num_retractions"] == retracted
    sequence = PROMPT + output
    logprobs = np.array([lp for lp, _, _ in meta["output_token_logprobs"]])
    first = meta["weight_versions"][0]
    if first["version"] == "default":
        fresh = TinyEngine(EngineConfig(seed=0, layers=1)).model.sequence_logprobs(sequence)
        span = slice(first["start"], first["end"])
        np.testing.assert_allclose(logprobs[span], fresh[len(PROMPT) - 1 :][span], rtol=1e-4, atol=1e-4)
    last = meta["weight_versions"][-1]
    if mode == "retract":
        final = engine.model.sequence_logprobs(sequence)[len(PROMPT) - 1 :]
        span = slice(last["start"], last["end"])
        np.testing.assert_allclose(logprobs[span], final[span], rtol=1e-4, atol=1e-4)


def test_in_place_flush_is_refused_while_requests_hold_kv(weight_files: list[str]) -> None:
    """SGLang: under an in_place pause the update lands but the flush is refused (the call fails)."""
    engine = _slow_engine()  # the request is still running when the wait looks, however busy the machine
    job = _Background(engine, GenerateRequest(PROMPT, SamplingParams(max_new_tokens=200, ignore_eos=True)))
    _wait(lambda: any(s["output_tokens"] >= 2 for s in engine.inflight()))
    engine.pause("in_place")
    _wait(lambda: all(s["waiting"] for s in engine.inflight()))
    success, message = engine.update_weights_from_disk(weight_files[0], "v1", flush_cache=True)
    assert not success and "not flushed" in message
    assert engine.weight_version == "v1" and engine.flush_cache() is False
    engine.resume()
    assert job.join()["meta_info"]["weight_version"] == "v1"
    assert engine.flush_cache() is True


def test_unpaused_update_waits_for_in_flight_requests(weight_files: list[str]) -> None:
    """SGLang's model_update_lock: an update without a pause lands after the running requests."""
    engine = _slow_engine()  # the request is still running when the wait looks, however busy the machine
    job = _Background(engine, GenerateRequest(PROMPT, SamplingParams(max_new_tokens=60, ignore_eos=True)))
    _wait(lambda: any(s["output_tokens"] >= 1 for s in engine.inflight()))
    assert engine.update_weights_from_disk(weight_files[0], "v1", flush_cache=True)[0]
    meta = job.join()["meta_info"]
    assert meta["weight_versions"] == [{"version": "default", "start": 0, "end": 60}]
    assert engine.weight_version == "v1"


def test_model_busy_seconds_grow_with_model_steps() -> None:
    """`server_info` internal_states[0].model_busy_s: time spent in model steps (the demo's idle share)."""
    engine = _slow_engine()
    before = engine.server_info()["internal_states"][0]["model_busy_s"]
    engine.generate(GenerateRequest(PROMPT, SamplingParams(max_new_tokens=10, ignore_eos=True)))
    after = engine.server_info()["internal_states"][0]["model_busy_s"]
    assert after - before >= 10 * STEP_S  # a prefill and 9 decode steps, each sleeping STEP_S
