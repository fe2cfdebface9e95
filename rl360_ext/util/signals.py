"""Signals as exceptions: SIGTERM/SIGHUP raise `Terminated` so `finally` blocks run.

Python's default SIGTERM kills the process on the spot, skipping every `finally` and `with` exit,
so a launcher killed by `timeout` would leave the services it started running. Inside
`signals_raise()` those signals raise `Terminated` (a `SystemExit`, so `except Exception` does not
swallow it) in the main thread, the way Ctrl-C raises KeyboardInterrupt. Owns nothing else.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Sequence
from typing import Any


class Terminated(SystemExit):
    """Raised in the main thread on SIGTERM/SIGHUP inside `signals_raise()`; exit status 128+signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


@contextlib.contextmanager
def signals_raise(signums: Sequence[int] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """Inside the block, these signals raise `Terminated` (like Ctrl-C raises KeyboardInterrupt), so
    `finally` blocks run and the services they guard are stopped. Off the main thread, a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Terminated(signum)

    previous = {signum: signal.signal(signum, handler) for signum in signums}
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before)


@contextlib.contextmanager
def handlers_kept(signums: Sequence[int] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)) -> Iterator[None]:
    """Put back this thread's signal handlers after the block (main thread only).

    `ray.init` replaces the SIGTERM handler with Ray's own, which ends the driver at once (no
    `finally` runs): start Ray inside this block to keep `signals_raise()` (or any handler) in force.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {signum: signal.getsignal(signum) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            if handler is not None:
                signal.signal(signum, handler)
