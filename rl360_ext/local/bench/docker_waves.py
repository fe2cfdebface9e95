"""`rl360 bench harbor --env docker`: launch waves and image pinning against real pulls, and
reservations against a heavy neighbour, on real Docker engines on this machine.

Owns two measurements (`rl360 containers up` must run: its registry holds the images).

Waves and pinning: `attempts` /run attempts over `groups` image groups (each group an image of the
stack's base plus its own `group_mb` layer, pushed to the stack's registry), from a cold cache: each
arm starts two engines with fresh data roots (two nodes, labels a and b) whose registry mirror is a
loopback proxy in front of the registry that answers 429 or 503 (alternately) to a blob download
above `blob_limit` at once, an overloaded registry. One `rl360 harbor serve --env docker --nodes
a,b` per arm, `node_hosts` mapping each label to its engine. Arms, side by side: all at once vs
`--rolling-start-size wave_size` waves every `wave_interval_s`; placed anywhere (each attempt its
own image group label, so rendezvous hashing spreads one image over both nodes) vs pinned by image
group (one label per image: each image is pulled by one node). Per arm: attempts graded, failed
starts (no_sandbox), pull retries (the server's), refused blob downloads (the proxy's), blob
downloads served, time to the first and last attempt running, and cache hits (attempts whose image
its node already had or was already pulling).

Reservations: one heavy build (CPU burners on every core and `heavy_mb` of memory) beside five
light sandboxes that each time a fixed step every 50 ms, all under one parent cgroup of
`node_mb` (the node's memory), with and without per-container reservations (light: 0.25 cpus,
128 MB; heavy: 1 cpu, 512 MB). Per arm: the light steps' p50, p95 and max, and OOM kills (light,
heavy). It asserts nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from rl360_ext.containers import StackPaths
from rl360_ext.containers.engine import docker
from rl360_ext.containers.paths import Process
from rl360_ext.containers.stack import start_dockerd, stop_process
from rl360_ext.util.prereqs import Unavailable
from rl360_ext.util.procs import free_port, rl360_argv, start_service


@dataclass(frozen=True)
class WavesModel:
    attempts: int = 16
    groups: int = 4
    group_mb: int = 16
    blob_limit: int = 2
    wave_size: int = 4
    wave_interval_s: float = 3.0
    deadline_s: float = 600.0


@dataclass
class Arm:
    name: str
    graded: int = 0
    failed_starts: int = 0
    pull_retries: int = 0
    refused_blobs: int = 0
    served_blobs: int = 0
    first_running_s: float | None = None
    last_running_s: float | None = None
    cache_hits: int = 0
    causes: dict[str, int] = field(default_factory=dict)


class BlobLimiter:
    """A loopback proxy in front of a registry: at most `limit` blob downloads at once, the next
    answered 429 or 503 (alternately); counts what it served and refused."""

    def __init__(self, upstream: str, limit: int) -> None:
        self.upstream, self.limit = upstream, limit
        self.active = self.served = self.refused = 0
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def reset(self) -> None:
        self.served = self.refused = 0

    async def _handle(self, request: Any) -> Any:
        from aiohttp import ClientSession, web

        blob = request.method == "GET" and "/blobs/" in request.path
        if blob and self.active >= self.limit:
            self.refused += 1
            status = 429 if self.refused % 2 else 503
            body = {"errors": [{"code": "TOOMANYREQUESTS", "message": "overloaded"}]}
            return web.json_response(body, status=status, headers={"Retry-After": "1"})
        if blob:
            self.active += 1
            self.served += 1
        try:
            headers = {
                k: v for k, v in request.headers.items() if k.lower() not in {"host", "content-length"}
            }
            data = await request.read()
            async with ClientSession() as session, session.request(
                request.method, f"http://{self.upstream}{request.path_qs}", headers=headers,
                data=data or None, allow_redirects=False,
            ) as upstream:  # fmt: skip
                response = web.StreamResponse(status=upstream.status)
                for key, value in upstream.headers.items():
                    if key.lower() not in {"transfer-encoding", "connection", "content-encoding"}:
                        response.headers[key] = value
                await response.prepare(request)
                async for chunk in upstream.content.iter_chunked(1 << 16):
                    await response.write(chunk)
                await response.write_eof()
                return response
        finally:
            if blob:
                self.active -= 1

    def __enter__(self) -> BlobLimiter:
        from aiohttp import web

        self._thread.start()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        asyncio.run_coroutine_threadsafe(self._runner.setup(), self._loop).result(10)
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        asyncio.run_coroutine_threadsafe(site.start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        asyncio.run_coroutine_threadsafe(self._loop.shutdown_default_executor(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def _stack() -> tuple[StackPaths, str]:
    paths = StackPaths.default()
    record = paths.read()
    if record is None or record.dockerd is None or not record.dockerd.alive():
        raise Unavailable("rl360 bench harbor --env docker needs the container stack: rl360 containers up")
    return paths, f"127.0.0.1:{record.registry_port}"


def push_group_images(paths: StackPaths, registry: str, model: WavesModel, scratch: Path) -> list[str]:
    """One image per group on the stack's registry (the base plus a `group_mb` layer of its own)."""
    names = []
    for group in range(model.groups):
        name = f"rl360-bench-g{group}:1"
        context = scratch / f"g{group}"
        context.mkdir(parents=True, exist_ok=True)
        (context / "Dockerfile").write_text(
            f"FROM python:3.12-slim\nRUN head -c {model.group_mb}M /dev/urandom > /opt/group-{group}.bin\n"
        )
        remote = f"{registry}/library/{name}"
        docker(
            paths.docker_host, "build", "--network", "none", "-q", "-t", remote, str(context), timeout_s=300
        )
        docker(paths.docker_host, "push", remote, timeout_s=300)
        names.append(name)
    return names


