"""Stopping a real `rl360 harbor serve` with trials in flight: SIGTERM answers every client
`failure_cause: cancelled` and leaves nothing behind; after a SIGKILL (no teardown at all) the
next server on the same sandbox root removes the dead server's sandbox dirs and cgroups."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rl360_ext.harbor.envs.limits import cgroup_owner, cgroups_usable, owner_tag, sandbox_cgroups
from rl360_ext.local.fixtures import tasks_root as example_tasks_root
from rl360_ext.util.procs import Service

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BUDGET_FLAGS = ("--env-setup-s", "20", "--agent-setup-s", "5", "--margin-s", "2", "--min-agent-s", "1")


@pytest.fixture
def tasks(tmp_path: Path) -> Path:
    root = tmp_path / "tasks"
    slow = root / "slow"
    shutil.copytree(example_tasks_root() / "fix-mean", slow)
    (slow / "solution" / "solve.sh").write_text("#!/bin/bash\nsleep 100\n")
    return root


@pytest.fixture
def sandboxes() -> Iterator[Path]:
    root = Path("/tmp") / f"rl360-shutdown-sandboxes-{os.getpid()}-{time.monotonic_ns()}"
    yield root
    shutil.rmtree(root, ignore_errors=True)


def wait_for(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def _entries(directory: Path) -> int:
    """Entries of a folder the server creates when its first sandbox starts (0 before that)."""
    return len(os.listdir(directory)) if directory.is_dir() else 0


def running(service: Service) -> int:
    return int(httpx.get(service.url + "/health", timeout=5).json()["running"])


@pytest.mark.parametrize("warm", [0, 2], ids=["cold", "warm"])
async def test_sigterm_answers_every_client_cancelled(
    harbor_server: Callable[..., Any],
    descendants: Callable[[int], list[tuple[int, str]]],
    tmp_path: Path,
    tasks: Path,
    sandboxes: Path,
    warm: int,
) -> None:
    flags = ("--tasks-root", str(tasks), "--max-concurrent", "2", "--env-kwarg", f"sandbox_root={sandboxes}")
    warm_flags = ("--env-kwarg", f"warm_sandboxes={warm}")  # with spares: they go with the server too
    with harbor_server(tmp_path / "logs", *flags, *warm_flags, *BUDGET_FLAGS) as service:
        async with httpx.AsyncClient(base_url=service.url, timeout=120) as http:
            calls = [
                asyncio.create_task(http.post("/run", json={"task": "slow", "deadline_s": 200}))
                for _ in range(3)
            ]
            await asyncio.to_thread(
                wait_for, lambda: running(service) == 2 and _entries(sandboxes) == 2 + warm
            )
            await asyncio.sleep(1.0)  # the agents are inside their sandboxes now
            os.kill(service.pid, signal.SIGTERM)
            responses = await asyncio.gather(*calls)
        assert [r.status_code for r in responses] == [200, 200, 200], [r.text for r in responses]
        assert [r.json()["failure_cause"] for r in responses] == ["cancelled"] * 3
        assert all(r.json()["reward"] is None for r in responses)
        assert service.process.wait(timeout=60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal
        assert descendants(service.pid) == [] and os.listdir(sandboxes) == []


@pytest.mark.parametrize("warm", [0, 2], ids=["cold", "warm"])
async def test_after_sigkill_the_next_server_cleans_what_was_left(
    harbor_server: Callable[..., Any], tmp_path: Path, tasks: Path, sandboxes: Path, warm: int
) -> None:
    flags = ("--tasks-root", str(tasks), "--env-kwarg", f"sandbox_root={sandboxes}", *BUDGET_FLAGS)
    warm_flags = ("--env-kwarg", f"warm_sandboxes={warm}")  # spares are left like any sandbox
    with harbor_server(tmp_path / "first", *flags, *warm_flags) as first:
        async with httpx.AsyncClient(base_url=first.url, timeout=120) as http:
            call = asyncio.create_task(http.post("/run", json={"task": "slow", "deadline_s": 200}))
            await asyncio.to_thread(wait_for, lambda: running(first) == 1 and _entries(sandboxes) == 1 + warm)
            await asyncio.sleep(1.0)
            dead = owner_tag(first.pid)
            os.kill(first.pid, signal.SIGKILL)
            first.process.wait(timeout=30)
            with pytest.raises(httpx.HTTPError):
                await call
    left = os.listdir(sandboxes)
    assert len(left) == 1 + warm  # a SIGKILL tears nothing down
    left_cgroups = [path for path in sandbox_cgroups() if cgroup_owner(path) == dead]
    if cgroups_usable():
        assert left_cgroups
    with harbor_server(tmp_path / "second", *flags) as second:
        assert os.listdir(sandboxes) == []
        assert not [path for path in sandbox_cgroups() if cgroup_owner(path) == dead]
        result = httpx.post(second.url + "/run", json={"task": "slow", "deadline_s": 9}, timeout=60).json()
        assert result["failure_cause"] == "insufficient_budget"  # the new server works
