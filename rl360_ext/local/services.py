"""Starting the local stack's processes: tiny engines, the real SMG gateway and the Harbor `/run`
server, on loopback.

Owns the argv of each local service and the wait until SMG has registered its workers. Process
lifecycle itself (ports, readiness, stop) is `rl360_ext.util.procs`; which services a run needs is
`rl360_ext.local.stack`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from rl360_ext.util.prereqs import SMG_REMEDY, Unavailable
from rl360_ext.util.procs import (
    LOOPBACK,
    Service,
    ServiceStartError,
    find_executable,
    free_port,
    rl360_argv,
    start_service,
)

# SMG's own default (180 s) makes a SIGTERM'd gateway linger about 5 s even with nothing in flight;
# the local stack stops after its work is done, so 2 s (a stop in about 1 s) loses nothing.
SMG_SHUTDOWN_GRACE_S = 2


def start_engine(log_dir: Path, *args: str, port: int | None = None, name: str = "engine") -> Service:
    chosen, port = port, port or free_port()
    argv = rl360_argv("engine", "serve", "--host", LOOPBACK, "--port", str(port), *args)
    return start_service(name, argv, port, log_dir, repick_port=chosen is None)


def start_smg(
    worker_urls: Sequence[str],
    log_dir: Path,
    policy: str = "manual",
    extra: Sequence[str] = (),
    port: int | None = None,
    name: str = "smg",
) -> Service:
    """The real SMG gateway (`smg launch`) on loopback, Prometheus on loopback too, with a short
    shutdown grace (`SMG_SHUTDOWN_GRACE_S`; `extra` may set another)."""
    binary = find_executable("smg")
    if binary is None:
        raise Unavailable(f"the smg gateway binary is not installed: {SMG_REMEDY}")
    chosen, port = port, port or free_port()
    argv = [
        binary,
        "launch",
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--prometheus-host",
        LOOPBACK,
        "--prometheus-port",
        str(free_port()),
        "--policy",
        policy,
        "--shutdown-grace-period-secs",
        str(SMG_SHUTDOWN_GRACE_S),
        "--worker-urls",
        *worker_urls,
        *extra,
    ]
    service = start_service(
        name, argv, port, log_dir, ready_path="/health", stop_grace_s=15.0, repick_port=chosen is None
    )
    try:
        _wait_workers_registered(service, len(worker_urls))
    except BaseException:
        service.stop()
        raise
    return service


def start_harbor(
    log_dir: Path,
    tasks_root: Path,
    agent: str,
    *flags: str,
    name: str = "harbor",
    port: int | None = None,
) -> Service:
    """`rl360 harbor serve` with bubblewrap sandboxes over `tasks_root`, `agent` its default agent,
    `flags` any further serve flags (budgets, concurrency, trial folders)."""
    chosen, port = port, port or free_port()
    argv = rl360_argv(
        "harbor", "serve", "--host", LOOPBACK, "--port", str(port),
        "--tasks-root", str(tasks_root), "--env", "bwrap", "--agent", agent, *flags,
    )  # fmt: skip
    return start_service(
        name, argv, port, log_dir, ready_timeout_s=120, stop_grace_s=30, repick_port=chosen is None
    )


def _wait_workers_registered(service: Service, expected: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            body = httpx.get(service.url + "/workers", timeout=2.0).json()
            workers = body.get("workers", body) if isinstance(body, dict) else body
            healthy = [w for w in workers if w.get("is_healthy", True)]
            if len(healthy) >= expected:
                return
        time.sleep(0.1)
    service.stop()
    raise ServiceStartError(
        f"smg registered fewer than {expected} workers in {timeout_s}s", service.log_path, service.log_tail()
    )