def write_tasks(root: Path, images: list[str], model: WavesModel, *, pinned: bool) -> list[str]:
    """`attempts` tasks, attempt i on image i mod groups; image group label per image (pinned) or
    per attempt (anywhere)."""
    names = []
    for i in range(model.attempts):
        group = i % len(images)
        task = root / f"a{i:02d}"
        for sub in ("environment", "solution", "tests"):
            (task / sub).mkdir(parents=True, exist_ok=True)
        (task / "environment" / "Dockerfile").write_text(f"FROM {images[group]}\nWORKDIR /app\n")
        (task / "instruction.md").write_text("Create /app/done.\n")
        (task / "solution" / "solve.sh").write_text("#!/bin/bash\ntouch /app/done\n")
        (task / "tests" / "test.sh").write_text(
            "#!/bin/bash\nif [ -f /app/done ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
        )
        label = f"g{group}" if pinned else f"g{group}-a{i}"
        (task / "task.toml").write_text(
            f'schema_version = "1.4"\n\n[metadata]\nimage_group = "{label}"\n\n'
            "[verifier]\ntimeout_sec = 30.0\n\n[agent]\ntimeout_sec = 30.0\n\n"
            '[environment]\nbuild_timeout_sec = 180.0\nnetwork_mode = "no-network"\n'
            "cpus = 0.25\nmemory_mb = 128\n"
        )
        names.append(task.name)
    return names


@contextlib.contextmanager
def _nodes(scratch: Path, mirror: str) -> Iterator[dict[str, str]]:
    """Two engines with fresh data roots (labels a, b), `mirror` their registry mirror."""
    started: list[tuple[StackPaths, Process]] = []
    try:
        for label in ("a", "b"):
            paths = StackPaths(scratch / f"node-{label}")
            started.append((paths, start_dockerd(paths, mirror)))
        yield {f"{p.root.name[-1]}": p.docker_host for p, _ in started}
    finally:
        for paths, process in started:
            with contextlib.suppress(Exception):
                ids = docker(paths.docker_host, "ps", "--all", "--quiet", check=False).split()
                if ids:
                    docker(paths.docker_host, "rm", "--force", *ids, check=False)
            stop_process(process, f"dockerd {paths.root.name}", say=lambda line: None)


async def _run(url: str, tasks: list[str], deadline_s: float) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=url, timeout=deadline_s + 60) as http:
        bodies = [{"task": task, "deadline_s": deadline_s, "agent": "oracle"} for task in tasks]
        responses = await asyncio.gather(*(http.post("/run", json=body) for body in bodies))
    return [response.json() for response in responses]


