"""A sandbox's start and phase ends wait for the event loop a bounded number of times (the loop of
a replica is shared by every trial it runs: each wait queues behind the others' work), and a
bubblewrap that fails to start still says why."""

from __future__ import annotations

import asyncio
import asyncio.base_events
from pathlib import Path

import pytest
from harbor.environments.base import SandboxBuildFailedError

from integration_tests.harbor.conftest import make_env

pytestmark = pytest.mark.integration

MAX_LAUNCH_TURNS = 8  # was 15 when each pipe event of the start came back through the loop


async def test_a_holders_start_needs_few_turns_of_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = make_env(tmp_path)
    await env.start(force_build=False)
    try:
        turns = 0
        run_once = asyncio.base_events.BaseEventLoop._run_once

        def counted(loop: asyncio.base_events.BaseEventLoop) -> None:
            nonlocal turns
            turns += 1
            run_once(loop)

        monkeypatch.setattr(asyncio.base_events.BaseEventLoop, "_run_once", counted)
        await env._kill_sandbox()
        before = turns
        await env._launch()
        assert turns - before <= MAX_LAUNCH_TURNS
        monkeypatch.undo()
        again = await env.exec("cat /app/seed.txt")
        assert again.return_code == 0 and again.stdout == "seeded\n"
    finally:
        await env.stop(delete=True)


async def test_a_bubblewrap_that_cannot_start_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = make_env(tmp_path)
    argv = env._bwrap_argv
    monkeypatch.setattr(env, "_bwrap_argv", lambda *a: [*argv(*a)[:-4], "--no-such-option"])
    with pytest.raises(SandboxBuildFailedError, match=r"bubblewrap failed to start: .*no-such-option"):
        await asyncio.wait_for(env.start(force_build=False), timeout=20)
