"""Phase occupancy: shares of in-flight trajectory-time per phase, and the in-flight timeline."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.rollout.occupancy import PHASES, attempt_intervals, attempt_phases, step_occupancy, timeline

HARBOR = {
    "queue": 1.0,
    "environment_setup": 2.0,
    "agent_setup": 1.0,
    "agent": 10.0,
    "verifier": 6.0,
}


def test_an_attempt_splits_its_agent_time_into_model_and_tools() -> None:
    phases = attempt_phases({**HARBOR, "model": 7.0})
    assert phases == {"queue": 1.0, "sandbox_setup": 3.0, "model": 7.0, "tools": 3.0, "verifier": 6.0}


def test_model_time_never_exceeds_the_agent_phase() -> None:
    assert attempt_phases({**HARBOR, "model": 50.0})["model"] == 10.0
    assert attempt_phases({**HARBOR, "model": 50.0})["tools"] == 0.0


@pytest.mark.parametrize("bad", [None, "3", float("nan"), float("inf"), -2.0, True])
def test_missing_or_bad_timings_count_as_zero(bad: object) -> None:
    phases = attempt_phases({"queue": bad, "verifier": 1.0})
    assert phases["queue"] == 0.0 and phases["verifier"] == 1.0


def test_step_shares_are_time_weighted() -> None:
    shares = step_occupancy([{**HARBOR, "model": 7.0}, {"queue": 20.0}])
    assert shares["occupancy/queue"] == pytest.approx(21.0 / 40.0)
    assert shares["occupancy/model"] == pytest.approx(7.0 / 40.0)


def test_a_step_without_timings_has_no_shares() -> None:
    assert step_occupancy([None, {}]) == {f"occupancy/{p}": None for p in PHASES}


timings = st.fixed_dictionaries(
    {
        key: st.floats(0.0, 100.0)
        for key in ("queue", "environment_setup", "agent_setup", "agent", "verifier", "model")
    }
)


@settings(max_examples=200, deadline=None)
@given(st.lists(timings, min_size=1, max_size=20))
def test_shares_sum_to_one(attempts: list[dict[str, float]]) -> None:
    shares = step_occupancy(attempts)
    values = [v for v in shares.values() if v is not None]
    if values:
        assert math.isclose(sum(values), 1.0, rel_tol=1e-9)
        assert all(0.0 <= v <= 1.0 for v in values)


@settings(max_examples=100, deadline=None)
@given(st.floats(0.0, 1e6), timings)
def test_intervals_tile_the_attempt(started: float, one: dict[str, float]) -> None:
    intervals = attempt_intervals(started, one)
    total = sum(attempt_phases(one).values())
    if intervals:
        assert intervals[0].start == started
        assert all(a.end == b.start for a, b in itertools.pairwise(intervals))
        assert intervals[-1].end == pytest.approx(started + total)


def test_timeline_counts_in_flight_trajectories_by_phase() -> None:
    rows = timeline([(0.0, {"queue": 2.0, "verifier": 2.0}), (1.0, {"queue": 2.0})], points=5)
    assert [row["t"] for row in rows] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert [(row["queue"], row["verifier"]) for row in rows] == [(1, 0), (2, 0), (1, 1), (0, 1), (0, 1)]
    assert timeline([]) == []
