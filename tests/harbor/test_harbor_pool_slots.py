"""The pool-wide start limiter: slots never break the rolling-start limit, whatever the call times."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.harbor.pool import StartSlots


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@settings(max_examples=300, deadline=None)
@given(
    size=st.integers(1, 6),
    interval=st.floats(0.05, 5.0),
    gaps=st.lists(st.floats(0.0, 3.0), min_size=1, max_size=60),
)
def test_any_window_holds_at_most_size_starts(size: int, interval: float, gaps: list[float]) -> None:
    clock = Clock()
    slots = StartSlots(size, interval, clock)
    starts = []
    for gap in gaps:
        clock.now += gap
        delay = slots.take()
        assert delay >= 0.0
        starts.append(clock.now + delay)
    # in call order (up to the rounding of now + (slot - now), which need not give slot back exactly)
    assert all(later >= earlier - 1e-9 for earlier, later in itertools.pairwise(starts))
    for i in range(len(starts) - size):
        assert starts[i + size] - starts[i] >= interval - 1e-9
    assert slots.taken == len(gaps)


def test_a_burst_is_paced_into_waves() -> None:
    clock = Clock()
    slots = StartSlots(2, 1.0, clock)
    assert [slots.take() for _ in range(6)] == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]


def test_no_wait_when_calls_are_slow_enough() -> None:
    clock = Clock()
    slots = StartSlots(1, 1.0, clock)
    for _ in range(5):
        assert slots.take() == 0.0
        clock.now += 1.0


@pytest.mark.parametrize(("size", "interval"), [(0, 1.0), (1, 0.0), (1, float("nan")), (1, float("inf"))])
def test_bad_limits_are_refused(size: int, interval: float) -> None:
    with pytest.raises(ValueError, match="start-rate"):
        StartSlots(size, interval)
