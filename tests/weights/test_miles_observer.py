"""The Miles weight-push observer's pure parts: the guard on Miles' updater classes, and the
records of pushes through a duck-typed updater (fake engines; versions read from a dict, no Ray).

The observer on Miles' own updater class and engines on Ray: integration_tests/miles/test_weight_observer.py.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from rl360_ext.weights import miles_observer as observer
from rl360_ext.weights.miles_observer import MilesPush, UpdaterSpec, check_updater, observe, resolve
from rl360_ext.weights.push import (
    FANOUT_PATH,
    FIRST,
    NEW_ENGINES,
    RETRY,
    STALE,
    STEADY,
    FencedPush,
    WeightPush,
)

SPEC = UpdaterSpec(
    "fake",
    "FakeUpdater",
    "miles:fake",
    "_transfer",
    ("_pause_and_prepare_engines", "_finalize_and_resume_engines"),
)


@dataclass(frozen=True)
class _ActorId:
    value: str

    def hex(self) -> str:
        return self.value


class FakeEngine:
    def __init__(self, name: str) -> None:
        self._actor_id = _ActorId(name)


class FakeUpdater:
    """Miles' updater surface (mixin.py's update_weights order: pause, buckets, resume)."""

    def __init__(self, engines: list[FakeEngine], served: dict[str, str | None]) -> None:
        self.rollout_engines = engines
        self.weight_version = 0
        self.buckets = 2
        self.fail = False
        self.served = served

    def is_rollout_engines_fresh(self) -> bool:
        return True

    def mark_engine_connection_stale(self) -> None:
        pass

    def connect_rollout_engines(
        self, rollout_engines: list[FakeEngine], rollout_engine_lock: Any = None
    ) -> None:
        self.rollout_engines = rollout_engines

    def pop_metrics(self) -> dict[str, Any]:
        return self.__dict__.pop("update_weight_metrics", {})

    def _pause_and_prepare_engines(self) -> None:
        pass

    def _transfer(self) -> None:
        if self.fail:
            raise RuntimeError("engine died mid-push")

    def _finalize_and_resume_engines(self) -> None:
        for engine in self.rollout_engines:
            self.served[engine._actor_id.hex()] = str(self.weight_version)

    def update_weights(self) -> None:
        self.weight_version += 1
        self._pause_and_prepare_engines()
        for _ in range(self.buckets):
            self._transfer()
        self._finalize_and_resume_engines()


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str | None]]:
    """Each fake engine's served version, as `read_versions` reads it back; this rank logs."""
    versions: dict[str, str | None] = {}

    def read(engines: list[FakeEngine], timeout_s: float = 0.0) -> dict[str, str | None]:
        return {observer.engine_id(e): versions.get(observer.engine_id(e)) for e in engines}

    monkeypatch.setattr(observer, "read_versions", read)
    monkeypatch.setattr(observer, "is_logging_rank", lambda: True)
    observer.PUSHES.clear()
    yield versions
    observer.PUSHES.clear()


@pytest.fixture
def updater_cls() -> type[FakeUpdater]:
    cls = type("FakeUpdater", (FakeUpdater,), {})  # a fresh class per test: observe() wraps it in place
    observe(cls, SPEC)
    return cls


def test_check_updater_names_each_mismatch() -> None:
    assert check_updater(FakeUpdater, SPEC) == []

    class Renamed(FakeUpdater):
        def connect_rollout_engines(self, engines: list[FakeEngine], lock: Any = None) -> None:  # type: ignore[override]
            pass

    Renamed.pop_metrics = None  # type: ignore[assignment,method-assign]
    problems = check_updater(Renamed, SPEC)
    assert problems == [
        "FakeUpdater.pop_metrics is missing",
        "FakeUpdater.connect_rollout_engines['self', 'engines', 'lock']: rollout_engines is not first",
    ]


def test_resolve_skips_a_missing_dependency_and_flags_a_missing_miles_module() -> None:
    third_party = UpdaterSpec("rl360_no_such_dependency", "X", "miles:x", "t", None)
    miles_module = UpdaterSpec("miles.rl360_no_such_module", "X", "miles:x", "t", None)
    found, problems = resolve([third_party, miles_module])
    assert found == []
    assert len(problems) == 1 and problems[0].startswith("miles.rl360_no_such_module does not import")


def test_install_without_the_expected_miles_warns_once_and_installs_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(observer, "resolve", lambda: ([(SPEC, FakeUpdater)], ["X.update_weights is missing"]))
    with caplog.at_level(logging.INFO, logger=observer.__name__):
        assert observer.install(None) is False
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert (
        "NOT installed" in warnings[0].getMessage()
        and "X.update_weights is missing" in warnings[0].getMessage()
    )
    assert observer.TESTED_MILES_COMMIT[:12] in warnings[0].getMessage()
    assert not getattr(FakeUpdater.__dict__["update_weights"], "__rl360_observed__", False)


