"""The loop-lag watcher reports a callback that held the loop, and only while it runs."""

from __future__ import annotations

import asyncio
import time

import pytest

from rl360_ext.util.loop_lag import watch_loop_lag


async def _watched(hold_s: float) -> list[float]:
    seen: list[float] = []
    watcher = asyncio.create_task(watch_loop_lag(seen.append, tick_s=0.005))
    while not seen:  # the watcher is running
        await asyncio.sleep(0.001)
    time.sleep(hold_s)  # a callback that holds the loop
    count = len(seen)
    while len(seen) == count:  # the next wake-up after the hold
        await asyncio.sleep(0.001)
    watcher.cancel()
    return seen


def test_a_callback_that_holds_the_loop_shows_as_lag_at_least_as_long() -> None:
    seen = asyncio.run(_watched(0.08))
    assert max(seen) >= 0.08 - 0.005  # the hold, less at most the tick it started within
    assert all(lag >= 0 for lag in seen)


def test_a_tick_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="tick_s"):
        asyncio.run(watch_loop_lag(lambda _: None, tick_s=0))
