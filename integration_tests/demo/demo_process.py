"""Running `rl360 demo` as a user runs it (the CLI in its own process) from the demo tests, and
proving afterwards that nothing it started is left.

Leftover processes are found by an environment marker the demo process passes to everything it
starts (procs, Ray, Harbor, bubblewrap all inherit the environment), so a process re-parented to
init after its parent died is still found; ports come from the demo's `logs/services.json`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from rl360_ext.util.procs import LOOPBACK, rl360_argv

MARKER = "RL360_DEMO_TEST_MARKER"
UNKNOWN_PID = -1
# Bounds for a small demo run while the other test workers share the machine's 2 cores.
DEMO_RUN_S = 420
FIRST_ROLLOUT_S = 300


def demo_argv(out: Path, *flags: str) -> list[str]:
    return rl360_argv("demo", "--out", str(out), *flags)


def with_ctrl_c(argv: list[str]) -> list[str]:
    """`argv` with Ctrl-C at its default, as a terminal gives it: a shell without job control (CI
    scripts, `cmd &`) starts background commands with SIGINT ignored, and Python keeps it ignored."""
    reset = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    return [sys.executable, "-c", reset, *argv]


def marked_env(token: str) -> dict[str, str]:
    return {**os.environ, MARKER: token, "COLUMNS": "160"}


def _live(pid: int) -> str | None:
    """The command line of a live (not zombie) process, else None."""
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat[stat.rindex(")") + 2] != "Z":
            return (
                Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
            )
    return None


def _marked_processes(token: str) -> list[tuple[int, str]]:
    """Live processes whose environment carries this run's marker."""
    needle = f"{MARKER}={token}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0"):
                cmdline = _live(int(entry.name))
                if cmdline is not None:
                    found.append((int(entry.name), cmdline))
    return found


def _manifest_ports(out: Path) -> list[int]:
    manifest = json.loads((out / "logs" / "services.json").read_text())
    ports = [port for service in manifest["services"] for port in service["ports"]]
    replicas = [replica["url"] for replica in manifest.get("harbor_replicas", [])]
    for url in [*manifest["session_servers"], *replicas, manifest["ray_gcs_address"] or ""]:
        if match := re.search(r":(\d+)/?$", url):
            ports.append(int(match.group(1)))
    return ports


def _listeners(port: int) -> list[int]:
    """Pids listening on TCP `port` (any address), from `ss -ltnpH`; without `ss`, [UNKNOWN_PID]
    when a connection to the port on loopback succeeds."""
    if shutil.which("ss") is None:
        with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), timeout=0.5):
            return [UNKNOWN_PID]
        return []
    result = subprocess.run(
        ["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True, timeout=10, check=True
    )
    return [int(pid) for pid in re.findall(r"pid=(\d+)", result.stdout)]


def assert_nothing_left(token: str, out: Path, grace_s: float = 20.0) -> None:
    """No marked process, no process from the manifest (SMG rewrites its environment block, so
    the marker cannot find it), and no listener of theirs on a port the demo opened."""
    manifest = json.loads((out / "logs" / "services.json").read_text())
    service_pids = {service["pid"] for service in manifest["services"]}
    ports = _manifest_ports(out)
    assert ports and service_pids, "the demo wrote no services to logs/services.json"
    deadline = time.monotonic() + grace_s
    while True:
        left = _marked_processes(token) + [(pid, cmd) for pid in service_pids if (cmd := _live(pid))]
        ours = {UNKNOWN_PID} | {pid for pid, _ in left}
        held = {port: pids for port in ports if (pids := [p for p in _listeners(port) if p in ours])}
        if (not left and not held) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not left, f"processes the demo started are still running: {left}"
    assert not held, f"ports the demo opened are still listened on by its processes: {held}"


def sandboxes_under(pid: int) -> int:
    """bubblewrap processes descended from `pid`."""
    parents: dict[int, tuple[int, str]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            parents[int(stat.parent.name)] = (int(text[text.rindex(")") + 2 :].split()[1]), text)
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, (parent, _) in parents.items() if parent in frontier} - found
        found |= frontier
    return sum(1 for child in found if "(bwrap)" in parents[child][1])