def test_observed_keys_are_rl360s_own_push_metrics() -> None:
    push = WeightPush(FANOUT_PATH, "1", "/ckpt", 1.0, 1, 1, {"a": 1}, {"a": 3}, {"a": "1"})
    own = FencedPush("1", FIRST, ["a"], [push], [], 1.0).metrics()
    observed = MilesPush("miles:broadcast", FIRST, "1", [], [], 0, None, 0.0, False).metrics()
    assert set(observed) <= set(own)
    assert {k: type(v) for k, v in observed.items() if v is not None} == {
        k: type(own[k]) for k, v in observed.items() if v is not None
    }


def test_pushes_record_reasons_engines_calls_and_pause(
    updater_cls: type[FakeUpdater], served: dict[str, str | None]
) -> None:
    a, b, c = FakeEngine("a"), FakeEngine("b"), FakeEngine("c")
    updater = updater_cls([a, b], served)

    updater.update_weights()
    first = updater.pop_metrics()
    assert first["weights/path/miles:fake"] == 1.0
    assert first[f"weights/reason/{FIRST}"] == 1.0
    assert (first["weights/engines_expected"], first["weights/engines_reached"]) == (2, 2)
    assert first["weights/calls_per_engine_max"] == 2
    assert 0 <= first["weights/pause_s"] <= first["weights/duration_s"]
    assert first["weights/degraded"] == 0.0

    updater.update_weights()
    steady = updater.pop_metrics()
    assert steady[f"weights/reason/{STEADY}"] == 1.0
    # Miles' trackers take scalars (tensorboard's add_scalar per key): no string, no None
    assert all(type(value) in (int, float) for value in (*first.values(), *steady.values())), first

    updater.connect_rollout_engines([c, b])  # a was killed, c replaces it
    updater.update_weights()
    assert updater.pop_metrics()[f"weights/reason/{NEW_ENGINES}"] == 1.0
    assert observer.PUSHES[-1].engines_reached == ["b", "c"]
    assert observer.PUSHES[-1].engines_expected == ["b", "c"]

    served["b"] = None  # b restarted in place: it serves its initial weights
    updater.update_weights()
    assert updater.pop_metrics()[f"weights/reason/{STALE}"] == 1.0
    assert [p.reason for p in observer.PUSHES] == [FIRST, STEADY, NEW_ENGINES, STALE]


def test_a_failed_push_is_recorded_not_logged_and_the_next_is_a_retry(
    updater_cls: type[FakeUpdater], served: dict[str, str | None]
) -> None:
    updater = updater_cls([FakeEngine("a"), FakeEngine("b")], served)
    updater.update_weights()
    updater.pop_metrics()

    updater.fail = True
    with pytest.raises(RuntimeError, match="engine died"):
        updater.update_weights()
    assert updater.pop_metrics() == {}
    failed = observer.PUSHES[-1]
    assert failed.error == "RuntimeError: engine died mid-push" and failed.engines_reached == []

    updater.fail = False
    updater.update_weights()
    retried = updater.pop_metrics()
    assert retried[f"weights/reason/{RETRY}"] == 1.0 and retried["weights/engines_reached"] == 2


def test_degraded_when_calls_per_engine_jump(
    updater_cls: type[FakeUpdater], served: dict[str, str | None]
) -> None:
    updater = updater_cls([FakeEngine("a")], served)
    for _ in range(3):
        updater.update_weights()
    updater.buckets = 10
    updater.update_weights()
    assert [p.degraded for p in observer.PUSHES] == [False, False, False, True]
    assert observer.PUSHES[-1].calls_per_engine_max == 10


def test_a_call_that_does_not_advance_the_version_is_not_a_push(served: dict[str, str | None]) -> None:
    """Disk-delta's first `update_weights` only captures its baseline (delta.py:107-113)."""
    baseline_cls = type("Baseline", (FakeUpdater,), {"update_weights": lambda self: None})
    observe(baseline_cls, SPEC)
    updater = baseline_cls([FakeEngine("a")], served)
    updater.update_weights()
    assert updater.pop_metrics() == {} and list(observer.PUSHES) == []


def test_observe_twice_wraps_once_and_other_ranks_record_nothing(
    updater_cls: type[FakeUpdater], served: dict[str, str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    wrapped = updater_cls.__dict__["update_weights"]
    observe(updater_cls, SPEC)
    assert updater_cls.__dict__["update_weights"] is wrapped

    monkeypatch.setattr(observer, "is_logging_rank", lambda: False)
    updater = updater_cls([FakeEngine("a")], served)
    updater.update_weights()
    assert updater.pop_metrics() == {} and list(observer.PUSHES) == []