def run_arm(
    name: str,
    root: Path,
    tasks: list[str],
    proxy: BlobLimiter,
    model: WavesModel,
    scratch: Path,
    *,
    waves: bool,
) -> Arm:
    arm = Arm(name)
    proxy.reset()
    with _nodes(scratch / name, f"127.0.0.1:{proxy.port}") as hosts:
        flags = ["--nodes", "a,b", "--env-kwarg", f"node_hosts={json.dumps(hosts)}", "--max-concurrent"]
        flags += [str(model.attempts), "--env-setup-s", "180", "--keep-trials", "none"]
        if waves:
            flags += ["--rolling-start-size", str(model.wave_size)]
            flags += ["--rolling-start-interval", str(model.wave_interval_s)]
        logs = scratch / name / "logs"
        port = free_port()
        argv = rl360_argv(
            "harbor", "serve", "--env", "docker", "--tasks-root", str(root), "--host", "127.0.0.1",
            "--port", str(port), "--trials-dir", str(logs / "trials"), *flags,
        )  # fmt: skip
        service = start_service(f"harbor-{name}", argv, port, logs, ready_timeout_s=90, stop_grace_s=60)
        try:
            started = time.time()
            results = asyncio.run(_run(service.url, tasks, model.deadline_s))
        finally:
            service.stop()
        arm.pull_retries = (
            (logs / f"harbor-{name}.log").read_text(errors="replace").count("image pull refused")
        )
    arm.refused_blobs, arm.served_blobs = proxy.refused, proxy.served
    running = [  # when each sandbox was up: its start plus its environment setup
        r["timeline"]["sandbox_started_at"] + (r["phase_timings"].get("environment_setup") or 0.0) - started
        for r in results
        if r.get("timeline", {}).get("sandbox_started_at")
    ]
    arm.first_running_s = min(running) if running else None
    arm.last_running_s = max(running) if running else None
    arm.graded = sum(1 for r in results if r.get("reward") is not None)
    for r in results:
        if r.get("failure_cause"):
            arm.causes[r["failure_cause"]] = arm.causes.get(r["failure_cause"], 0) + 1
            arm.failed_starts += r.get("phase_timings", {}).get("agent") is None
    ran = [r for r in results if r.get("placement") and r.get("timeline", {}).get("sandbox_started_at")]
    pulled = {(r["placement"]["node_label"], int(r["task"][1:]) % model.groups) for r in ran}
    arm.cache_hits = len(ran) - len(pulled)
    return arm


def waves_and_pinning(model: WavesModel) -> list[Arm]:
    paths, registry = _stack()
    with tempfile.TemporaryDirectory(prefix="rl360-bench-docker-", dir="/var/tmp") as tmp:
        scratch = Path(tmp)
        images = push_group_images(paths, registry, model, scratch / "images")
        roots = {}
        for pinned in (False, True):
            roots[pinned] = scratch / ("tasks-pinned" if pinned else "tasks-anywhere")
            tasks = write_tasks(roots[pinned], images, model, pinned=pinned)
        arms = []
        with BlobLimiter(registry, model.blob_limit) as proxy:
            for waves in (False, True):
                for pinned in (False, True):
                    name = f"{'waves' if waves else 'all-at-once'}/{'pinned' if pinned else 'anywhere'}"
                    arms.append(
                        run_arm(
                            name.replace("/", "-"), roots[pinned], tasks, proxy, model, scratch, waves=waves
                        )
                    )
                    arms[-1].name = name
                    print(json.dumps(asdict(arms[-1])), file=sys.stderr, flush=True)  # progress
    return arms


# -- reservations ---------------------------------------------------------------------------------

_LIGHT = (
    "import time, json, sys\n"
    "steps = []\n"
    "end = time.monotonic() + {seconds}\n"
    "while time.monotonic() < end:\n"
    "    t = time.monotonic(); sum(i * i for i in range(20000)); steps.append(time.monotonic() - t)\n"
    "    time.sleep(0.05)\n"
    "print(json.dumps(steps), flush=True)\n"
    "time.sleep(600)\n"
)
_HEAVY = (
    "import multiprocessing as mp, time\n"
    "def burn(mb):\n"
    "    block = bytearray(mb * 2**20); end = time.monotonic() + {seconds}\n"
    "    while time.monotonic() < end: sum(range(100000))\n"
    "if __name__ == '__main__':\n"
    "    ps = [mp.Process(target=burn, args=({heavy_mb} // 4,)) for _ in range(4)]\n"
    "    [p.start() for p in ps]; [p.join() for p in ps]\n"
    "    time.sleep(600)\n"
)
_NODE_CGROUP = "rl360-bench-node"
_IMAGE = "python:3.12-slim"


@dataclass
class ReservationArm:
    name: str
    light_p50_ms: float
    light_p95_ms: float
    light_max_ms: float
    oom_light: int
    oom_heavy: int
    oom_node: int


def _oom_kills(host: str, container: str) -> int:
    """OOM kills in a running container's own memory cgroup."""
    from rl360_ext.harbor.envs.docker import cgroup_counter, cgroup_files

    pid = docker(host, "inspect", "--format", "{{.State.Pid}}", container, check=False).strip()
    with contextlib.suppress(OSError, ValueError, KeyError):
        files = cgroup_files(Path(f"/proc/{pid}/cgroup").read_text())
        return cgroup_counter(files["memory"].read_text(), "oom_kill")
    return 0


def _exit_code(host: str, container: str) -> int | None:
    state = docker(
        host, "inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", container, check=False
    )
    running, _, code = state.strip().partition(" ")
    return None if running == "true" else int(code or 0)


