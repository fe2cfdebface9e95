"""Local service processes: start them on free loopback ports, wait until ready, stop them by pid.

Owns process lifecycle for everything rl360 runs as a separate process (tiny engines, the SMG
gateway, session servers, Harbor /run servers) in tests, benchmarks and `rl360 demo`, and finding
executables. A stop sends SIGTERM to the process group, waits (a server drains what is in flight),
then SIGKILLs, so nothing is left behind.

Nothing is left behind when the launcher dies either, however it dies: every service gets a
parent-death signal (PR_SET_PDEATHSIG, SIGTERM) and is forked from a thread that lives as long as
the process (the main thread, or the `rl360-procs-spawner` thread: Linux sends the signal when the
forking *thread* exits); services still running at interpreter exit are stopped (atexit); and
`rl360_ext.util.signals.signals_raise()` turns SIGTERM/SIGHUP into an exception, so a launcher
killed by `timeout` unwinds through its `finally` blocks and stops what it started. It does not
own what the services do.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from rl360_ext.errors import Rl360Error
from rl360_ext.util.owner_thread import OwnerThread, on_lasting_thread

LOOPBACK = "127.0.0.1"
PR_SET_PDEATHSIG = 1
_SPAWNER = OwnerThread("rl360-procs-spawner")
_live: set[Service] = set()
_live_lock = threading.Lock()


def _load_prctl() -> Callable[[int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl = libc.prctl
        prctl.argtypes = (ctypes.c_int, ctypes.c_ulong)
        prctl.restype = ctypes.c_int
        return prctl
    return None


_PRCTL = _load_prctl()  # resolved before any fork: the child only calls it


def die_with_parent(parent_pid: int) -> Callable[[], None] | None:
    """A preexec_fn that makes the child get SIGTERM when its parent thread exits (Linux only).

    If the parent is already gone when the child gets there, the child exits at once."""
    if _PRCTL is None:
        return None
    prctl = _PRCTL

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


@atexit.register
def _stop_leftovers() -> None:
    """Services nobody stopped (a launcher that exited without `running`) stop with the process."""
    with _live_lock:
        leftovers = list(_live)
    for service in leftovers:
        with contextlib.suppress(Exception):
            service.stop()


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


class ServiceStartError(Rl360Error, RuntimeError):
    """A service exited or did not become ready in time; carries the tail of its log.

    `reason` is the one-line cause and `log_path` the service's log (the CLI prints both on one
    line); the message adds the log's tail.
    """

    def __init__(self, reason: str, log_path: Path | None = None, log_tail: str = "") -> None:
        super().__init__(f"{reason}; log:\n{log_tail}" if log_tail else reason)
        self.reason = reason
        self.log_path = log_path


@dataclass(eq=False)
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
        with _live_lock:
            _live.discard(self)
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


PORT_FLAG = "--port"
PORT_ATTEMPTS = 3  # starts on a new free port after another process took the one picked


def _port_taken(error: ServiceStartError) -> bool:
    return "address already in use" in str(error).lower()


def start_service(
    name: str,
    argv: Sequence[str],
    port: int,
    log_dir: Path,
    ready_path: str = "/health",
    ready_timeout_s: float = 60.0,
    env: dict[str, str] | None = None,
    stop_grace_s: float = 10.0,
    repick_port: bool = False,
) -> Service:
    """Start `argv` in its own process group with output to `log_dir/name.log`; wait for readiness.

    `repick_port`: `port` came from `free_port` and `argv` passes it as `--port PORT`. A port
    that was free a moment ago can be taken before the service binds it (other processes pick
    ports too: Ray's, another test's), so a service that exits on "address already in use" is
    started again on a new free port, up to `PORT_ATTEMPTS` times; the returned Service's `port`
    is the one it serves on."""
    attempt = 1
    while True:
        try:
            return _start_service(name, argv, port, log_dir, ready_path, ready_timeout_s, env, stop_grace_s)
        except ServiceStartError as error:
            if not (repick_port and attempt < PORT_ATTEMPTS and _port_taken(error)):
                raise
        attempt += 1
        position = list(argv).index(PORT_FLAG) + 1
        port = free_port()
        argv = [*argv[:position], str(port), *argv[position + 1 :]]


def _start_service(
    name: str,
    argv: Sequence[str],
    port: int,
    log_dir: Path,
    ready_path: str,
    ready_timeout_s: float,
    env: dict[str, str] | None,
    stop_grace_s: float,
) -> Service:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"

    def spawn() -> subprocess.Popen[bytes]:
        with log_path.open("wb") as log:
            return subprocess.Popen(
                list(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **(env or {})},
                preexec_fn=die_with_parent(os.getpid()),
            )

    process = on_lasting_thread(_SPAWNER, spawn)
    service = Service(name, list(argv), port, log_path, process, stop_grace_s)
    with _live_lock:
        _live.add(service)
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
