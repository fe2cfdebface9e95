"""The demo's weight schedules (one-step-off, in-flight) and the per-token version figures."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl360_ext.local.demo.modes import IN_FLIGHT, ONE_STEP_OFF
from rl360_ext.local.demo.plan import DemoConfig
from rl360_ext.local.demo.summary import StepSummary
from rl360_ext.local.demo.versions import (
    PUSH,
    START,
    WAIT,
    allowed_weight_versions,
    expected_weight_version,
    in_flight_schedule,
    pushed_version,
    schedule_events,
    version_mismatches,
    versions_per_rollout,
)
from rl360_ext.sglang.versions import TURN_CACHED_TOKENS, TURN_OUTPUT_START, UNVERSIONED, VERSIONS_KEY
from rl360_ext.train.staleness import sample_staleness_metrics


@given(st.integers(1, 30))
def test_one_step_off_allows_exactly_miles_version(steps: int) -> None:
    for step in range(steps):
        assert allowed_weight_versions(ONE_STEP_OFF, step, steps) == [expected_weight_version(step)]


@given(st.integers(2, 30))
def test_in_flight_pushes_while_the_next_rollout_generates(steps: int) -> None:
    events = in_flight_schedule(steps)
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
    token_version: list[int], kv: list[int], loss_mask: list[int], starts: list[int], firsts: list[int]
):
    arrays = {
        "token_version": token_version,
        "kv_version": kv,
        "routing_source": None,
        "routing_version": None,
        "turn_first_version": firsts,
        TURN_OUTPUT_START: starts,
        TURN_CACHED_TOKENS: [0] * len(starts),
    }
    n = len(token_version)
    return SimpleNamespace(
        tokens=[0] * n, response_length=len(loss_mask), loss_mask=loss_mask, metadata={VERSIONS_KEY: arrays}
    )


def _summary(step: int, versions: dict[str, float] | None) -> StepSummary:
    return StepSummary(step, 4, 4, {}, 1, 1, 0.5, 0.5, "1", ["1"], versions=versions)


def test_step_figures_are_the_trainers_staleness_metrics_pooled_over_steps() -> None:
    from rl360_ext.local.demo.console import version_metrics, versions_line
    from rl360_ext.local.demo.run import DemoResult
    from rl360_ext.local.demo.schedules import schedule_figures

    u = UNVERSIONED
    # prompt of 2, turn 0 outputs on versions 1,2 ; tool token; turn 1 outputs on 2
    one = _sample([u, u, 1, 2, u, 2], [1, 1, 2, u, 1, u], [1, 1, 0, 1], [2, 5], [1, 2])
    plain = _sample([u, 3, 3], [3, 3, u], [1, 1], [1], [3])
    step0 = version_metrics({"train/loss": 1.0, **sample_staleness_metrics([one], 3)})
    step1 = version_metrics(sample_staleness_metrics([plain], 3))
    assert "train/loss" not in step0 and step0["staleness/mixed_version_frac"] == 1.0
    assert "token age [0:0% 1:67% 2:33% 3:0% 4+:0%]" in versions_line(0, step0)
    assert "no trained token carries a version" in versions_line(2, {})
    result = DemoResult(
        Path("out"), [_summary(0, step0), _summary(1, step1), _summary(2, {})], [], 1.0, Path("m"), Path("r")
    )
    figures = schedule_figures(result)
    assert figures["token_age_hist"] == {"0": 2, "1": 2, "2": 1, "3": 0, "4+": 0}  # tokens, not shares
    assert figures["token_age_mean"] == pytest.approx((2 + 1 + 1 + 0 + 0) / 5)
    assert figures["mixed_version_frac"] == pytest.approx(0.5)  # per step: 1.0, 0.0
    pooled = sample_staleness_metrics([one, plain], 3)["kv/stale_prefix_tokens_frac"]
    assert figures["stale_kv_frac"] == pytest.approx(pooled)  # weighted by each step's context tokens
    assert figures["pushes_mid_rollout"] == 0


def test_engine_idle_share() -> None:
    from rl360_ext.local.demo.run import engine_idle_share

    assert engine_idle_share({"a": 1.0, "b": 2.0}, {"a": 3.0, "b": 2.0}, 4.0) == pytest.approx(0.75)
    assert engine_idle_share({"a": -1.0}, {"a": 3.0}, 4.0) is None  # an engine could not be read
    assert engine_idle_share({}, {}, 4.0) is None
