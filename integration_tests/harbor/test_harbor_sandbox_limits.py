"""The second red team's limits and walls (issue 26), each against a real bubblewrap sandbox with
a host-side canary: processes, disk, output, copy-out, network, and what reaches the verifier.
Every attack here is bounded in count and time."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from harbor.environments.base import SandboxBuildFailedError
from harbor.models.task.config import NetworkMode

from integration_tests.harbor.conftest import fork_bomb, make_env
from rl360_ext.harbor.envs import bwrap, seccomp
from rl360_ext.harbor.envs.bwrap import BwrapEnvironment, environment, network
from rl360_ext.harbor.envs.limits import cgroups_usable, pids_in_namespace

pytestmark = pytest.mark.integration

FORK_BOMB = fork_bomb(60)


async def _started(env: BwrapEnvironment) -> BwrapEnvironment:
    await env.start(force_build=False)
    return env


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A host loopback canary no sandbox may reach: nothing may be pending on it afterwards."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.setblocking(False)
    yield sock
    sock.close()


def _nobody_connected(sock: socket.socket) -> bool:
    try:
        connection, _ = sock.accept()
    except BlockingIOError:
        return True
    connection.close()
    return False


@pytest.mark.slow
@pytest.mark.parametrize("limits", ["cgroup", "watchdog"])
async def test_a_fork_bomb_stops_at_the_pids_limit_of_its_own_sandbox(tmp_path: Path, limits: str) -> None:
    if limits == "cgroup" and not cgroups_usable():
        pytest.skip("this process cannot create a limited child cgroup")
    bomb = await _started(make_env(tmp_path / "bomb", memory_mb=1024, limits=limits, max_pids=64))
    neighbour = await _started(make_env(tmp_path / "neighbour", memory_mb=1024, limits=limits, max_pids=64))
    try:
        assert bomb.pids_mode == ("cgroup+rlimit" if limits == "cgroup" else "rlimit")
        result = await bomb.exec(FORK_BOMB, timeout_sec=30)
        forked, refused = map(int, result.stdout.split())
        print(f"fork bomb ({bomb.pids_mode}): {forked} forked, {refused} refused")
        assert refused > 0 and forked < 64, result
        assert bomb._pidns is not None and len(pids_in_namespace(bomb._pidns)) <= 64
        # the host, and a sandbox of the same host uid, still fork while the bomb's children live
        assert subprocess.run(["/bin/true"], check=False).returncode == 0
        spawned = await neighbour.exec("for i in $(seq 40); do sleep 30 & done; jobs -p | wc -l")
        assert spawned.stdout.strip() == "40", spawned
    finally:
        await bomb.stop(delete=True)
        await neighbour.stop(delete=True)
    assert bomb._pidns is not None and pids_in_namespace(bomb._pidns) == []


async def test_every_writable_path_shares_one_capped_disk(tmp_path: Path) -> None:
    env = await _started(make_env(tmp_path, disk_mb=16, max_inodes=256))
    root = env.sandbox_dir.parent
    try:
        fill = await env.exec(
            "head -c 10M /dev/zero > /app/a; echo $?; head -c 10M /dev/zero > /logs/agent/b; echo $?; "
            "ulimit -f"
        )
        app, logs, fsize = fill.stdout.split()
        assert app == "0" and logs != "0" and "No space left" in fill.stderr, fill  # one disk for all
        assert fsize == str(16 * 1024)  # RLIMIT_FSIZE, in 1 KiB blocks
        used = sum(p.stat().st_size for p in env.files_dir.rglob("*") if p.is_file())
        assert used <= 16 * 2**20
        # nothing landed on the host's disk: the bytes are held by the sandbox's own capped tmpfs,
        # a filesystem apart from the host directory it is mounted under
        assert os.stat(env.files_dir).st_dev != os.stat(root).st_dev
        tmpfs = os.statvfs(env.files_dir)
        assert tmpfs.f_blocks * tmpfs.f_frsize <= 16 * 2**20
        assert (tmpfs.f_blocks - tmpfs.f_bfree) * tmpfs.f_frsize >= 10 * 2**20
        inodes = await env.exec(
            "rm -f /app/a /logs/agent/b; mkdir /tmp/d{1..1000} 2>/dev/null; ls /tmp | wc -l"
        )
        assert int(inodes.stdout) < 256, inodes
    finally:
        await env.stop(delete=True)
    assert not env.sandbox_dir.exists()


def _peak_rss_reset() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def _peak_rss_bytes() -> int:
    status = Path("/proc/self/status").read_text().splitlines()
    line = next(entry for entry in status if entry.startswith("VmHWM"))
    return int(line.split()[1]) * 1024


@pytest.mark.slow
async def test_a_command_printing_a_gigabyte_does_not_grow_the_host(tmp_path: Path) -> None:
    env = await _started(make_env(tmp_path, max_output_kb=256))
    try:
        _peak_rss_reset()
        before = _peak_rss_bytes()
        started = time.monotonic()
        print_gigabytes = "head -c 1G /dev/zero | tr '\\0' x; head -c 1G /dev/zero >&2; echo end"
        result = await env.exec(print_gigabytes, timeout_sec=120)
        elapsed = time.monotonic() - started
        growth = _peak_rss_bytes() - before
    finally:
        await env.stop(delete=True)
    print(f"1 GiB on stdout and stderr each: {elapsed:.1f}s, peak RSS growth {growth / 2**20:.1f} MiB")
    assert growth < 48 * 2**20
    assert result.stdout.startswith("x" * 1000) and result.stdout.endswith("xend\n")
    assert f"[... {2**30 + 4 - 256 * 1024} bytes of output dropped ...]" in result.stdout
    assert len(result.stdout) < 300 * 1024 and len(result.stderr or "") < 300 * 1024


async def test_a_copy_out_counts_directories_and_stops_at_its_budgets(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = await _started(make_env(tmp_path, max_copy_inodes=100))
    try:
        made = await env.exec("cd /logs/agent && mkdir -p $(seq -f 'd%g/e' 1 3000) && echo ok")
        assert made.stdout.strip() == "ok", made
        target = tmp_path / "copied"
        await env.download_dir("/logs/agent", target)
        assert len(list(target.rglob("*"))) == 100  # directories count: 100 host inodes, not 6,000
    finally:
        await env.stop(delete=True)
    # The budget's clock starts before the copy's first inode: a microsecond is spent on any
    # machine, however fast (a budget the copy might meet made this test flaky).
    slow = await _started(make_env(tmp_path / "slow", max_copy_s=1e-6))
    try:
        await slow.exec("cd /logs/agent && seq 1 8000 | xargs touch")
        with caplog.at_level(logging.WARNING, logger=bwrap.__name__):
            await slow.download_dir("/logs/agent", tmp_path / "slow-copied")
        assert len(os.listdir(tmp_path / "slow-copied")) < 8000
        assert "time budget is spent" in caplog.text
    finally:
        await slow.stop(delete=True)


@pytest.fixture
async def public(tmp_path: Path) -> AsyncIterator[BwrapEnvironment]:
    if bwrap.slirp4netns_executable() is None:
        pytest.skip("slirp4netns is not installed")
    env = await _started(make_env(tmp_path, network_mode=NetworkMode.PUBLIC, allow_network=True))
    try:
        yield env
    finally:
        await env.stop(delete=True)


async def test_a_public_task_has_its_own_namespace_and_no_host_loopback(
    public: BwrapEnvironment, listener: socket.socket
) -> None:
    port = listener.getsockname()[1]
    probe = (
        "import socket, sys\n"
        "for host in ('127.0.0.1', '10.0.2.2'):\n"
        "    try:\n"
        f"        socket.create_connection((host, {port}), timeout=2).close(); print(host, 'reached')\n"
        "    except OSError as exc:\n"
        "        print(host, 'unreachable')\n"
    )
    result = await public.exec(f'python3 -c "{probe}"; readlink /proc/self/ns/net; ip -o link; ip route')
    assert "127.0.0.1 unreachable" in result.stdout and "10.0.2.2 unreachable" in result.stdout, result
    assert _nobody_connected(listener)
    assert result.stdout.split("\n")[2] != os.readlink("/proc/self/ns/net")  # not the host's namespace
    assert "tap0" in result.stdout and "default via 10.0.2.2" in result.stdout
    assert "unreachable 169.254.0.0/16" in result.stdout  # link-local never leaves the namespace
    for address in network._host_addresses():
        assert f"unreachable {address}" in result.stdout
    assert (await public.exec("ip route del unreachable 169.254.0.0/16")).return_code != 0


async def test_a_public_task_is_refused_without_slirp4netns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(environment, "slirp4netns_executable", lambda: None)
    env = make_env(tmp_path, network_mode=NetworkMode.PUBLIC, allow_network=True)
    with pytest.raises(SandboxBuildFailedError, match="slirp4netns is not installed"):
        await env.start(force_build=False)
    failing = make_env(tmp_path / "failing", workdir="/usr/work")  # bwrap cannot chdir there
    with pytest.raises(SandboxBuildFailedError, match="bubblewrap failed to start"):
        await failing.start(force_build=False)
    assert not failing.sandbox_dir.exists()  # a failed start unmounts and removes what it made
    offline = await _started(make_env(tmp_path / "offline", network_mode=NetworkMode.PUBLIC))
    try:  # a public task the server does not allow network runs offline, with loopback only
        interfaces = await offline.exec("python3 -c 'import socket; print(socket.if_nameindex())'")
        assert interfaces.stdout.strip() == "[(1, 'lo')]", interfaces
    finally:
        await offline.stop(delete=True)


@pytest.mark.parametrize("workdir", [None, "/tmp/work"])
async def test_the_verifier_gets_only_the_agent_s_work_product(tmp_path: Path, workdir: str | None) -> None:
    env = await _started(make_env(tmp_path, workdir=workdir))
    work = workdir or "/app"
    try:
        planted = await env.exec(
            f"mkdir -p {work} && echo answer > {work}/answer.txt && "
            "site=$(python3 -m site --user-site) && mkdir -p $site && "
            """echo 'import os; os.environ["PLANTED"] = "1"' > $site/evil.pth && """
            "echo x > /tests/conftest.py && echo x > /solution/solve.sh && "
            "echo x > /tmp/left && echo x > /logs/artifacts/out && echo $site"
        )
        assert planted.return_code == 0, planted
        assert "/tmp/" in planted.stdout  # the user site lives in HOME=/tmp
        await env.end_phase(("/logs/verifier", "/tests", "/solution"), grading=True)
        seen = await env.exec(
            "python3 -c 'import os, site; print(site.ENABLE_USER_SITE, os.environ.get(\"PLANTED\"))'; "
            f"ls -A /tests /solution /logs/verifier; ls -A /tmp; cat {work}/answer.txt /logs/artifacts/out"
        )
    finally:
        await env.stop(delete=True)
    lines = seen.stdout.split("\n")
    assert lines[0] == "False None", seen
    assert "conftest.py" not in seen.stdout and "solve.sh" not in seen.stdout and "left" not in seen.stdout
    assert "answer\nx" in seen.stdout  # the work product and the artifacts stay


async def test_end_phase_between_phases_keeps_the_disk_cap(tmp_path: Path) -> None:
    env = await _started(make_env(tmp_path, disk_mb=8))
    try:
        await env.exec("echo kept > /app/kept")
        await env.end_phase()
        result = await env.exec("cat /app/kept; head -c 16M /dev/zero > /tmp/big; echo $?")
        assert result.stdout.split()[0] == "kept" and result.stdout.split()[1] != "0"
    finally:
        await env.stop(delete=True)


SYSCALLS = r"""python3 -c '
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for name, nr in (("bpf", 321), ("perf_event_open", 298), ("io_uring_setup", 425), ("getpid", 39)):
    result = libc.syscall(nr, 0, 0, 0, 0, 0)
    print(name, os.strerror(ctypes.get_errno()) if result < 0 else "ok")
print(next(l for l in open("/proc/self/status") if l.startswith("Seccomp:")).split()[1])
'"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the probe uses x86_64 syscall numbers")
@pytest.mark.parametrize("loader", ["perl", "preexec", "off"])
async def test_the_seccomp_filter_refuses_bpf_perf_and_io_uring(
    tmp_path: Path, loader: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if loader == "preexec":  # a host without Perl: the server process loads it after fork
        monkeypatch.setattr(seccomp, "exec_prefix", lambda: None)
    env = await _started(make_env(tmp_path, seccomp=loader != "off"))
    try:
        command = (await env.exec(SYSCALLS)).stdout.split("\n")
        holder = Path(f"/proc/{env._init_pid}/status").read_text()
    finally:
        await env.stop(delete=True)
    refused = "Operation not permitted"
    if loader == "off":  # without the filter the kernel looks at the (NULL) arguments first
        assert command[1:3] == ["perf_event_open Bad address", "io_uring_setup Bad address"], command
        return
    expected = [f"bpf {refused}", f"perf_event_open {refused}", f"io_uring_setup {refused}", "getpid ok", "2"]
    assert command[:5] == expected, command
    assert "Seccomp:\t2" in holder  # bwrap's --seccomp: the holder, and so its children
