"""The local container stack for the docker integration tests: started once per module (with the
base image cached by digest under the stack's state directory, a second run starts in seconds),
stopped at the end if it was not already running. A machine where no engine can start (not root,
no engine package, no overlay file system) skips every test here with one line."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

import pytest

from rl360_ext.containers import StackPaths, stack
from rl360_ext.util.procs import Service, free_port, rl360_argv, start_service


@pytest.fixture(scope="module")
def containers() -> Iterator[StackPaths]:
    """The running stack; skips (one line) where it cannot start."""
    problems = stack.problems()
    if problems:
        pytest.skip(f"no container engine can start here: {problems[0]}")
    paths = StackPaths.default()
    paths.root.mkdir(parents=True, exist_ok=True)
    with (paths.root / "up.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one `up` at a time across test workers
        was_running = stack.status(paths).get("running", False)
        try:
            stack.up(paths, say=lambda line: None)
        except (RuntimeError, OSError) as exc:
            pytest.skip(f"the container stack did not start: {str(exc).splitlines()[0]}")
    try:
        yield paths
    finally:
        if not was_running:
            stack.down(paths, say=lambda line: None)


@contextlib.contextmanager
def docker_server(log_dir: Path, *args: str) -> Iterator[Service]:
    """`rl360 harbor serve --env docker` as a real process on loopback, stopped on exit."""
    port = free_port()
    trials = ("--trials-dir", str(log_dir / "trials"))
    argv = rl360_argv(
        "harbor", "serve", "--env", "docker", "--host", "127.0.0.1", "--port", str(port), *trials, *args
    )
    service = start_service("harbor-docker", argv, port, log_dir, ready_timeout_s=90, stop_grace_s=60)
    try:
        yield service
    finally:
        service.stop()
