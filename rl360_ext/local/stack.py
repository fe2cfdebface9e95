"""The one launcher of the local stack: the processes a local run needs, started together and
always stopped together.

Owns starting and stopping, on loopback, what `rl360 demo`, the fault matrix (`rl360 bench
faults`, its integration test) and the benches run against: N tiny engines, the SMG gateway in
front of them, Harbor `/run` servers with bubblewrap sandboxes (as processes, or as a `HarborPool`
of Ray actors in the stack's Ray: `HarborPoolSpec`), and a local Ray instance for the session pool.
`StackConfig` says what one run needs (each field's docstring names who sets it); `preflight`
names everything missing in one line before anything starts (installing the missing host tools
with apt-get first, when asked and running as root); `local_stack(config)` is a context manager:
whatever happens inside it (an error, Ctrl-C), every process it started is stopped on the way
out, and `logs/services.json` in the output folder lists each one's pid, port and log, so a user
(or a test) can check that nothing is left. Process lifecycle itself is `rl360_ext.util.procs`,
each service's argv `rl360_ext.local.services`; the session pool belongs to the generate hook
(`rl360_ext.rollout.generate.shutdown_session_pool` stops it here, before Ray goes down; a Harbor
pool is shut down before that). It does not drive rollouts (`rl360_ext.local.demo.driver`,
`rl360_ext.local.bench.fault_matrix`).

The engine set can change while the stack runs (`rl360 demo --engine-churn`):
`LocalStack.add_engine` starts one more engine, loads the published weights into it directly and
only then adds it to SMG (`POST /workers`); `LocalStack.remove_engine` fences one (`DELETE
/workers/{id}`, SIGTERM, SIGKILL after `FENCE_GRACE_S`); engines started later are stopped with
the stack too.

The demo's stack is `rl360_ext.local.demo.stack`; the running engines and the gateway's worker
list are read and changed through `rl360_ext.local.engines`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from rl360_ext.harbor.pool import HarborPool
from rl360_ext.harbor.settings import HarborServerConfig
from rl360_ext.local.engines import (
    FENCE_GRACE_S,
    add_gateway_worker,
    end_process,
    remove_gateway_worker,
    wait_gateway_without,
)
from rl360_ext.local.fixtures import tasks_root as fixture_tasks_root
from rl360_ext.local.fixtures.quiz_agent import IMPORT_PATH as QUIZ_AGENT
from rl360_ext.local.local_ray import init_local_ray
from rl360_ext.local.services import start_engine, start_harbor, start_smg
from rl360_ext.reference.engine.faults import FaultKey
from rl360_ext.rollout.harbor_routing import replace_url
from rl360_ext.util.fielddocs import field_flags
from rl360_ext.util.prereqs import (
    bwrap_problem,
    ensure_host_tools,
    host_tools_problem,
    package_problem,
    require,
    smg_problem,
)
from rl360_ext.util.procs import LOOPBACK, Service
from rl360_ext.util.signals import handlers_kept

logger = logging.getLogger(__name__)

MANIFEST = "services.json"
RAY_OBJECT_STORE_BYTES = 256 * 1024**2
RAY_CPUS = 2


@dataclass(frozen=True)
class HarborServer:
    """One Harbor `/run` server of the stack (bubblewrap sandboxes over the stack's tasks)."""

    name: str = "harbor"
    """Service name; its log is `logs/<name>.log` (the fault matrix adds a `harbor-victim` that it
    stalls and kills)."""
    agent: str = QUIZ_AGENT
    """Default agent for `/run`, `module:Class` or a Harbor agent name (demo: the quiz agent; fault
    matrix: `rl360_ext.local.fixtures.agents:BashToolAgent`)."""
    flags: tuple[str, ...] = ()
    """Further `rl360 harbor serve` flags: concurrency, phase budgets, where trial folders go."""
    settings: Mapping[str, Any] = field(default_factory=dict)
    """`HarborServerConfig` field values (beyond tasks root, env and agent); the process gets them as
    the flags `rl360 harbor serve` derives from those fields, before `flags` (demo: concurrency,
    budgets, trial folders)."""

    def argv_flags(self) -> tuple[str, ...]:
        """`settings` as `rl360 harbor serve` flags, then `flags`."""
        return (*settings_flags(self.settings), *self.flags)

    def server_settings(self, tasks_root: Path) -> HarborServerConfig:
        """The `HarborServerConfig` a pool replica serves: what the process would get from its flags
        (`settings` only: `flags` are process flags)."""
        values = {"host": LOOPBACK, "env": "bwrap", "agent": (self.agent,), **self.settings}
        return HarborServerConfig(tasks_root=tasks_root, **values)


@dataclass(frozen=True)
class HarborPoolSpec:
    """The stack's Harbor `/run` servers as a `HarborPool` in the stack's local Ray."""

    server: HarborServer
    """What every replica serves (its `settings` and agent; `trials_dir` gets `replica-<i>/`)."""
    replicas: int = 2
    """Replicas (demo: `--harbor-replicas`)."""
    start_rate: tuple[int, float] | None = None
    """The pool-wide rolling-start limit `(starts, seconds)`, one Ray actor for every replica."""
    watchdog_s: float = 2.0
    """How often the pool's watchdog looks for a dead replica to replace."""
    actor_num_cpus: float = 0.0
    """Ray CPUs each replica asks for (the demo's Ray has 2, which its session servers take)."""


def settings_flags(values: Mapping[str, Any]) -> tuple[str, ...]:
    """`HarborServerConfig` field values as the `rl360 harbor serve` flags that set them."""
    return field_flags(HarborServerConfig, values)


@dataclass(frozen=True)
class StackConfig:
    """What one local run needs started."""

    out: Path
    """Output folder: `logs/` (one log per service, `services.json`) goes here (demo: `--out`;
    fault matrix: its work dir)."""
    engines: int = 1
    """Tiny engines (demo: `--engines`; fault matrix and benches: 1)."""
    engine_flags: tuple[str, ...] = ()
    """Extra `rl360 engine serve` flags for every engine (demo: `--seed`; r3 bench: a wide MoE shape)."""
    engine_faults: Mapping[str, Any] | None = None
    """`POST /rl360/faults` body each engine gets once up, its `seed` offset by the engine's number
    unless the draws are keyed by the attempt's sampling seed (demo with `--faults`: the 503 rate,
    keyed when the demo seeds each attempt's sampling); None: no faults (the fault matrix sets them
    per case)."""
    gateway: bool = True
    """Start the SMG gateway (policy manual) in front of the engines (the r3 bench talks to the engine)."""
    gateway_flags: tuple[str, ...] = ()
    """Extra `smg launch` flags (demo: `--enable-rl` for the weight fan-out; with faults also
    `--disable-retries --disable-circuit-breaker`)."""
    harbors: tuple[HarborServer, ...] = ()
    """Harbor `/run` servers; any of them makes bubblewrap and the harbor extra prerequisites."""
    harbor_pool: HarborPoolSpec | None = None
    """Harbor `/run` servers as Ray actors (demo: `--harbor-replicas` 2 or more); needs `ray`."""
    tasks_root: Path | None = None
    """Tasks the Harbor servers serve; None: rl360's fixtures in place (the fault matrix serves a copy)."""
    tokenizer_dir: Path | None = None
    """Where to write the tiny engine's tokenizer for the session servers (demo: `<out>/tokenizer`);
    None: the tiny engine's cached copy (`default_tokenizer_dir`)."""
    ray: bool = True
    """Start a local Ray instance (`num_cpus=2`, no dashboard) for the generate hook's session pool."""
    reuse_ray: bool = False
    """Use the Ray instance this process already runs, if any (the fault matrix under pytest, the
    runs of `rl360 demo --compare` inside `shared_ray`); False: refuse to start when one runs (the
    demo owns its Ray and shuts it down)."""
    host_tools: tuple[str, ...] = ()
    """Host executables the run needs beyond bubblewrap (demo: tmux, for Harbor's shell agents)."""

    def prerequisites(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(host executables, Python packages) this run needs."""
        harbor = bool(self.harbors or self.harbor_pool)
        tools = (*(("bwrap",) if harbor else ()), *self.host_tools)
        return tuple(dict.fromkeys(tools)), (("harbor",) if harbor else ())


def preflight(config: StackConfig, what: str = "the local stack", *, install: bool = False) -> None:
    """Raise Unavailable naming everything `config` needs and this machine lacks, in one line, before
    anything starts. With `install`, missing host tools are first installed with apt-get when this
    process runs as root with apt-get (a first run in CI)."""
    tools, packages = config.prerequisites()
    ensure_host_tools(tools, install=install)
    problems = [smg_problem() if config.gateway else None, host_tools_problem(tools)]
    if "bwrap" in tools and host_tools_problem(["bwrap"]) is None:
        problems.append(bwrap_problem())
    problems += [package_problem(name) for name in packages]
    require(what, problems)


@dataclass
class LocalStack:
    """The running services and where their files go."""

    out: Path
    logs: Path
    tokenizer_dir: Path
    tasks_root: Path
    engines: list[Service] = field(default_factory=list)
    smg: Service | None = None
    harbors: dict[str, Service] = field(default_factory=dict)
    harbor_pool: HarborPool | None = None
    ray_address: str | None = None
    session_servers: list[str] = field(default_factory=list)
    started: list[Service] = field(default_factory=list)
    """Every process the stack stops on exit (engines started later, by `add_engine`, join it)."""
    engine_flags: tuple[str, ...] = ()
    """`rl360 engine serve` flags of every engine, a replacement's too (`StackConfig.engine_flags`)."""
    engines_started: int = 0
    """Engines started so far: the next one is `engine<N>`."""

    @property
    def gateway_url(self) -> str:
        assert self.smg is not None
        return self.smg.url

    @property
    def harbor(self) -> Service:
        """The first Harbor server."""
        return next(iter(self.harbors.values()))

    @property
    def harbor_urls(self) -> str:
        """Every Harbor server's URL (processes, then pool replicas), comma-separated, as the agent
        function's --rl360-harbor-url."""
        pool = self.harbor_pool.urls if self.harbor_pool is not None else []
        return ",".join([*(server.url for server in self.harbors.values()), *pool])

    def harbor_replicas(self) -> list[dict[str, Any]]:
        """The Harbor pool's replicas (index, URL, node, pid, generation, attempts served), if any."""
        return [] if self.harbor_pool is None else self.harbor_pool.stats()

    def services(self) -> list[Service]:
        return [*self.harbors.values(), *([self.smg] if self.smg else []), *self.engines]

    def set_engine_faults(self, faults: Mapping[str, Any] | None) -> None:
        """`POST /rl360/faults` on each live engine; None clears them. The `seed` is offset by the
        engine's number (independent streams), except when the draws are keyed by the attempt's
        sampling seed: then every engine must draw the same for the same attempt."""
        keyed = (faults or {}).get("draw_by") == FaultKey.SAMPLING_SEED
        for number, engine in enumerate(self.engines):
            if not engine.alive():
                continue
            body = dict(faults or {})
            if "seed" in body and not keyed:
                body["seed"] = body["seed"] + number
            httpx.post(f"{engine.url}/rl360/faults", json=body, timeout=10.0).raise_for_status()

    def add_engine(self, model_path: str | None = None, weight_version: str | None = None) -> Service:
        """Start one more engine and bring it into the gateway the way a replacement joins: first
        its weights (`model_path` as `weight_version`, loaded directly: the gateway does not route
        to it yet), then `POST /workers`, then wait until the gateway lists it healthy. It is
        stopped with the stack."""
        from rl360_ext.weights.push import load_engine

        name = f"engine{self.engines_started}"
        self.engines_started += 1
        service = start_engine(self.logs, *self.engine_flags, name=name)
        self.started.append(service)
        if model_path is not None and weight_version is not None:
            load_engine(service.url, model_path, weight_version)
        if self.smg is not None:
            add_gateway_worker(self.gateway_url, service.url)
        self.engines = [*self.engines, service]
        self.write_manifest()
        return service

    def remove_engine(self, url: str, grace_s: float = FENCE_GRACE_S) -> dict[str, Any]:
        """Fence one engine: remove it from the gateway (`DELETE /workers/{id}`), then end its
        process (SIGTERM; one that has not exited within `grace_s`, as a hung engine does not,
        gets SIGKILL), then wait until the gateway no longer lists it. Returns what it took."""
        started = time.monotonic()
        engine = next((e for e in self.engines if e.url == url), None)
        removed = remove_gateway_worker(self.gateway_url, url) if self.smg is not None else False
        shutdown = "gone"
        if engine is not None:
            shutdown = end_process(engine, grace_s)
            self.engines = [e for e in self.engines if e is not engine]
            self.write_manifest()
        gone = wait_gateway_without(self.gateway_url, url) if self.smg is not None else True
        return {
            "url": url,
            "name": None if engine is None else engine.name,
            "removed_from_gateway": removed,
            "gateway_dropped": gone,
            "shutdown": shutdown,
            "seconds": time.monotonic() - started,
        }

    def manifest(self) -> dict[str, Any]:
        """Every process and port the stack opened (pids of Ray's own processes are Ray's)."""
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
        pool = self.harbor_pool
        return {
            "services": entries,
            "ray_gcs_address": self.ray_address,
            "session_servers": list(self.session_servers),
            "harbor_replicas": [
                {"index": r.index, "url": r.url, "node_id": r.node_id, "pid": r.pid, "loop": r.loop}
                for r in (pool.replicas if pool is not None else [])
            ],
        }

    def write_manifest(self) -> Path:
        path = self.logs / MANIFEST
        path.write_text(json.dumps(self.manifest(), indent=2) + "\n")
        return path


def _start_all(
    starters: dict[str, Callable[[], Service]],
    started: list[Service],
    meanwhile: Callable[[], None] = lambda: None,
) -> dict[str, Service]:
    """Start services in parallel, and run `meanwhile` in this thread while they start (Ray's start,
    which wants the main thread); every service that came up lands in `started` (even on Ctrl-C or
    when `meanwhile` fails), then the first failure is raised."""
    pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=max(len(starters), 1), thread_name_prefix="rl360-start"
    )
    futures = {name: pool.submit(start) for name, start in starters.items()}
    try:
        meanwhile()
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
    """Stop services in parallel, so their drains overlap. A stopped (SIGSTOP) service is continued
    first, so it can take its SIGTERM."""

    def stop(service: Service) -> None:
        try:
            with contextlib.suppress(ProcessLookupError):
                os.kill(service.pid, signal.SIGCONT)
            service.stop()
        except Exception:  # keep stopping the others; the log says which one resisted
            logger.exception("rl360 stack: stopping %s (pid %s) failed", service.name, service.pid)

    threads = [threading.Thread(target=stop, args=(s,), name=f"rl360-stop-{s.name}") for s in services]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _start_ray(reuse: bool) -> tuple[str, bool]:
    """(GCS address, whether this call started Ray)."""
    import ray

    if ray.is_initialized():
        if not reuse:
            raise RuntimeError("rl360 demo starts its own local Ray instance; call ray.shutdown() first")
        return str(ray.get_runtime_context().gcs_address), False
    with handlers_kept():  # Ray's SIGTERM handler would end the run without stopping its stack
        context = init_local_ray(
            num_cpus=RAY_CPUS,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
            object_store_memory=RAY_OBJECT_STORE_BYTES,
        )
    return str(context.address_info.get("gcs_address", "")), True


@contextlib.contextmanager
def shared_ray() -> Iterator[str]:
    """Local Ray, as a stack starts it, for several stacks in turn (each with `reuse_ray`): started
    here, shut down on exit; each stack still stops its own session pool and Harbor actors. Yields
    the GCS address."""
    import ray

    address, _ = _start_ray(reuse=False)  # raises where this process already runs Ray
    try:
        yield address
    finally:
        ray.shutdown()


def _stop_ray(started_here: bool) -> None:
    from rl360_ext.rollout.generate import shutdown_session_pool

    try:
        shutdown_session_pool()
    finally:
        if started_here:
            import ray

            ray.shutdown()


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """While the stack stops, another Ctrl-C (or SIGTERM) must not cut the cleanup short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def ignore(signum: int, frame: Any) -> None:
        print("rl360: still stopping the processes it started; this takes a few seconds", flush=True)

    previous = {sig: signal.signal(sig, ignore) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _tokenizer_dir(config: StackConfig) -> Path:
    from rl360_ext.reference.engine.tokenizer import default_tokenizer_dir, write_tokenizer_dir

    if config.tokenizer_dir is None:
        return default_tokenizer_dir()
    return write_tokenizer_dir(config.tokenizer_dir)


@contextlib.contextmanager
def local_stack(config: StackConfig, what: str = "the local stack") -> Iterator[LocalStack]:
    """Start everything `config` needs; stop all of it on exit, whatever the exit."""
    preflight(config, what)
    logs = config.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    started: list[Service] = []
    stack = LocalStack(
        out=config.out,
        logs=logs,
        tokenizer_dir=_tokenizer_dir(config),
        tasks_root=config.tasks_root or fixture_tasks_root(),
        started=started,
        engine_flags=config.engine_flags,
        engines_started=config.engines,
    )
    ray_started = ray_touched = False

    def start_ray() -> None:
        nonlocal ray_started, ray_touched
        if config.ray or config.harbor_pool is not None:
            ray_touched = True
            stack.ray_address, ray_started = _start_ray(config.reuse_ray)

    try:
        starters: dict[str, Callable[[], Service]] = {
            f"engine{i}": _engine_starter(config, logs, i) for i in range(config.engines)
        }
        for server in config.harbors:
            starters[f"harbor:{server.name}"] = _harbor_starter(server, stack.tasks_root, logs)
        services = _start_all(starters, started, meanwhile=start_ray)  # Ray starts as they do
        stack.engines = [services[f"engine{i}"] for i in range(config.engines)]
        stack.harbors = {server.name: services[f"harbor:{server.name}"] for server in config.harbors}
        if config.engine_faults:
            stack.set_engine_faults(config.engine_faults)
        if config.gateway:
            stack.smg = start_smg([e.url for e in stack.engines], logs, extra=config.gateway_flags)
            started.append(stack.smg)
        if config.harbor_pool is not None:
            stack.harbor_pool = _start_harbor_pool(config.harbor_pool, stack.tasks_root)
        stack.write_manifest()
        yield stack
    finally:
        with _interrupts_deferred():
            stopper = threading.Thread(target=_stop_all, args=(started,), name="rl360-stop")
            stopper.start()
            try:
                if stack.harbor_pool is not None:
                    stack.harbor_pool.shutdown()
            finally:
                try:
                    if ray_touched:
                        _stop_ray(ray_started)
                finally:
                    stopper.join()


def _start_harbor_pool(spec: HarborPoolSpec, tasks_root: Path) -> HarborPool:
    """The spec's pool in this process's Ray, its watchdog running; a replacement on a new URL is
    swapped into this process's Harbor routers (the demo's agent function runs here)."""
    pool = HarborPool(
        spec.server.server_settings(tasks_root),
        spec.replicas,
        start_rate=spec.start_rate,
        host=LOOPBACK,
        actor_num_cpus=spec.actor_num_cpus,
        on_replace=replace_url,
    )
    pool.start_watchdog(spec.watchdog_s)
    return pool


def _engine_starter(config: StackConfig, logs: Path, number: int) -> Callable[[], Service]:
    return lambda: start_engine(logs, *config.engine_flags, name=f"engine{number}")


def _harbor_starter(server: HarborServer, tasks_root: Path, logs: Path) -> Callable[[], Service]:
    return lambda: start_harbor(logs, tasks_root, server.agent, *server.argv_flags(), name=server.name)
