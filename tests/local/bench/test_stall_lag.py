"""The stall case reads the server's loop-lag histogram per phase: wake-ups, p99 bucket, late ones."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rl360_ext.local.bench.stall import LATE_TICK_S, _lag_summary
from rl360_ext.util.loop_lag import LOOP_LAG_BUCKETS

BOUNDS = (*LOOP_LAG_BUCKETS, float("inf"))


def _cumulative(counts: list[int]) -> dict[float, float]:
    total, out = 0, {}
    for bound, n in zip(BOUNDS, counts, strict=True):
        total += n
        out[bound] = float(total)
    return out


@given(
    before=st.lists(st.integers(0, 50), min_size=len(BOUNDS), max_size=len(BOUNDS)),
    during=st.lists(st.integers(0, 50), min_size=len(BOUNDS), max_size=len(BOUNDS)),
)
def test_the_phase_is_the_difference_of_two_readings(before, during) -> None:
    after = _cumulative([a + b for a, b in zip(before, during, strict=True)])
    ticks, p99_ms, late = _lag_summary(_cumulative(before), after)
    phase = list(zip(BOUNDS, during, strict=True))
    assert ticks == sum(during)
    assert late == sum(n for bound, n in phase if bound > LATE_TICK_S)
    if ticks:
        below = sum(n for bound, n in phase if 1000 * bound < p99_ms)
        within = sum(n for bound, n in phase if 1000 * bound <= p99_ms)
        assert below < 0.99 * ticks <= within  # the first bucket that holds 99% of the wake-ups
    else:
        assert p99_ms == 0.0
