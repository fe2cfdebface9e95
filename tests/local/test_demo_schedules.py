"""The demo's weight schedules (one-step-off, in-flight) and the per-token version figures."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl360_ext.local.demo_plan import (
    IN_FLIGHT,
    ONE_STEP_OFF,
    PUSH,
    START,
    WAIT,
    DemoConfig,
    allowed_weight_versions,
    expected_weight_version,
    in_flight_schedule,
    pushed_version,
    schedule_events,
    version_figures,
    version_mismatches,
    versions_per_rollout,
    weights_per_rollout,
)
from rl360_ext.sglang.versions import UNVERSIONED, VERSIONS_KEY


@given(st.integers(1, 30))
def test_one_step_off_allows_exactly_miles_version(steps: int) -> None:
    for step in range(steps):
        assert allowed_weight_versions(ONE_STEP_OFF, step, steps) == [expected_weight_version(step)]


@given(st.integers(2, 30))
def test_in_flight_pushes_while_the_next_rollout_generates(steps: int) -> None:
    events = in_flight_schedule(steps)
    with pytest.raises(ValueError, match="weights pushed while rollout"):
        weights_per_rollout(events)  # the one-step-off check refuses exactly this
    versions = versions_per_rollout(events)
    assert versions[0] == ["0"]
    for step in range(1, steps):
        # generated on the push before it started, then the push of the previous step's update
        assert versions[step] == [pushed_version(step - 2 if step >= 2 else None), pushed_version(step - 1)]
    in_flight: set[int] = set()
    mid = 0
    for event in events:
        if event.action == START:
            in_flight.add(event.step)  # type: ignore[arg-type]
        elif event.action == WAIT:
            in_flight.discard(event.step)  # type: ignore[arg-type]
        elif event.action == PUSH and in_flight:
            mid += 1
    assert mid == steps - 1  # every push but the last lands mid-rollout


def test_schedule_and_pause_mode_are_checked() -> None:
    assert schedule_events(IN_FLIGHT, 3) == in_flight_schedule(3)
    with pytest.raises(ValueError, match="--schedule"):
        DemoConfig(schedule="sometimes")
    with pytest.raises(ValueError, match="--pause-mode"):
        DemoConfig(pause_mode="abort")
    assert DemoConfig(schedule=IN_FLIGHT, pause_mode="retract").pause_mode == "retract"


def test_version_mismatches_accepts_several_versions() -> None:
    sample = SimpleNamespace(group_index=0, index=1, weight_versions=["1", "2", "3"])
    (problem,) = version_mismatches([sample], ["1", "2"])
    assert "3" in problem and "expected 1,2" in problem
    assert version_mismatches([sample], ["1", "2", "3"]) == []


def _sample(
    token_version: list[int], kv: list[int], loss_mask: list[int], turns: list[dict], firsts: list[int]
):
    arrays = {
        "token_version": token_version,
        "kv_version": kv,
        "routing_source": None,
        "routing_version": None,
        "turn_first_version": firsts,
    }
    return SimpleNamespace(loss_mask=loss_mask, metadata={VERSIONS_KEY: arrays, "merge": {"turns": turns}})


def test_version_figures_from_the_contract_arrays() -> None:
    u = UNVERSIONED
    # prompt of 2, turn 0 outputs on versions 1,2 ; tool token; turn 1 outputs on 2
    one = _sample(
        [u, u, 1, 2, u, 2],
        [1, 1, 2, u, 1, u],  # turn 1's prompt read position 3 (unknown) and 4 (written at 1 < 2)
        [1, 1, 0, 1],
        [{"input_start": 0, "input_tokens": 2}, {"input_start": 4, "input_tokens": 1}],
        [1, 2],
    )
    plain = _sample([u, 3, 3], [3, 3, u], [1, 1], [{"input_start": 0, "input_tokens": 1}], [3])
    figures = version_figures([one, plain, SimpleNamespace(loss_mask=[1], metadata={})], trainer_version=3)
    assert figures["samples"] == 2
    assert figures["token_age_hist"] == {"0": 2, "1": 2, "2": 1, "3": 0, "4+": 0}
    assert figures["token_age_mean"] == pytest.approx((2 + 1 + 1 + 0 + 0) / 5)
    assert figures["token_age_max"] == 2
    assert figures["mixed_version_frac"] == 0.5
    # known context positions: turn 0 of one: [1, 1] vs 1 -> 0 stale; turn 1: [1,1,2,1] vs 2 -> 3
    # stale; plain: [3] vs 3 -> 0
    assert figures["stale_kv_frac"] == pytest.approx(3 / 7)


def test_engine_idle_share() -> None:
    from rl360_ext.local.demo import engine_idle_share

    assert engine_idle_share({"a": 1.0, "b": 2.0}, {"a": 3.0, "b": 2.0}, 4.0) == pytest.approx(0.75)
    assert engine_idle_share({"a": -1.0}, {"a": 3.0}, 4.0) is None  # an engine could not be read
    assert engine_idle_share({}, {}, 4.0) is None
