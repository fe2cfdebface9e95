"""The bubblewrap environment on its own: one long-lived sandbox, its walls, its limits, its teardown."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from harbor.environments.base import SandboxBuildFailedError

from integration_tests.harbor.conftest import make_env
from rl360_ext.harbor.envs.bwrap import BwrapEnvironment, MemoryLimitExceededError
from rl360_ext.harbor.envs.limits import cgroups_usable, pids_in_namespace

pytestmark = pytest.mark.integration


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[BwrapEnvironment]:
    environment = make_env(tmp_path)
    await environment.start(force_build=False)
    try:
        yield environment
    finally:
        await environment.stop(delete=True)


async def test_state_in_processes_survives_between_commands(env: BwrapEnvironment) -> None:
    started = await env.exec(
        "tmux new-session -d -s main -x 80 -y 24 && tmux send-keys -t main 'echo hi > /app/from-tmux' Enter"
    )
    assert started.return_code == 0, started.stderr
    await asyncio.sleep(0.5)
    again = await env.exec("tmux has-session -t main && cat /app/from-tmux && cat /app/seed.txt")
    assert again.return_code == 0 and again.stdout.split() == ["hi", "seeded"]


async def test_only_the_task_dirs_are_writable(env: BwrapEnvironment) -> None:
    for path in ("/app", "/tmp", "/tests", "/solution", "/logs/verifier", "/logs/agent"):
        assert (await env.exec(f"touch {path}/probe")).return_code == 0, path
    for path in ("/usr/probe", "/etc/probe", "/probe", "/root/probe", "/var/probe"):
        assert (await env.exec(f"touch {path}")).return_code != 0, path
    assert (await env.exec("test -e /work || test -e /root/.bashrc")).return_code != 0  # host files stay out
    assert not (env.trial_paths.verifier_dir / "probe").exists()  # no trial dir is mounted


async def test_no_network_no_capabilities_no_host_environment(env: BwrapEnvironment) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    os.environ["RL360_PROBE_SECRET"] = "do-not-leak"
    try:
        probe = f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)\""
        assert (await env.exec(probe)).return_code != 0  # the host's loopback is not the sandbox's
        status = await env.exec("grep CapEff /proc/self/status; env")
    finally:
        listener.close()
        del os.environ["RL360_PROBE_SECRET"]
    assert "CapEff:\t0000000000000000" in status.stdout
    assert "do-not-leak" not in status.stdout


async def test_a_timed_out_command_is_killed(env: BwrapEnvironment) -> None:
    with pytest.raises(TimeoutError, match="timed out after 1 seconds"):
        await env.exec("sleep 123 & sleep 30", timeout_sec=1)
    count = (
        "import os; print(sum(open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')[:2] in "
        "([b'sleep', b'30'], [b'sleep', b'123']) for p in os.listdir('/proc') if p.isdigit()))"
    )
    left = await env.exec(f'python3 -c "{count}"')
    assert left.stdout.strip() == "0", left.stderr


async def test_transfers_never_follow_symlinks_planted_in_the_sandbox(
    env: BwrapEnvironment, tmp_path: Path
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("host data")
    source = tmp_path / "upload.txt"
    source.write_text("uploaded")
    assert (
        await env.exec(f"ln -s {victim} /tests/test.sh && mkdir -p /solution && ln -s {tmp_path} /solution/d")
    ).return_code == 0
    await env.upload_file(source, "/tests/test.sh")
    await env.upload_file(source, "/solution/d/x.txt")
    assert victim.read_text() == "host data" and not (tmp_path / "x.txt").exists()
    copied = await env.exec("cat /tests/test.sh /solution/d/x.txt")
    assert copied.stdout == "uploadeduploaded"
    assert (await env.exec(f"ln -s {victim} /app/leak")).return_code == 0
    with pytest.raises(PermissionError):
        await env.download_file("/app/leak", tmp_path / "got.txt")
    with pytest.raises(PermissionError):
        await env.upload_file(source, "/usr/bin/evil")


async def test_stop_leaves_no_process_and_no_files(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    await env.start(force_build=False)
    await env.exec("(sleep 300 &) ; nohup sleep 301 >/dev/null 2>&1 &")
    pidns = env._pidns
    assert pidns is not None and len(pids_in_namespace(pidns)) >= 3
    await env.stop(delete=True)
    assert pids_in_namespace(pidns) == []
    assert not env.sandbox_dir.exists()
    with pytest.raises(RuntimeError, match="not running"):
        await env.exec("true")


@pytest.mark.slow
@pytest.mark.parametrize("limits", ["cgroup", "watchdog"])
async def test_the_memory_reservation_is_enforced(tmp_path: Path, limits: str) -> None:
    if limits == "cgroup" and not cgroups_usable():
        pytest.skip("this process cannot create a limited child cgroup")
    env = make_env(tmp_path, memory_mb=128, limits=limits)
    await env.start(force_build=False)
    try:
        assert env.limits_mode.startswith(limits)
        assert (await env.exec("python3 -c 'x = bytearray(b\"1\") * (32 * 2**20)'")).return_code == 0
        with pytest.raises(MemoryLimitExceededError, match="128 MB"):
            await env.exec(
                "python3 -c 'import time; x = bytearray(b\"1\") * (400 * 2**20); time.sleep(5)'",
                timeout_sec=30,
            )
    finally:
        await env.stop(delete=True)


async def test_the_environment_definition_is_setup_sh(tmp_path: Path) -> None:
    env = make_env(tmp_path, setup="set -e\necho built > /app/built.txt\n")
    await env.start(force_build=False)
    try:
        assert (await env.exec("cat /app/built.txt /app/seed.txt")).stdout.split() == ["built", "seeded"]
    finally:
        await env.stop(delete=True)
    broken = make_env(tmp_path / "broken", setup="echo missing dependency >&2\nexit 7\n")
    with pytest.raises(SandboxBuildFailedError, match="exited 7: missing dependency"):
        await broken.start(force_build=False)
    await broken.stop(delete=True)
    assert not broken.sandbox_dir.exists()


async def test_end_phase_kills_what_the_phase_left_and_keeps_its_files(env: BwrapEnvironment) -> None:
    started = await env.exec(
        "echo kept > /app/kept; nohup setsid sh -c 'while :; do date > /tmp/beat; sleep 0.01; done' "
        ">/dev/null 2>&1 & tmux new-session -d -s left; "
        "for i in $(seq 500); do [ -s /tmp/beat ] && break; sleep 0.01; done"
    )  # the writer has written once (on a loaded machine it may not have run before the kill)
    assert started.return_code == 0, started.stderr
    before = env._pidns
    await env.end_phase()
    assert before is not None and pids_in_namespace(before) == []
    after = await env.exec("cat /app/kept; ps -eo args | grep -c -e '[w]hile :' -e '[t]mux'")
    assert after.stdout.split() == ["kept", "0"], after.stderr
    # the command ran in a fresh holder; the old namespace stayed pinned until the new one
    # existed, so its number is not reused
    assert env._pidns is not None and env._pidns != before
    beat = await env.exec("stat -c %Y /tmp/beat; sleep 0.3; stat -c %Y.%s /tmp/beat")
    assert beat.return_code == 0  # the file stays, nobody writes it any more


async def test_path_kinds_are_answered_on_the_host_without_a_holder_between_phases(
    env: BwrapEnvironment,
) -> None:
    made = await env.exec(
        "mkdir -p /logs/artifacts/d && echo x > /logs/artifacts/f && ln -s d /logs/artifacts/l "
        "&& ln -s /etc/passwd /logs/artifacts/p"
    )
    assert made.return_code == 0, made.stderr
    await env.end_phase()  # the agent phase is over: no holder runs until the next command
    kinds = {
        path: (await env.is_dir(path), await env.is_file(path))
        for path in ("/logs/artifacts", "/logs/artifacts/d", "/logs/artifacts/f", "/logs/artifacts/l",
                     "/logs/artifacts/p", "/logs/artifacts/missing", "/logs/artifacts/l/x")
    }  # fmt: skip
    assert env._init_pid is None and env._holder_due  # none of them started one
    assert kinds == {
        "/logs/artifacts": (True, False),
        "/logs/artifacts/d": (True, False),
        "/logs/artifacts/f": (False, True),
        "/logs/artifacts/l": (False, False),  # a link is not followed, to a directory or a host file
        "/logs/artifacts/p": (False, False),
        "/logs/artifacts/missing": (False, False),
        "/logs/artifacts/l/x": (False, False),
    }
    # outside the writable directories the sandbox answers (and the next holder starts for it)
    assert await env.is_dir("/usr") and await env.is_file("/etc/passwd")
    assert not await env.is_dir("/etc/passwd")


async def test_files_are_removed_on_the_host_without_following_links(
    env: BwrapEnvironment, tmp_path: Path
) -> None:
    canary = tmp_path / "host-canary"
    canary.write_text("host")
    os.chmod(tmp_path, 0o755)
    made = await env.exec(
        "cd /logs/verifier && echo 1 > reward.txt && mkdir -p reward.json/deep && "
        "mkdir -p /app/real && echo keep > /app/real/x && ln -s /app/real /logs/verifier/linked && "
        f"ln -s {canary} /logs/verifier/to-host && echo kept > /logs/verifier/other"
    )
    assert made.return_code == 0, made.stderr
    await env.end_phase()  # no holder runs: the removal is the host's
    await env.remove_files(
        ["/logs/verifier/reward.txt", "/logs/verifier/reward.json", "/logs/verifier/missing",
         "/logs/verifier/linked/x", "/logs/verifier/to-host", "/logs/verifier/none/x"]
    )  # fmt: skip
    assert env._init_pid is None
    left = await env.exec("ls -A /logs/verifier; cat /app/real/x")
    assert left.stdout.split() == ["linked", "other", "keep"]  # a link's target is never touched
    assert canary.read_text() == "host"
    with pytest.raises(PermissionError):
        await env.remove_files(["/etc/passwd"])
    with pytest.raises(IsADirectoryError):
        await env.remove_files(["/logs"])


async def test_the_sandbox_is_an_unprivileged_user_in_its_own_namespaces(env: BwrapEnvironment) -> None:
    os.environ["RL360_PROBE_SECRET"] = "do-not-leak"
    try:
        await env.end_phase()  # the next command starts a fresh holder, with the secret in our environment
        environ = (await env.exec("tr '\\0' '\\n' < /proc/1/environ")).stdout.split()
        everything = (await env.exec("cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline; env")).stdout
    finally:
        del os.environ["RL360_PROBE_SECRET"]
    assert environ == ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    assert "do-not-leak" not in everything and "/work" not in everything

    async def out(command: str) -> str:
        return (await env.exec(command)).stdout.strip()

    assert await out("id -u") == "1000" and (await out("cat /proc/self/uid_map")).split()[0] == "1000"
    host_view = Path(f"/proc/{env._init_pid}/uid_map").read_text().split()
    assert host_view == ["1000", "65534", "1"]  # sandbox uid 1000 is host uid 65534; uid 0 is unmapped
    assert await out("grep CapEff /proc/self/status") == "CapEff:\t0000000000000000"
    sysctl = "import os; os.open('/proc/sys/kernel/core_pattern', os.O_WRONLY)"
    assert "Error" in await out(f'python3 -c "{sysctl}" 2>&1 | tail -1')
    assert (await out("grep ' /proc/sys ' /proc/self/mountinfo | cut -d' ' -f6")).startswith("ro")
    assert "unshare failed" in await out("unshare --user --map-root-user true 2>&1")
    assert await out("stat -c %u /app/seed.txt") == "1000"  # uploads belong to the sandbox user
    assert os.stat(env.files_dir / "app" / "seed.txt").st_uid == 65534


@pytest.mark.parametrize("limits", ["cgroup", "watchdog"])
async def test_a_command_s_environment_never_reaches_the_host_side_processes(
    tmp_path: Path, limits: str
) -> None:
    if limits == "cgroup" and not cgroups_usable():
        pytest.skip("this process cannot create a limited child cgroup")
    canary, fake_bin = tmp_path / "ran-as-root", tmp_path / "bin"
    fake_bin.mkdir()
    for name in ("nsenter", "taskset", "setpriv", "env", "sh", "bash"):
        (fake_bin / name).write_text(f'#!/bin/sh\necho {name} >> {canary}\nexec /usr/bin/{name} "$@"\n')
        (fake_bin / name).chmod(0o755)
    env = make_env(tmp_path, limits=limits)
    await env.start(force_build=False)
    try:
        hostile = {"PATH": f"{fake_bin}:/usr/bin:/bin", "LD_PRELOAD": str(tmp_path / "x.so")}
        hostile["ODD"] = "a b\nc=d"
        result = await env.exec('printf \'%s|\' "$PATH" "$ODD" "$HOME"', env=hostile)
    finally:
        await env.stop(delete=True)
    assert result.stdout == f"{fake_bin}:/usr/bin:/bin|a b\nc=d|/tmp|", result.stderr
    assert not canary.exists()
