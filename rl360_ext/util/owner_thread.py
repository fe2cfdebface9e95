"""Threads that live as long as the process, for work whose effects must not die with a thread.

Linux delivers a child's parent-death signal (PR_SET_PDEATHSIG) when the *thread* that forked
the child exits, not the process. Ray sets it on its head processes, and rl360 sets it on the
services it starts (`procs.start_service`), so a process started from a short-lived worker thread
would be killed as soon as that thread ends. `OwnerThread` is one daemon thread per purpose,
started on first use and never stopped, that runs such calls for any caller and hands back the
result (or the exception). It owns nothing else.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class OwnerThread:
    """A daemon thread, alive until the process exits, that runs the calls given to `call`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _serve(self) -> None:
        while True:
            job, future = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(job())
            except BaseException as exc:  # handed to the caller; the thread keeps serving
                future.set_exception(exc)

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def call(self, job: Callable[[], T]) -> T:
        """Run `job` on the owner thread and return its result (raise its exception).

        Called from the owner thread itself, it runs inline (no deadlock)."""
        if threading.current_thread() is self._thread:
            return job()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
                self._thread.start()
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((job, future))
        return future.result()


def on_lasting_thread(owner: OwnerThread, job: Callable[[], T]) -> T:
    """Run `job` here when this is the main thread (it lives as long as the process), else on
    `owner`."""
    if threading.current_thread() is threading.main_thread():
        return job()
    return owner.call(job)
