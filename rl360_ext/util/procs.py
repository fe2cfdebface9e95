"""Local service processes: start them on free loopback ports, wait until ready, stop them by pid.

Owns process lifecycle for everything rl360 runs as a separate process (tiny engines, the SMG
gateway, session servers, Harbor /run servers) in tests, benchmarks and `rl360 demo`, and finding
executables. A stop
sends SIGTERM to the process group, waits (SMG drains for 5-7 s on SIGTERM), then SIGKILLs, so
nothing is left behind. It does not own what the services do.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

LOOPBACK = "127.0.0.1"


def find_executable(name: str) -> str | None:
    """An executable on PATH or next to this interpreter (a venv's bin/ that is not activated)."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    return shutil.which(name)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


class ServiceStartError(RuntimeError):
    """A service exited or did not become ready in time; carries the tail of its log.

    `reason` is the one-line cause and `log_path` the service's log (the CLI prints both on one
    line); the message adds the log's tail.
    """

    def __init__(self, reason: str, log_path: Path | None = None, log_tail: str = "") -> None:
        super().__init__(f"{reason}; log:\n{log_tail}" if log_tail else reason)
        self.reason = reason
        self.log_path = log_path


@dataclass
class Service:
    """One running process, its URL, and the log file its output goes to."""

    name: str
    argv: list[str]
    port: int
    log_path: Path
    process: subprocess.Popen[bytes] = field(repr=False)
    stop_grace_s: float = 10.0

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def wait_ready(self, path: str = "/health", timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise ServiceStartError(
                    f"{self.name} exited with {self.process.returncode} before it was ready",
                    self.log_path,
                    self.log_tail(),
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + path, timeout=2.0).status_code == 200:
                    return
            time.sleep(0.1)
        self.stop()
        raise ServiceStartError(
            f"{self.name} not ready on {self.url}{path} after {timeout_s}s", self.log_path, self.log_tail()
        )

    def stop(self) -> None:
        """SIGTERM the process group, wait out the grace period, then SIGKILL it."""
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=self.stop_grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


def start_service(
    name: str,
    argv: Sequence[str],
    port: int,
    log_dir: Path,
    ready_path: str = "/health",
    ready_timeout_s: float = 60.0,
    env: dict[str, str] | None = None,
    stop_grace_s: float = 10.0,
) -> Service:
    """Start `argv` in its own process group with output to `log_dir/name.log`; wait for readiness."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    service = Service(name, list(argv), port, log_path, process, stop_grace_s)
    try:
        service.wait_ready(ready_path, ready_timeout_s)
    except BaseException:
        service.stop()
        raise
    return service


def rl360_argv(*args: str) -> list[str]:
    """argv that runs the rl360 CLI with this interpreter (no reliance on PATH)."""
    return [sys.executable, "-c", "from rl360_ext.cli import app; app()", *args]


@contextlib.contextmanager
def running(*services: Service) -> Iterator[tuple[Service, ...]]:
    """Stop every service on exit, in reverse order, whatever happened."""
    try:
        yield services
    finally:
        for service in reversed(services):
            service.stop()
