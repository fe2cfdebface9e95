"""The pure decisions of a push under churn: reason codes, the degraded flag, which engines missed
a call, and the fence-and-retry loop (against a scripted gateway, no processes)."""

from __future__ import annotations

import statistics
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl360_ext.weights import push as push_module
from rl360_ext.weights.push import (
    FANOUT_PATH,
    FIRST,
    NEW_ENGINES,
    RETRY,
    STALE,
    STEADY,
    WeightPush,
    is_degraded,
    missed_engines,
    push_reason,
    push_with_fencing,
    update_body,
)

A, B, C = "http://a", "http://b", "http://c"


def test_reason_codes() -> None:
    versions = {A: "3", B: "3"}
    assert push_reason(0, None, [A, B], versions, None) == FIRST
    assert push_reason(0, [A], [A, B], versions, "3") == NEW_ENGINES
    assert push_reason(0, [A, B], [A, B], {A: "3", B: None}, "3") == STALE
    assert push_reason(0, [A, B], [A, B], versions, "3") == STEADY
    assert push_reason(0, [A, B, C], [A, B], versions, "3") == STEADY  # an engine left: nothing to catch up
    assert push_reason(1, [A, B], [A, B], versions, "3") == RETRY


def test_update_body_never_aborts_requests() -> None:
    assert update_body("/w", "4", False) == {
        "model_path": "/w",
        "weight_version": "4",
        "flush_cache": False,
        "abort_all_requests": False,
    }


def test_degraded_over_twice_the_rolling_median() -> None:
    assert not is_degraded(1432, [])  # a path's first push has no median to compare with
    assert not is_degraded(2, [1, 1, 1])
    assert is_degraded(3, [1, 1, 1])
    assert is_degraded(1432, [41] * 8)
    assert not is_degraded(5, [1] * 8 + [100] * 3, window=3)  # only the last `window` pushes count


@given(
    st.lists(st.integers(1, 2000), min_size=1, max_size=20),
    st.integers(1, 5000),
    st.integers(1, 10),
)
def test_degraded_matches_its_definition(history: list[int], calls: int, window: int) -> None:
    median = statistics.median(history[-window:])
    assert is_degraded(calls, history, window) == (calls > 2 * median)


def report(ok: list[str], timed_out: list[str] = (), refused: list[str] = ()) -> dict[str, Any]:
    return {
        "results": {url: {"url": url, "status": 200} for url in ok},
        "failed": [{"url": url, "error": "upstream_timeout"} for url in timed_out]
        + [{"url": url, "status": 400, "error": "bad"} for url in refused],
        "total": len(ok) + len(timed_out) + len(refused),
    }


def test_missed_are_the_silent_engines_not_the_ones_that_refused() -> None:
    reports = [report([A], timed_out=[B], refused=[C]), report([A, C])]
    assert missed_engines([A, B, C], reports) == [B]
    assert missed_engines([A, B, C, "http://absent"], [report([A, B, C])]) == ["http://absent"]


class ScriptedGateway:
    """Stands in for the gateway and the engines: `hung` engines miss every call until fenced."""

    def __init__(self, workers: list[str], hung: set[str]) -> None:
        self.workers = list(workers)
        self.hung = set(hung)
        self.calls: list[tuple[str, list[str]]] = []
        self.fenced: list[str] = []

    def gateway_workers(self, gateway_url: str, timeout_s: float = 10.0) -> dict[str, str]:
        return {url: f"id-{url}" for url in self.workers}

    def engine_versions(self, urls: list[str], timeout_s: float = 10.0) -> dict[str, str | None]:
        return {url: None if url in self.hung else "1" for url in urls}

    def push(self, gateway_url: str, model_path: str, version: str, **kw: Any) -> WeightPush:
        expected = kw["expected"]
        self.calls.append((version, list(expected)))
        silent = [url for url in expected if url in self.hung]
        live = [url for url in self.workers if url not in self.hung]
        return WeightPush(
            path=FANOUT_PATH,
            weight_version=version,
            model_path=model_path,
            duration_s=0.1,
            engines_targeted=len(expected),
            engines_reached=0 if silent else len(live),
            update_calls_per_engine={} if silent else {url: 1 for url in live},
            control_calls_per_engine={url: 1 if silent else 3 for url in live},
            engine_versions={url: version for url in live},
            pause_s=None if silent else 0.05,
            missed=silent,
        )

    def fence(self, url: str) -> None:
        self.fenced.append(url)
        self.workers.remove(url)
        self.hung.discard(url)


@pytest.fixture
def gateway(monkeypatch: pytest.MonkeyPatch) -> ScriptedGateway:
    fake = ScriptedGateway([A, B, C], hung={B})
    monkeypatch.setattr(push_module, "gateway_workers", fake.gateway_workers)
    monkeypatch.setattr(push_module, "engine_versions", fake.engine_versions)
    monkeypatch.setattr(push_module, "push_weights_from_disk", fake.push)
    resumed: list[str] = []
    monkeypatch.setattr(push_module, "_fanout", lambda client, path, body, selector: resumed.append(path))
    fake.resumed = resumed  # type: ignore[attr-defined]
    return fake


def test_a_hung_engine_is_fenced_and_the_retry_reaches_every_live_engine(gateway: ScriptedGateway) -> None:
    push = push_with_fencing(
        "http://gw", "/w", "2", fence=gateway.fence, previous_engines=[A, B, C], published="1"
    )
    assert gateway.fenced == [B]
    assert gateway.calls == [("2", [A, B, C]), ("2", [A, C])]  # the retry plans on the refreshed set
    assert push.reasons == [STALE, RETRY] and push.reason == STALE
    assert push.complete and push.engines_reached == [A, C]
    metrics = push.metrics()
    assert metrics["weights/engines_expected"] == metrics["weights/engines_reached"] == 2
    assert metrics["weights/engines_fenced"] == 1 and metrics["weights/attempts"] == 2
    assert metrics["weights/calls_per_engine_max"] == 1  # the fenced attempt updated nothing
    assert metrics["weights/path"] == FANOUT_PATH
    assert metrics["weights/pause_s"] >= 0.05  # from the first pause (the fenced attempt) to the resume
    assert gateway.resumed == []  # the last attempt resumed the engines itself


def test_retries_are_bounded_and_the_engines_are_resumed(gateway: ScriptedGateway) -> None:
    def fence_and_hang_another(url: str) -> None:  # churn that never settles
        gateway.fence(url)
        fresh = f"http://n{len(gateway.fenced)}"
        gateway.workers.append(fresh)
        gateway.hung.add(fresh)

    push = push_with_fencing("http://gw", "/w", "2", fence=fence_and_hang_another, max_retries=2)
    assert len(push.attempts) == 3 and push.reasons == [FIRST, RETRY, RETRY]
    assert not push.complete
    assert gateway.resumed == ["continue_generation"]  # never left paused
