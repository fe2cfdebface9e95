"""`FairLock`: the tiny engine's model lock, handed to waiters in arrival order (what makes chunked
prefill interleave with other requests' steps), and the time it has been held."""

from __future__ import annotations

import threading
import time
from collections import deque


class FairLock:
    """A mutex handed to waiters in arrival order: a thread that releases it cannot barge back in.

    `threading.Lock` is not fair: a prefill releasing it between chunks usually re-acquires it
    before the waiting request's thread even wakes, which would undo chunked prefill.
    `busy_s` is the total time it has been held (the engine's model-busy time).
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._waiters: deque[threading.Lock] = deque()
        self._held = False
        self._since = 0.0
        self._busy_s = 0.0

    def acquire(self) -> None:
        with self._mutex:
            if not self._held:
                self._held = True
                self._since = time.perf_counter()
                return
            turn = threading.Lock()
            turn.acquire()
            self._waiters.append(turn)
        turn.acquire()  # released by the holder's release(): the lock is handed over, still held

    def release(self) -> None:
        with self._mutex:
            if self._waiters:
                self._waiters.popleft().release()
            else:
                self._held = False
                self._busy_s += time.perf_counter() - self._since

    @property
    def busy_s(self) -> float:
        with self._mutex:
            return self._busy_s + (time.perf_counter() - self._since if self._held else 0.0)

    def __enter__(self) -> FairLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
