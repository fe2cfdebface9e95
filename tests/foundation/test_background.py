"""Background work runs at the lowest CPU priority, in the threads of its own pool only."""

from __future__ import annotations

import os
import threading

from rl360_ext.util.background import LOWEST_PRIORITY, background_executor


def _priority() -> tuple[int, str]:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), threading.current_thread().name


def test_its_threads_run_at_the_lowest_priority_and_the_callers_do_not() -> None:
    mine = _priority()[0]
    with background_executor("rl360-test-background", workers=2) as pool:
        priorities = list(pool.map(lambda _: _priority(), range(4)))
    assert all(priority == LOWEST_PRIORITY for priority, _ in priorities)
    assert all(name.startswith("rl360-test-background") for _, name in priorities)
    assert _priority()[0] == mine  # the caller's thread kept its own
