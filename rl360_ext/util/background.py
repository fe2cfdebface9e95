"""Background work: threads and processes that run at the lowest CPU priority, for work proportional
to a request's size that must not take the CPU from a server's event loop.

Owns `background_executor`: a thread pool whose threads lower their own scheduling priority (nice
19; Linux schedules threads one by one) when they start. A server hands it work that can be large
(planning a turn that appends a long text: rendering and tokenizing it), so on a machine with few
cores the event loop and every other session's small turns are scheduled first.
And `become_background_process`, for a worker process: a thread's nice counts only against the
threads of its own scheduling group (with Linux's autogroup on, one per session, and servers run
in sessions of their own), so a busy low-priority thread still takes its whole process's share
from the other processes; a process that starts a session of its own at nice 19 (the autogroup's
too) yields to every other process.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

LOWEST_PRIORITY = 19


def _lower_priority() -> None:
    with contextlib.suppress(OSError, AttributeError):  # no setpriority: it runs at normal priority
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOWEST_PRIORITY)


def become_background_process() -> None:
    """Move this process into a session (and autogroup) of its own at the lowest CPU priority."""
    with contextlib.suppress(OSError):
        os.setsid()  # a group leader already: it stays where it is (and its autogroup is left alone)
        with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as autogroup:
            autogroup.write(str(LOWEST_PRIORITY))  # this new session's group: nothing else is in it
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, LOWEST_PRIORITY)


def background_executor(name: str, workers: int = 2) -> ThreadPoolExecutor:
    """A pool of `workers` threads named `name`, each at the lowest CPU priority."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name, initializer=_lower_priority)
