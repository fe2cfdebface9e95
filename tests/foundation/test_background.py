"""Background work runs at the lowest CPU priority, in the threads of its own pool only."""

from __future__ import annotations

import os
import threading
from pathlib import Path

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


def test_a_background_process_leaves_its_session_and_only_its_own_group_is_lowered() -> None:
    import subprocess
    import sys

    code = (
        "import os; from rl360_ext.util.background import become_background_process;"
        "become_background_process(); print(os.getsid(0), os.getpid(), os.getpriority(os.PRIO_PROCESS, 0))"
    )
    group = Path("/proc/self/autogroup")
    before = group.read_text() if group.exists() else None
    sid, pid, nice = map(int, subprocess.check_output([sys.executable, "-c", code], text=True).split())
    assert sid == pid != os.getsid(0) and nice == LOWEST_PRIORITY
    assert (group.read_text() if before is not None else None) == before  # the caller's group kept its nice
