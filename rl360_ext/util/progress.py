"""Progress for long-running commands: a spinner on stderr that names the current stage.

Owns one thing: telling a person at a terminal what a long command (a benchmark, a fault matrix)
is doing and for how long it has been at it, without touching stdout (nothing printed to stdout
is captured or redirected), so `--json` output stays machine-readable. Code that runs in stages
calls `stage("...")` at each boundary; outside an active `showing_progress` block that call does
nothing, so library code can call it freely.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar

from rich.console import Console
from rich.live import Live
from rich.spinner import Spinner

_active: ContextVar[tuple[Spinner, str, float] | None] = ContextVar("rl360_progress", default=None)


def stage(label: str) -> None:
    """Name the stage the running command is in (no-op when no progress is shown)."""
    active = _active.get()
    if active is None:
        return
    spinner, title, started = active
    spinner.update(text=f"[bold]{title}[/]: {label} [dim](at {time.monotonic() - started:.0f} s)[/]")


@contextlib.contextmanager
def showing_progress(title: str, console: Console | None = None) -> Iterator[None]:
    """Show a spinner titled `title` on stderr while the block runs; `stage` updates its text."""
    spinner = Spinner("dots", text=f"[bold]{title}[/]: starting")
    live = Live(
        spinner,
        console=console or Console(stderr=True),
        transient=True,
        redirect_stdout=False,
        redirect_stderr=False,
    )
    with live:
        token = _active.set((spinner, title, time.monotonic()))
        try:
            yield
        finally:
            _active.reset(token)
