"""Warm sandboxes on real bubblewrap: a trial that takes a spare gets a sandbox no different from
one it would have started (only its holder runs, empty directories, the same limits and
isolation), never one another trial had, and nothing of a spare outlives the pool."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from integration_tests.harbor.conftest import make_env, sandbox_root
from rl360_ext.harbor.envs import warm
from rl360_ext.harbor.envs.bwrap import BwrapEnvironment
from rl360_ext.harbor.envs.limits import pids_in_namespace

pytestmark = pytest.mark.integration


async def _held(count: int, timeout_s: float = 20.0) -> None:
    """Wait until the loop's pool holds `count` spares."""
    async with asyncio.timeout(timeout_s):
        while (warm.counts() or {}).get("held") != count:
            await asyncio.sleep(0.02)


def _env(tmp_path: Path, name: str, **options: object) -> BwrapEnvironment:
    (tmp_path / name).mkdir()
    return make_env(tmp_path / name, sandbox_root=str(sandbox_root(tmp_path)), **options)


async def test_a_taken_spare_is_a_fresh_sandbox_of_its_own(tmp_path: Path) -> None:
    root = sandbox_root(tmp_path)
    first = _env(tmp_path, "first", warm_sandboxes=2)
    await first.start(force_build=False)
    second = third = None
    try:
        assert warm.counts() == {"held": 0, "taken": 0, "missed": 1}
        assert first._pidns is not None
        cold = len(pids_in_namespace(first._pidns))  # bwrap's init and the holder
        await _held(2)
        spares = sorted(path.name for path in root.iterdir() if path.name.startswith("warm-"))
        assert len(spares) == 2
        await first.exec("echo first > /app/mine; sleep infinity > /dev/null 2>&1 &")

        second = _env(tmp_path, "second", warm_sandboxes=2)
        await second.start(force_build=False)
        assert (warm.counts() or {})["taken"] == 1
        assert second.sandbox_dir.name in spares and second.sandbox_dir != first.sandbox_dir
        assert second._pidns != first._pidns and second._pidns is not None
        assert len(pids_in_namespace(second._pidns)) == cold  # nothing else ever ran in it
        seen = await second.exec(
            "id -u; ls -A /app; ls -A /tmp /logs/agent; cat /app/seed.txt; ps -e -o comm="
        )
        assert seen.return_code == 0, seen
        lines = seen.stdout.split()
        assert lines[0] == "1000" and "mine" not in lines and "seed.txt" in lines and "seeded" in lines
        assert "sleep" in lines and lines.count("sleep") == 1  # its own holder's, not first's
        assert (await second.exec("test -e /app/mine")).return_code == 1

        await second.end_phase(["/logs/verifier"], grading=True)
        after = await second.exec("cat /app/seed.txt; echo $PYTHONNOUSERSITE")
        assert after.stdout.split() == ["seeded", "1"]

        third = _env(tmp_path, "other-shape", warm_sandboxes=2, memory_mb=128)
        await third.start(force_build=False)
        assert third.sandbox_dir.name not in spares  # another reservation: not a spare of first's shape
    finally:
        for env in (first, second, third):
            if env is not None:
                await env.stop(delete=True)
        await warm.close()
    assert not [path for path in root.iterdir() if path.name.startswith("warm-")]
    assert warm.counts() is None


async def test_spares_older_than_their_age_are_discarded_not_taken(tmp_path: Path) -> None:
    root = sandbox_root(tmp_path)
    first = _env(tmp_path, "first", warm_sandboxes=1, warm_max_age_s=0.05)
    await first.start(force_build=False)
    try:
        await _held(1)
        stale = next(path for path in root.iterdir() if path.name.startswith("warm-"))
        await asyncio.sleep(0.1)
        second = _env(tmp_path, "second", warm_sandboxes=1, warm_max_age_s=0.05)
        await second.start(force_build=False)
        try:
            assert second.sandbox_dir != stale and (warm.counts() or {})["taken"] == 0
            async with asyncio.timeout(10):
                while stale.exists():
                    await asyncio.sleep(0.02)
        finally:
            await second.stop(delete=True)
    finally:
        await first.stop(delete=True)
        await warm.close()
    assert not [path for path in root.iterdir() if path.name.startswith("warm-")]


async def test_closing_the_pool_discards_its_spares_and_their_processes(tmp_path: Path) -> None:
    env = _env(tmp_path, "only", warm_sandboxes=3)
    await env.start(force_build=False)
    mode = env.limits_mode
    await env.stop(delete=True)
    await _held(3)
    root = sandbox_root(tmp_path)
    names = [path.name for path in root.iterdir()]
    assert len(names) == 3 and all(name.startswith("warm-") for name in names)
    if mode.startswith("cgroup"):
        assert len(_members(names)) >= 3  # each spare's holder, in its cgroup
    await warm.close()
    assert not list(root.iterdir())
    assert not _members(names)


def _members(sandboxes: list[str]) -> list[int]:
    """Processes in the cgroup of one of these sandboxes."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cgroups = Path(entry.path, "cgroup").read_text()
            except OSError:
                continue
            if any(f".{name}" in cgroups for name in sandboxes):
                found.append(int(entry.name))
    return found
