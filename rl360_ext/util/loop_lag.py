"""Event-loop lag: how late a server's event loop runs a callback that was due.

Owns `watch_loop_lag`, a task that sleeps LOOP_LAG_TICK_S again and again and reports by how much
each wake-up came late. Anything that holds the loop (a parse, a hash, a tokenization, a lock on
the GIL) shows as lag in proportion to how long it held it; work that runs elsewhere (a thread that
releases the GIL, another process) shows only through the CPU it takes. It is the measure of "no
request stalls the loop" that a client's latencies cannot give on a busy machine, where they also
count the client's own scheduling and every process's share of the CPU.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

LOOP_LAG_TICK_S = 0.01  # the watcher's sleep: 100 wake-ups a second, each a few microseconds
LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 30.0)


async def watch_loop_lag(observe: Callable[[float], None], tick_s: float = LOOP_LAG_TICK_S) -> None:
    """Forever: sleep `tick_s`, then `observe` how many seconds past its due time the loop woke it."""
    if tick_s <= 0:
        raise ValueError(f"tick_s: must be > 0, got {tick_s}")
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + tick_s
        await asyncio.sleep(tick_s)
        observe(max(0.0, loop.time() - due))