def _light_steps(host: str, lights: list[str], timeout_s: float) -> tuple[list[float], int]:
    """Every light sandbox's step times (once each printed them) and how many were killed."""
    deadline = time.monotonic() + timeout_s
    done: dict[str, list[float]] = {}
    killed = 0
    while len(done) + killed < len(lights) and time.monotonic() < deadline:
        for light in lights:
            if light in done:
                continue
            out = docker(host, "logs", light, check=False).strip()
            if out:
                done[light] = json.loads(out)
            elif _exit_code(host, light) not in (None, 0):
                done[light] = []
                killed += 1
        time.sleep(0.5)
    return [step for steps in done.values() for step in steps], killed


def reservations(seconds: int = 12, heavy_mb: int = 1600, node_mb: int = 1536) -> list[ReservationArm]:
    """The light sandboxes' step times and the OOM kills, without and with reservations, all under
    a parent memory cgroup of `node_mb` (cgroup v1: the node's memory)."""
    paths, _ = _stack()
    host = paths.docker_host
    parent = Path("/sys/fs/cgroup/memory") / _NODE_CGROUP
    arms = []
    for reserved in (False, True):
        parent.mkdir(exist_ok=True)
        (parent / "memory.limit_in_bytes").write_text(str(node_mb * 2**20))
        run = ["run", "-d", "--network", "none", "--cgroup-parent", f"/{_NODE_CGROUP}"]
        light_limits = ["--cpus", "0.25", "--memory", "128m", "--memory-swap", "128m"] if reserved else []
        heavy_limits = ["--cpus", "1", "--memory", "512m", "--memory-swap", "512m"] if reserved else []
        started: list[str] = []
        try:
            heavy_code = _HEAVY.format(seconds=seconds + 2, heavy_mb=heavy_mb)
            heavy = docker(host, *run, *heavy_limits, _IMAGE, "python3", "-c", heavy_code).strip()
            started.append(heavy)
            time.sleep(1.0)
            light_code = _LIGHT.format(seconds=seconds)
            for _ in range(5):
                started.append(docker(host, *run, *light_limits, _IMAGE, "python3", "-c", light_code).strip())
            lights = started[1:]
            steps, killed = _light_steps(host, lights, seconds + 60)
            oom_light = killed + sum(_oom_kills(host, light) for light in lights)
            oom_heavy = _oom_kills(host, heavy)
            oom_node = cgroup_node_kills(parent)
        finally:
            docker(host, "rm", "--force", *started, check=False)
            with contextlib.suppress(OSError):
                parent.rmdir()
        ordered = sorted(steps) or [float("nan")]
        arms.append(
            ReservationArm(
                "reserved" if reserved else "unreserved",
                statistics.median(ordered) * 1000,
                ordered[int(0.95 * (len(ordered) - 1))] * 1000,
                ordered[-1] * 1000,
                oom_light,
                oom_heavy,
                oom_node,
            )
        )
    return arms


def cgroup_node_kills(parent: Path) -> int:
    from rl360_ext.harbor.envs.docker import cgroup_counter

    with contextlib.suppress(OSError):
        return cgroup_counter((parent / "memory.oom_control").read_text(), "oom_kill")
    return 0


def main(as_json: bool) -> None:
    model = WavesModel()
    arms = waves_and_pinning(model)
    reserved = reservations()
    if as_json:
        print(json.dumps({"parameters": asdict(model), "waves": [asdict(a) for a in arms],
                          "reservations": [asdict(r) for r in reserved]}, indent=2))  # fmt: skip
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"{model.attempts} attempts, {model.groups} images, 2 nodes, registry limit {model.blob_limit}"
    )
    for column in ("arm", "graded", "failed starts", "pull retries", "refused blobs", "blobs served",
                   "first running s", "last running s", "cache hits"):  # fmt: skip
        table.add_column(column, justify="right")
    for a in arms:
        table.add_row(a.name, str(a.graded), str(a.failed_starts), str(a.pull_retries), str(a.refused_blobs),
                      str(a.served_blobs), f"{a.first_running_s or 0:.1f}", f"{a.last_running_s or 0:.1f}",
                      str(a.cache_hits))  # fmt: skip
    Console().print(table)
    table = Table(title="one heavy build beside five light sandboxes")
    for column in (
        "arm",
        "light p50 ms",
        "light p95 ms",
        "light max ms",
        "OOM light",
        "OOM heavy",
        "OOM node",
    ):
        table.add_column(column, justify="right")
    for r in reserved:
        table.add_row(r.name, f"{r.light_p50_ms:.1f}", f"{r.light_p95_ms:.1f}", f"{r.light_max_ms:.1f}",
                      str(r.oom_light), str(r.oom_heavy), str(r.oom_node))  # fmt: skip
    Console().print(table)
