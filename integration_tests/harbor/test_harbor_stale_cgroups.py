"""A dead server's sandbox cgroups with processes still in them, in real cgroups: the processes
that no live process with the server's start time is an ancestor of (a sandbox its SIGKILL left
half set up: the inner bwrap waits forever for a user-namespace map) are killed and the cgroups
removed at once, not waited on for every cgroup; a process that such a live process is an ancestor
of (the server, seen from a PID namespace where its pid differs) is kept, and so is its cgroup."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rl360_ext.harbor.envs.limits import (
    CGROUP_PREFIX,
    CgroupLimits,
    cgroups_usable,
    clean_stale_cgroups,
    kill_pids,
    owner_tag,
)
from rl360_ext.util.proc_stat import STATE, stat_fields

pytestmark = [pytest.mark.integration]


@pytest.fixture(autouse=True)
def _needs_cgroups() -> None:
    if not cgroups_usable():
        pytest.skip("this process cannot create limited child cgroups")


def _dead_owner_tag() -> str:
    process = subprocess.Popen(["sleep", "30"])
    tag = owner_tag(process.pid)
    process.kill()
    process.wait()
    return tag


def _alive(pid: int) -> bool:
    fields = stat_fields(pid)
    return fields is not None and fields[STATE] != "Z"


@pytest.fixture
def limits() -> Iterator[list[CgroupLimits]]:
    made: list[CgroupLimits] = []
    yield made
    for group in made:
        group.kill_all()
        group.close()


def test_the_orphans_of_a_dead_server_are_killed_and_its_cgroups_removed(limits: list[CgroupLimits]) -> None:
    names = [f"{CGROUP_PREFIX}{_dead_owner_tag()}.orphan-{i}" for i in range(3)]
    orphans = []
    for name in names:
        group = CgroupLimits(name, cpus=1, memory_mb=64, pids_max=16)
        limits.append(group)
        # the shell exits at once: the sleep is reparented, as an inner bwrap whose outer one died
        shell = subprocess.run(
            group.wrap(["/bin/sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"]),
            capture_output=True,
            text=True,
            check=True,
        )
        orphans.append(int(shell.stdout))
    assert all(_alive(pid) for pid in orphans)
    started = time.monotonic()
    clean_stale_cgroups(wait_s=5.0)
    took = time.monotonic() - started
    assert not [pid for pid in orphans if _alive(pid)]
    assert not [path for group in limits for path in group._dirs if path.exists()]
    assert took < 3.0, took  # killed, then removed: no cgroup waited out to its deadline


def test_a_process_whose_ancestor_has_the_owners_start_time_is_kept(limits: list[CgroupLimits]) -> None:
    own_start = owner_tag().partition(".")[2]
    # a pid that does not run here, with this test's own start time: the tag's server as seen
    # from another PID namespace, and this process its sandbox's ancestor
    group = CgroupLimits(f"{CGROUP_PREFIX}4194305.{own_start}.kept", cpus=1, memory_mb=64, pids_max=16)
    limits.append(group)
    child = subprocess.Popen(group.wrap(["sleep", "60"]))
    try:
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{child.pid}/cmdline").read_bytes().startswith(b"sleep"):
            assert time.monotonic() < deadline, "the sleep did not start"
            time.sleep(0.01)
        clean_stale_cgroups(wait_s=0.3)
        assert child.poll() is None
        assert all(path.exists() for path in group._dirs)
    finally:
        kill_pids([child.pid])
        child.wait()
    assert os.path.isdir(group._dirs[0])
