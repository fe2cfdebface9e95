"""A verifier phase the policy cannot reach (issue 34): each hostile end state an agent (or the code
under test) can leave, against a real bubblewrap sandbox graded by rl360's real verifier
(`ExitRecordingVerifier`, Harbor's `Verifier` underneath). Each test asserts that the verifier
ran and its reward is what `test.sh` wrote, that no process of the verifier phase is alive once
the test command returned, and which limits `limit_hits()` saw, in which phase. Every attack is
bounded in count and time."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from harbor.models.task.task import Task

from integration_tests.harbor.conftest import fork_bomb, make_env
from rl360_ext.harbor.envs.bwrap import BwrapEnvironment, MemoryLimitExceededError
from rl360_ext.harbor.envs.limits import cgroups_usable, pids_in_namespace
from rl360_ext.harbor.outcome import VERIFIER_EXIT_FILE
from rl360_ext.harbor.runner import GRADING_CLEARS
from rl360_ext.harbor.verifier import ExitRecordingVerifier
from rl360_ext.outcomes.attribution import LimitHit, Phase, Resource

pytestmark = pytest.mark.integration

WRITE_ONE = "echo 1 > /logs/verifier/reward.txt"
TASK_TOML = """schema_version = "1.4"
[verifier]
timeout_sec = 60.0
[agent]
timeout_sec = 60.0
[environment]
network_mode = "no-network"
cpus = 1
memory_mb = 256
"""
FORK_BOMB = fork_bomb(600)
MEMORY_HOG = "python3 -c 'import time; x = bytearray(b\"1\") * (400 * 2**20); time.sleep(5)'"


def _needs_cgroups() -> None:
    if not cgroups_usable():
        pytest.skip("this process cannot create a limited child cgroup")


def _task(tmp_path: Path, test_sh: str) -> Task:
    """The task `make_env` made the environment of, with `test_sh` as its verifier."""
    task_dir = tmp_path / "task"
    (task_dir / "task.toml").write_text(TASK_TOML)
    (task_dir / "instruction.md").write_text("Leave the sandbox as you like.\n")
    (task_dir / "tests").mkdir()
    (task_dir / "tests" / "test.sh").write_text("#!/bin/bash\n" + test_sh + "\n")
    return Task(task_dir)


@pytest.fixture
async def started(tmp_path: Path) -> AsyncIterator[list[BwrapEnvironment]]:
    """Environments the test started, each stopped (and deleted) afterwards."""
    envs: list[BwrapEnvironment] = []
    yield envs
    for env in envs:
        await env.stop(delete=True)


async def _start(started: list[BwrapEnvironment], tmp_path: Path, **options: object) -> BwrapEnvironment:
    env = make_env(tmp_path, **options)  # type: ignore[arg-type]
    await env.start(force_build=False)
    started.append(env)
    return env


async def _grade(env: BwrapEnvironment, task: Task) -> dict[str, float | int]:
    """End the agent phase, then grade as the /run server does; returns the rewards. Afterwards
    no process of the verifier phase may be alive."""
    await env.end_phase()
    await env.end_phase(GRADING_CLEARS, grading=True)
    verifier = ExitRecordingVerifier(task=task, trial_paths=env.trial_paths, environment=env)
    try:
        result = await verifier.verify()
    finally:
        assert env._pidns is not None and pids_in_namespace(env._pidns) == []
    assert result.rewards is not None
    return dict(result.rewards)


async def test_an_agent_s_chmod_000_locks_neither_the_next_holder_nor_the_verifier_out(
    tmp_path: Path, started: list[BwrapEnvironment]
) -> None:
    env = await _start(started, tmp_path)
    locked = await env.exec(
        "mkdir -p /app/src && echo x > /app/src/f && chmod 000 /app/src/f /app/src /app/seed.txt && "
        "chmod 000 /logs/verifier /logs/agent /tests /tmp /app /logs"
    )
    assert locked.return_code == 0, locked
    await env.end_phase()
    # a fresh holder starts (its cwd is /, not the chmodded workdir) and runs what it is given
    again = await env.exec("echo alive", cwd="/")
    assert again.stdout.strip() == "alive", again
    task = _task(tmp_path, f"cat /app/seed.txt /app/src/f >/dev/null && touch /tmp/x ~/y && {WRITE_ONE}")
    assert await _grade(env, task) == {"reward": 1}
    assert env.limit_hits() == []


async def test_an_agent_that_fills_the_disk_leaves_the_verifier_its_own(
    tmp_path: Path, started: list[BwrapEnvironment]
) -> None:
    env = await _start(started, tmp_path, disk_mb=16, verifier_disk_mb=8)
    await env.exec("head -c 32M /dev/zero > /app/fill; head -c 1M /dev/zero > /app/more")
    await env.exec("dd if=/dev/zero of=/app/last bs=4k 2>/dev/null")  # the last pages too
    task = _task(tmp_path, f"head -c 4M /dev/zero > /logs/verifier/scratch && {WRITE_ONE}")
    started_at = time.monotonic()
    assert await _grade(env, task) == {"reward": 1}
    print(f"grading after a full disk: {time.monotonic() - started_at:.2f}s")
    assert env.limit_hits() == [LimitHit(Phase.AGENT, Resource.DISK, env.limit_hits()[0].detail)]


async def test_an_agent_whose_files_fill_its_memory_leaves_the_verifier_its_memory(
    tmp_path: Path, started: list[BwrapEnvironment]
) -> None:
    _needs_cgroups()  # the tmpfs's pages are charged to the sandbox's cgroup
    env = await _start(started, tmp_path, memory_mb=128)
    with pytest.raises(MemoryLimitExceededError):  # the files reach the memory limit first
        await env.exec("dd if=/dev/zero of=/app/fill bs=1M 2>/dev/null", timeout_sec=60)
    task = _task(tmp_path, f"python3 -c 'x = bytearray(96 * 2**20)' && {WRITE_ONE}")
    assert await _grade(env, task) == {"reward": 1}
    hits = env.limit_hits()
    assert [(hit.phase, hit.resource) for hit in hits] == [(Phase.AGENT, Resource.MEMORY)], hits


async def test_an_agent_that_fills_the_inodes_leaves_the_verifier_its_own(
    tmp_path: Path, started: list[BwrapEnvironment]
) -> None:
    env = await _start(started, tmp_path, max_inodes=256, verifier_inodes=64)
    filled = await env.exec(
        "for i in $(seq 400); do touch /app/f$i 2>/dev/null || break; done; ls /app | wc -l"
    )
    assert int(filled.stdout) < 256, filled
    task = _task(tmp_path, f"mkdir -p /tmp/a/b && touch /tmp/a/b/c /logs/verifier/x && {WRITE_ONE}")
    assert await _grade(env, task) == {"reward": 1}
    hits = env.limit_hits()
    assert [(hit.phase, hit.resource) for hit in hits] == [(Phase.AGENT, Resource.INODES)], hits


@pytest.mark.slow
async def test_a_3000_deep_tree_is_walked_emptied_copied_and_removed_by_the_host(
    tmp_path: Path, started: list[BwrapEnvironment]
) -> None:
    env = await _start(started, tmp_path)
    chain = (  # 3,000 levels, each chmod 000 from the bottom up
        "import os\nfor _ in range(3000):\n    os.mkdir('d'); os.chdir('d')\nopen('f', 'w').write('x')\n"
        "for _ in range(3000):\n    os.chdir('..'); os.chmod('d', 0)\n"
    )
    for where in ("/app", "/tmp", "/logs/artifacts", "/logs/verifier"):
        deep = await env.exec(f"cd {where} && python3 -c \"{chain}\"")
        assert deep.return_code == 0, deep
    await env.download_dir("/logs/artifacts", tmp_path / "artifacts")  # capped at 32 levels
    assert (tmp_path / "artifacts").is_dir()
    task = _task(tmp_path, f"test -d /app/d/d/d && [ -z \"$(ls -A /tmp)\" ] && {WRITE_ONE}")
    assert await _grade(env, task) == {"reward": 1}
    await env.stop(delete=True)
    assert not env.sandbox_dir.exists()


async def test_a_daemon_of_the_code_under_test_cannot_rewrite_the_reward(
    tmp_path: Path, started: list[BwrapEnvironment]
) -> None:
    env = await _start(started, tmp_path)
    # test.sh writes 0 and leaves a double-forked daemon that writes 1.0 the moment test.sh's
    # descriptors close (the earliest sign of its exit a process can see: a FIFO's end of file)
    daemon = (
        "mkfifo /tmp/gone; setsid bash -c '(cat /tmp/gone >/dev/null; "
        "while :; do echo {\\\"reward\\\": 1.0} > /logs/verifier/reward.json; done) "
        "</dev/null >/dev/null 2>&1 &' &\nexec 3>/tmp/gone"
    )
    write_zero = "echo '{\"reward\": 0.0}' > /logs/verifier/reward.json"
    task = _task(tmp_path, f"{write_zero}\n{daemon}\nsleep 0.2\nexit 3")
    assert await _grade(env, task) == {"reward": 0.0}
    # the script's own exit code is recorded, though its shell went with the kill that followed it
    record = json.loads((env.trial_paths.trial_dir / VERIFIER_EXIT_FILE).read_text())
    assert record == {"test_exit_code": 3}


@pytest.mark.parametrize("limits", ["cgroup", "watchdog"])
async def test_the_verifier_runs_normally_after_an_agent_phase_memory_hit(
    tmp_path: Path, started: list[BwrapEnvironment], limits: str
) -> None:
    if limits == "cgroup":
        _needs_cgroups()
    env = await _start(started, tmp_path, memory_mb=128, limits=limits)
    with pytest.raises(MemoryLimitExceededError):
        await env.exec(MEMORY_HOG, timeout_sec=30)
    with pytest.raises(MemoryLimitExceededError):  # the agent phase's commands keep raising
        await env.exec("true")
    task = _task(tmp_path, f"python3 -c 'x = bytearray(32 * 2**20)' && {WRITE_ONE}")
    assert await _grade(env, task) == {"reward": 1}
    hits = env.limit_hits()
    assert [(hit.phase, hit.resource) for hit in hits] == [(Phase.AGENT, Resource.MEMORY)], hits


async def test_a_verifier_phase_memory_hit_is_the_verifier_phase_s(
    tmp_path: Path, started: list[BwrapEnvironment]
) -> None:
    _needs_cgroups()
    env = await _start(started, tmp_path, memory_mb=128)
    task = _task(tmp_path, f"{MEMORY_HOG}\necho 0 > /logs/verifier/reward.txt")
    with pytest.raises(MemoryLimitExceededError):
        await _grade(env, task)
    hits = env.limit_hits()
    assert [(hit.phase, hit.resource) for hit in hits] == [(Phase.VERIFIER, Resource.MEMORY)], hits


@pytest.mark.slow
async def test_a_verifier_phase_fork_bomb_is_counted_and_ends_with_test_sh(
    tmp_path: Path, started: list[BwrapEnvironment]
) -> None:
    _needs_cgroups()
    env = await _start(started, tmp_path, max_pids=64)
    if env.pids_mode != "cgroup+rlimit":
        pytest.skip("no pids controller: a refused fork leaves no host-side count")
    task = _task(tmp_path, f"{FORK_BOMB} > /logs/verifier/bomb.txt\n{WRITE_ONE}")
    assert await _grade(env, task) == {"reward": 1}
    forked, refused = map(int, (env.trial_paths.verifier_dir / "bomb.txt").read_text().split())
    assert refused > 0 and forked < 64
    hits = env.limit_hits()
    assert [(hit.phase, hit.resource) for hit in hits] == [(Phase.VERIFIER, Resource.PIDS)], hits


async def test_output_past_the_cap_is_an_agent_phase_output_hit(
    tmp_path: Path, started: list[BwrapEnvironment]
) -> None:
    env = await _start(started, tmp_path, max_output_kb=4)
    await env.exec("head -c 64K /dev/zero")
    hits = env.limit_hits()
    assert [(hit.phase, hit.resource) for hit in hits] == [(Phase.AGENT, Resource.OUTPUT)], hits
