"""Background work: threads that run at the lowest CPU priority, for work proportional to a request's
size that must not take the CPU from a server's event loop.

Owns `background_executor`: a thread pool whose threads lower their own scheduling priority (nice
19; Linux schedules threads one by one) when they start. A server hands it work that can be large
(planning a turn that appends a long text: rendering and tokenizing it), so on a machine with few
cores the event loop and every other session's small turns are scheduled first.
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


def background_executor(name: str, workers: int = 2) -> ThreadPoolExecutor:
    """A pool of `workers` threads named `name`, each at the lowest CPU priority."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name, initializer=_lower_priority)
