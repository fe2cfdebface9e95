"""The processes `rl360 demo` runs, started together and always stopped together.

Owns the demo's service stack on loopback: N tiny engines, the SMG gateway in front of them
(policy manual, `--enable-rl` for the weight fan-out), a local Ray instance for the session
pool, and the Harbor `/run` server with the bubblewrap sandbox, the demo quiz tasks and the demo
quiz agent. `demo_stack(config)` is a context manager: whatever happens inside it (an error,
Ctrl-C), every process it started is stopped on the way out, and `logs/services.json` in the
output folder lists each one's pid, port and log, so a user (or a test) can check that nothing
is left. Process lifecycle itself is `rl360_ext.util.procs`; the session pool belongs to the generate
hook (`rl360_ext.rollout.generate.shutdown_session_pool` stops it here, before Ray goes down).
It does not drive rollouts (`rl360_ext.local.demo`).

With `--faults` above 0, SMG runs with `--disable-retries --disable-circuit-breaker`: by default
SMG retries a 503 up to five times and opens a circuit after ten failures, which would hide the
injected engine 503s (or take a whole engine out for a minute) instead of letting them reach the
agent, where the demo shows them masked.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib.util
import json
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from rl360_ext.local.demo_plan import DemoConfig
from rl360_ext.local.fixtures import tasks_root
from rl360_ext.local.quiz_agent import IMPORT_PATH as QUIZ_AGENT
from rl360_ext.local.services import start_engine, start_smg
from rl360_ext.util.procs import (
    LOOPBACK,
    Service,
    find_executable,
    free_port,
    rl360_argv,
    start_service,
)

logger = logging.getLogger(__name__)

MANIFEST = "services.json"
HARBOR_BUDGET_FLAGS = (
    # Phase budgets sized for the quiz tasks (the defaults are for real coding tasks: 120 s setup).
    "--env-setup-s", "20",
    "--agent-setup-s", "5",
    "--max-verifier-s", "20",
    "--margin-s", "3",
    "--min-agent-s", "5",
)  # fmt: skip
RAY_OBJECT_STORE_BYTES = 256 * 1024**2


class DemoUnavailable(RuntimeError):
    """Something the demo needs is missing on this machine; the message says what to install."""


def preflight() -> None:
    """Fail before starting anything when a required component is missing."""
    missing = []
    if find_executable("smg") is None:
        missing.append("the smg gateway (pip install smg)")
    if find_executable("bwrap") is None:
        missing.append("bubblewrap for the sandboxes (apt-get install bubblewrap)")
    if importlib.util.find_spec("harbor") is None:
        missing.append("Harbor for the /run server (pip install 'rl360-ext[harbor]', Python >= 3.12)")
    if missing:
        raise DemoUnavailable("rl360 demo needs " + "; ".join(missing))


@dataclass
class DemoStack:
    """The running services and where their files go."""

    out: Path
    logs: Path
    tokenizer_dir: Path
    engines: list[Service] = field(default_factory=list)
    smg: Service | None = None
    harbor: Service | None = None
    ray_address: str | None = None
    session_servers: list[str] = field(default_factory=list)

    @property
    def gateway_url(self) -> str:
        assert self.smg is not None
        return self.smg.url

    @property
    def harbor_url(self) -> str:
        assert self.harbor is not None
        return self.harbor.url

    def services(self) -> list[Service]:
        return [s for s in (self.harbor, self.smg, *self.engines) if s is not None]

    def manifest(self) -> dict[str, Any]:
        """Every process and port the demo opened (pids of Ray's own processes are Ray's)."""
        entries = []
        for service in self.services():
            ports = [service.port]
            if "--prometheus-port" in service.argv:
                ports.append(int(service.argv[service.argv.index("--prometheus-port") + 1]))
            entries.append(
                {
                    "name": service.name,
                    "pid": service.pid,
                    "url": service.url,
                    "ports": ports,
                    "log": str(service.log_path),
                }
            )
        return {
            "services": entries,
            "ray_gcs_address": self.ray_address,
            "session_servers": list(self.session_servers),
        }

    def write_manifest(self) -> Path:
        path = self.logs / MANIFEST
        path.write_text(json.dumps(self.manifest(), indent=2) + "\n")
        return path


def _start_all(starters: dict[str, Callable[[], Service]], started: list[Service]) -> dict[str, Service]:
    """Start services in parallel; every one that came up lands in `started` (even on Ctrl-C), then
    the first failure is raised."""
    pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=len(starters), thread_name_prefix="rl360-demo-start"
    )
    futures = {name: pool.submit(start) for name, start in starters.items()}
    try:
        concurrent.futures.wait(futures.values())
    finally:
        pool.shutdown(wait=True)  # a starter interrupted by Ctrl-C still finishes, so its process is known
        for future in futures.values():
            if not future.cancelled() and future.exception() is None:
                started.append(future.result())
    for future in futures.values():
        if future.exception() is not None:
            raise future.exception()  # type: ignore[misc]
    return {name: future.result() for name, future in futures.items()}


def _stop_all(services: list[Service]) -> None:
    """Stop services in parallel (SMG drains for 5-7 s on SIGTERM; nobody waits for it twice)."""

    def stop(service: Service) -> None:
        try:
            service.stop()
        except Exception:  # keep stopping the others; the log says which one resisted
            logger.exception("rl360 demo: stopping %s (pid %s) failed", service.name, service.pid)

    threads = [threading.Thread(target=stop, args=(s,), name=f"rl360-demo-stop-{s.name}") for s in services]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _harbor(config: DemoConfig, logs: Path) -> Service:
    port = free_port()
    argv = rl360_argv(
        "harbor", "serve", "--host", LOOPBACK, "--port", str(port),
        "--tasks-root", str(tasks_root()),
        "--env", "bwrap",
        "--agent", QUIZ_AGENT,
        "--max-concurrent", str(max(8, config.tasks * config.attempts)),
        "--trials-dir", str(config.out / "trials"),
        "--keep-trials", "failed",
        *HARBOR_BUDGET_FLAGS,
    )  # fmt: skip
    return start_service("harbor", argv, port, logs, ready_timeout_s=120, stop_grace_s=30)


def _engine(config: DemoConfig, logs: Path, number: int) -> Callable[[], Service]:
    flags = ("--seed", str(config.seed), "--dtype", config.engine_dtype)
    return lambda: start_engine(logs, *flags, name=f"engine{number}")


def _set_engine_faults(engines: list[Service], error_rate: float, seed: int) -> None:
    for number, engine in enumerate(engines):
        response = httpx.post(
            f"{engine.url}/rl360/faults", json={"error_rate": error_rate, "seed": seed + number}, timeout=10.0
        )
        response.raise_for_status()


def engine_fault_counts(engines: list[Service]) -> dict[str, int]:
    """503s each engine injected so far (GET /rl360/faults), by engine name."""
    counts = {}
    for engine in engines:
        try:
            body = httpx.get(f"{engine.url}/rl360/faults", timeout=10.0).json()
            counts[engine.name] = int(body.get("injected", {}).get("unavailable", 0))
        except (httpx.HTTPError, ValueError):
            counts[engine.name] = -1
    return counts


def _start_ray() -> str:
    import ray

    if ray.is_initialized():
        raise DemoUnavailable("rl360 demo starts its own local Ray instance; call ray.shutdown() first")
    context = ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
        object_store_memory=RAY_OBJECT_STORE_BYTES,
    )
    return str(context.address_info.get("gcs_address", ""))


def _stop_ray() -> None:
    import ray

    from rl360_ext.rollout.generate import shutdown_session_pool

    try:
        shutdown_session_pool()
    finally:
        ray.shutdown()


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """While the stack stops, another Ctrl-C (or SIGTERM) must not cut the cleanup short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def ignore(signum: int, frame: Any) -> None:
        print("rl360 demo: still stopping the processes it started; this takes a few seconds", flush=True)

    previous = {sig: signal.signal(sig, ignore) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def demo_stack(config: DemoConfig) -> Iterator[DemoStack]:
    """Start everything the demo needs; stop all of it on exit, whatever the exit."""
    from rl360_ext.tiny_engine.tokenizer import write_tokenizer_dir

    preflight()
    logs = config.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stack = DemoStack(out=config.out, logs=logs, tokenizer_dir=write_tokenizer_dir(config.out / "tokenizer"))
    started: list[Service] = []
    ray_started = False
    try:
        starters = {f"engine{i}": _engine(config, logs, i) for i in range(config.engines)}
        starters["harbor"] = lambda: _harbor(config, logs)
        services = _start_all(starters, started)
        stack.engines = [services[f"engine{i}"] for i in range(config.engines)]
        stack.harbor = services["harbor"]
        extra = ["--enable-rl"]
        if config.faults > 0:
            extra += ["--disable-retries", "--disable-circuit-breaker"]
            _set_engine_faults(stack.engines, config.engine_error_rate, config.seed)
        stack.smg = start_smg([e.url for e in stack.engines], logs, policy="manual", extra=extra)
        started.append(stack.smg)
        ray_started = True
        stack.ray_address = _start_ray()
        stack.write_manifest()
        yield stack
    finally:
        with _interrupts_deferred():
            stopper = threading.Thread(target=_stop_all, args=(started,), name="rl360-demo-stop")
            stopper.start()
            try:
                if ray_started:
                    _stop_ray()
            finally:
                stopper.join()
