"""Launchers leave no process behind: SIGTERM (what `timeout` sends) or SIGKILL, nothing survives.

`rl360 bench r3` starts a tiny engine and a local Ray (whose actors run session servers); killed
by SIGTERM while all of that runs, the bench must exit and every process it started, directly or
not, must be gone within a bound. A launcher killed by SIGKILL cannot clean up at all: its engine
must die anyway (parent-death signal), even though a worker thread that has since exited started
it (the signal must not fire when that thread exits).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rl360_ext.util.procs import rl360_argv

pytestmark = [pytest.mark.integration, pytest.mark.slow]

GONE_WITHIN_S = 60.0


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat fields after the command name (state is [0], ppid [1], start time [19])."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _started(pid: int) -> str | None:
    """The start time of `pid` while it runs (a zombie waiting to be reaped counts as gone)."""
    fields = _stat(pid)
    return fields[19] if fields and fields[0] != "Z" else None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _descendants(root: int) -> dict[tuple[int, str], str]:
    """Every live process below `root` as (pid, start time) -> command line."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        fields = _stat(int(entry.name)) if entry.name.isdigit() else None
        if fields:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: dict[tuple[int, str], str] = {}
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            started = _started(child)
            if started is not None and (child, started) not in found:
                found[(child, started)] = _cmdline(child)
                stack.append(child)
    return found


def _wait_gone(processes: dict[tuple[int, str], str], within_s: float) -> dict[tuple[int, str], str]:
    """The processes (same pid, same start time) still running after `within_s`."""
    deadline = time.monotonic() + within_s
    left = processes
    while time.monotonic() < deadline:
        left = {key: cmd for key, cmd in processes.items() if _started(key[0]) == key[1]}
        if not left:
            return {}
        time.sleep(0.25)
    return left


def test_bench_r3_killed_by_sigterm_leaves_nothing_running(tmp_path: Path) -> None:
    log = (tmp_path / "bench.log").open("wb")
    bench = subprocess.Popen(
        rl360_argv("bench", "r3", "--json"), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 600
        tree: dict[tuple[int, str], str] = {}
        while time.monotonic() < deadline and bench.poll() is None:
            commands = " | ".join(_descendants(bench.pid).values())
            if "engine serve" in commands and "raylet" in commands:
                break
            time.sleep(0.5)
        assert bench.poll() is None, "the bench ended before its engine and Ray were up"
        actors_by = time.monotonic() + 60  # give Ray its session-server actors, if it gets there
        while time.monotonic() < actors_by and "SessionServerActor" not in " ".join(tree.values()):
            tree = _descendants(bench.pid)
            time.sleep(0.5)
        tree = _descendants(bench.pid)
        assert "engine serve" in " ".join(tree.values()), tree
        bench.send_signal(signal.SIGTERM)
        bench.wait(timeout=GONE_WITHIN_S)
        survivors = _wait_gone(tree, GONE_WITHIN_S)
        log.flush()
        tail = (tmp_path / "bench.log").read_text(errors="replace")[-3000:]
        assert not survivors, f"left running after SIGTERM: {survivors}\n{tail}"
        # It unwound through Python (143, or 1 when ray.get turned the exit into its own), not killed.
        assert bench.returncode >= 0, f"{bench.returncode}\n{tail}"
        print(f"\nbench r3: exit {bench.returncode} after SIGTERM; {len(tree)} processes, none left")
    finally:
        if bench.poll() is None:
            bench.kill()
        log.close()


LAUNCHER = """
import sys, threading, time
from pathlib import Path
from rl360_ext.local.services import start_engine

box = {}
starter = threading.Thread(target=lambda: box.update(engine=start_engine(Path(sys.argv[1]))))
starter.start()
starter.join()
print(box["engine"].pid, box["engine"].url, flush=True)
time.sleep(600)
"""


def test_engine_dies_with_a_sigkilled_launcher_not_with_the_thread_that_started_it(tmp_path: Path) -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert launcher.stdout is not None
        pid_text, url = launcher.stdout.readline().split()
        engine_pid = int(pid_text)
        started = _started(engine_pid)
        assert started is not None and "engine serve" in _cmdline(engine_pid)
        time.sleep(3.0)  # the starter thread has exited: the engine must still serve
        assert _started(engine_pid) == started
        assert httpx.get(url + "/health", timeout=10).status_code == 200
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=30)
        survivors = _wait_gone({(engine_pid, started): "engine"}, GONE_WITHIN_S)
        assert not survivors, f"the engine outlived its SIGKILLed launcher: {survivors}"
    finally:
        if launcher.poll() is None:
            launcher.kill()
