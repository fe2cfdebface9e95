"""`rl360 bench harbor`: one Harbor /run replica's throughput and cost on this machine, the
per-replica figures docs/scale-out.md sizes a pool from.

For each `max_concurrent` (8, 16) and each way a replica runs -- `process` (`rl360 harbor serve`,
the demo's one-replica path), `process, warm` (the same with `warm_sandboxes` = max_concurrent:
sandboxes started ahead of the trials that take them, as the demo runs) and `ray actor` (one
`HarborPool` replica in a local Ray, the demo's path from two replicas on) -- it sends
`ATTEMPTS_PER_SLOT` x max_concurrent oracle attempts of a short task (`fizzbuzz`) at once, after
one warm-up attempt (which also fills the warm case's spares), and measures: attempts/s (all of them
over the wall time), sandbox starts/s (between the first and the last sandbox start), p50
environment setup, the replica process's own CPU per attempt (user+system, not its sandboxes'),
the sandboxes' CPU per attempt (the replica's reaped children), the replica's RSS after the run,
and the memory per live sandbox (PSS of the replica's descendants over the live bubblewrap
sandboxes, median over samples every `SAMPLE_S`), and environment setup's share of the time the
attempts held their slots, and, for the warm case, how many starts took a spare or missed. No
start-rate limit: starts/s is what one replica does unpaced.

Floors, in the same run and at the same concurrency (before Ray starts): the oracle's commands
(`bash /solution/solve.sh`, then `bash /tests/test.sh`) in rl360's sandbox driven directly
(start, the two phase ends the /run server makes and the fresh holder they leave due, stop; no
Harbor), in a bare `bwrap` (`--unshare-all`, /usr read-only, no rl360 setup; its setup+teardown
is a `bwrap` of `true`), and on the host. Per case, `setup_overhead_ratio_p50` is rl360's
sandbox setup+teardown p50 over the bare-bwrap floor's, and `env_setup_over_floor_p50` the
replica's environment setup p50 over it. It asserts nothing; an attempt that is not graded 1.0
is counted in `failed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import re
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from rl360_ext.local.fixtures import tasks_root as fixture_tasks_root
from rl360_ext.local.local_ray import local_ray
from rl360_ext.local.services import start_harbor
from rl360_ext.local.stack import HarborServer
from rl360_ext.util.proc_stat import PARENT, children_cpu_seconds, cpu_seconds, rss_mb, stat_fields
from rl360_ext.util.procs import LOOPBACK
from rl360_ext.util.progress import stage

if TYPE_CHECKING:  # the harbor extra (Python >= 3.12): imported where a floor runs, not with this module
    from harbor.models.task.config import EnvironmentConfig

TASK = "fizzbuzz"
CONCURRENCY = (8, 16)
MODES = ("process", "process, warm", "ray actor")
WARM_MODE = "process, warm"  # a process replica keeping max_concurrent warm sandboxes
ATTEMPTS_PER_SLOT = 3
SAMPLE_S = 0.2
DEADLINE_S = 300.0  # the default phase budgets need 145 s for this task


@dataclass
class ReplicaFigures:
    """One case: one replica, `max_concurrent` trials at once."""

    mode: str
    max_concurrent: int
    attempts: int
    failed: int
    wall_s: float
    attempts_per_s: float
    starts_per_s: float | None
    env_setup_p50_s: float | None
    env_setup_share: float | None
    server_cpu_ms_per_attempt: float
    sandbox_cpu_ms_per_attempt: float
    server_rss_mb: float
    mb_per_live_sandbox: float | None
    peak_live_sandboxes: int
    warm_taken: int | None
    warm_missed: int | None


def _processes() -> dict[int, tuple[int, str]]:
    """(ppid, comm) of every live process, by pid."""
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            comm = text[text.index("(") + 1 : text.rindex(")")]
            fields = text[text.rindex(")") + 2 :].split()
            if fields[0] != "Z":
                table[int(stat.parent.name)] = (int(fields[1]), comm)
    return table


def _pss_kb(pid: int) -> int:
    """PSS of a process (shared pages split among their users), else its RSS; 0 when it is gone."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    with contextlib.suppress(OSError, ValueError):
        return int(rss_mb(pid) * 1024)
    return 0


def sandbox_sample(root: int) -> tuple[int, float]:
    """(live sandboxes under process `root`, MB of PSS its descendants hold). A sandbox is a
    bubblewrap process whose parent is not one (bwrap forks its namespace's PID 1 under itself)."""
    table = _processes()
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, (ppid, _) in table.items() if ppid in frontier} - found
        found |= frontier
    sandboxes = sum(1 for pid in found if table[pid][1] == "bwrap" and table[table[pid][0]][1] != "bwrap")
    return sandboxes, sum(_pss_kb(pid) for pid in found) / 1024


class Sampler:
    """Samples `sandbox_sample(pid)` every SAMPLE_S on a thread while a case runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[int, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rl360-bench-harbor-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.samples.append(sandbox_sample(self.pid))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def per_sandbox_mb(self) -> float | None:
        ratios = [mb / live for live, mb in self.samples if live > 0]
        return statistics.median(ratios) if ratios else None

    def peak(self) -> int:
        return max((live for live, _ in self.samples), default=0)


async def _attempts(url: str, count: int) -> list[dict[str, Any] | None]:
    async def one(http: httpx.AsyncClient) -> dict[str, Any] | None:
        try:
            response = await http.post(f"{url}/run", json={"task": TASK, "deadline_s": DEADLINE_S})
            return response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    limits = httpx.Limits(max_connections=count + 1)
    async with httpx.AsyncClient(timeout=DEADLINE_S + 30, limits=limits) as http:
        return list(await asyncio.gather(*(one(http) for _ in range(count))))


def setup_share(timings: list[dict[str, float | None]]) -> float | None:
    """Environment setup's share of the attempts' occupancy: summed setup seconds over summed
    seconds each attempt held its slot (its total less its queue wait)."""
    held = sum((t.get("total") or 0.0) - (t.get("queue") or 0.0) for t in timings)
    setup = sum(t.get("environment_setup") or 0.0 for t in timings)
    return setup / held if held > 0 else None


def measure(mode: str, url: str, pid: int, max_concurrent: int) -> ReplicaFigures:
    """One case against a replica serving at `url` in process `pid` (already warm)."""
    count = ATTEMPTS_PER_SLOT * max_concurrent
    warm_before = _warm_counts(url)
    own_before, children_before = cpu_seconds(pid), children_cpu_seconds(pid)
    started = time.monotonic()
    with Sampler(pid) as sampler:
        results = asyncio.run(_attempts(url, count))
    wall = time.monotonic() - started
    own_after, children_after = cpu_seconds(pid), children_cpu_seconds(pid)
    warm_after = _warm_counts(url)
    graded = [r for r in results if r is not None and r.get("reward") == 1.0]
    starts = sorted(
        r["timeline"]["sandbox_started_at"] for r in graded if r.get("timeline", {}).get("sandbox_started_at")
    )
    setups = [
        r["phase_timings"]["environment_setup"]
        for r in graded
        if r.get("phase_timings", {}).get("environment_setup") is not None
    ]
    span = starts[-1] - starts[0] if len(starts) > 1 else 0.0
    occupancy = [r["phase_timings"] for r in graded if r.get("phase_timings")]
    return ReplicaFigures(
        mode=mode,
        max_concurrent=max_concurrent,
        attempts=count,
        failed=count - len(graded),
        wall_s=wall,
        attempts_per_s=len(graded) / wall,
        starts_per_s=(len(starts) - 1) / span if span > 0 else None,
        env_setup_p50_s=statistics.median(setups) if setups else None,
        env_setup_share=setup_share(occupancy),
        server_cpu_ms_per_attempt=1000 * (own_after - own_before) / count,
        sandbox_cpu_ms_per_attempt=1000 * (children_after - children_before) / count,
        server_rss_mb=rss_mb(pid),
        mb_per_live_sandbox=sampler.per_sandbox_mb(),
        peak_live_sandboxes=sampler.peak(),
        warm_taken=_delta(warm_before, warm_after, "taken"),
        warm_missed=_delta(warm_before, warm_after, "missed"),
    )


def _warm_counts(url: str) -> dict[str, int] | None:
    """The replica's warm-sandbox counters (`/health`), None where it keeps none."""
    return httpx.get(f"{url}/health", timeout=30).json().get("warm_sandboxes")


def _wait_for_spares(url: str, count: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while ((_warm_counts(url) or {}).get("held") or 0) < count and time.monotonic() < deadline:
        time.sleep(0.1)


def _delta(before: dict[str, int] | None, after: dict[str, int] | None, key: str) -> int | None:
    return after[key] - (before or {}).get(key, 0) if after is not None else None


# -- floors: the same attempt's commands in rl360's sandbox, a bare bwrap and on the host ----------

FLOORS = ("rl360 sandbox", "bare bwrap", "host")
AGENT_COMMAND = "bash /solution/solve.sh"  # what the oracle runs (Harbor adds chmod and rm calls)
VERIFIER_COMMAND = "bash /tests/test.sh"
SANDBOX_DIRS = ("/app", "/logs", "/tests", "/solution")
_PR_SET_CHILD_SUBREAPER = 36
_SANDBOX_PATH = re.compile(r"(?<![\w/.])(/app|/logs|/tests|/solution)(?=/)")


@dataclass
class FloorFigures:
    """One floor at one concurrency: `attempts` of the task's oracle commands, `max_concurrent` at
    once. `setup_teardown_p50_s`: rl360's `start()` plus `stop()`, a bare `bwrap` of `true`, or
    none on the host; `cpu_ms_per_attempt`: the processes started (reaped children);
    `driver_cpu_ms_per_attempt`: this process's own CPU (for rl360's sandbox: its Python side)."""

    kind: str
    max_concurrent: int
    attempts: int
    failed: int
    setup_teardown_p50_s: float | None
    phase_restarts_p50_s: float | None
    commands_p50_s: float | None
    cpu_ms_per_attempt: float
    driver_cpu_ms_per_attempt: float


@dataclass
class _Attempt:
    setup_teardown_s: float | None = None
    phase_restarts_s: float | None = None
    commands_s: float = 0.0
    passed: bool = False


def rebase(text: str, root: Path) -> str:
    """`text` with every absolute path under a sandbox directory (/app/..., /tests/...) moved
    under `root`: the host floor runs the task's scripts without a sandbox's mounts."""
    return _SANDBOX_PATH.sub(lambda match: f"{root}{match.group(1)}", text)


def _stage_attempt(task_dir: Path, root: Path, host: bool) -> None:
    """The attempt's directories under `root` (app, logs/verifier, and a copy of the task's
    solution and tests, their paths rebased under `root` for the host floor)."""
    for name in ("app", "logs/verifier", "logs/agent"):
        (root / name).mkdir(parents=True)
    for name in ("solution", "tests"):
        for source in (task_dir / name).rglob("*"):
            target = root / name / source.relative_to(task_dir / name)
            if source.is_dir():
                target.mkdir(parents=True, exist_ok=True)
            elif source.is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                text = source.read_text()
                target.write_text(rebase(text, root) if host else text)


def bare_bwrap_argv(root: Path, command: str | None) -> list[str]:
    """A minimal `bwrap` around `command` (`true` when None): every namespace unshared, the host's
    /usr read-only with its /bin, /lib links, a fresh /proc, /dev and /tmp, the attempt's
    directories bound at their sandbox paths; no rl360 setup (no tmpfs, cgroup, seccomp, uid)."""
    argv = ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr"]
    for link in ("bin", "lib", "lib64", "sbin"):
        if (Path("/") / link).is_symlink():
            argv += ["--symlink", os.readlink(Path("/") / link), f"/{link}"]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for target in SANDBOX_DIRS:
        argv += ["--bind", str(root / target.strip("/")), target]
    return [*argv, "--", *(["/bin/bash", "-c", command] if command else ["/bin/true"])]


async def _run_timed(argv: list[str], root: Path) -> float | None:
    """Wall seconds of one process, None when it exits non-zero. It runs with the environment a
    sandbox command gets (not this process's: a virtualenv's python3 first on PATH would make the
    host floor's commands slower than the sandbox's)."""
    from rl360_ext.harbor.envs.bwrap import SANDBOX_PATH

    env = {"PATH": SANDBOX_PATH, "HOME": str(root / "app"), "LANG": "C.UTF-8"}
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        *argv,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    code = await process.wait()
    return time.monotonic() - started if code == 0 else None


async def _outside(kind: str, task_dir: Path, root: Path) -> _Attempt:
    """One attempt in a bare bwrap or on the host: (bwrap: `true`,) the agent's command, the
    verifier's, each its own process."""
    attempt = _Attempt()
    await asyncio.to_thread(_stage_attempt, task_dir, root, kind == "host")
    if kind == "bare bwrap":
        attempt.setup_teardown_s = await _run_timed(bare_bwrap_argv(root, None), root)
    for command in (AGENT_COMMAND, VERIFIER_COMMAND):
        if kind == "bare bwrap":
            wall = await _run_timed(bare_bwrap_argv(root, command), root)
        else:
            wall = await _run_timed(["/bin/bash", "-c", rebase(command, root)], root)
        if wall is None:
            return attempt
        attempt.commands_s += wall
    reward = root / "logs" / "verifier" / "reward.txt"
    attempt.passed = reward.is_file() and reward.read_text().strip() == "1"
    return attempt


async def _in_rl360(task_dir: Path, root: Path, sandboxes: Path, config: EnvironmentConfig) -> _Attempt:
    """One attempt in rl360's sandbox, driven as the /run server drives it: start, the agent's
    command, the two phase ends and the fresh holder they leave due (the verifier's fresh
    namespaces), the verifier's command, stop."""
    from harbor.models.trial.paths import TrialPaths

    from rl360_ext.harbor.envs.bwrap import BwrapEnvironment
    from rl360_ext.harbor.runner import GRADING_CLEARS

    attempt = _Attempt()
    paths = TrialPaths(root)
    paths.mkdir()
    env = BwrapEnvironment(
        environment_dir=task_dir / "environment",
        environment_name=TASK,
        session_id=f"{TASK}__{root.name}",
        trial_paths=paths,
        task_env_config=config,
        sandbox_root=str(sandboxes),
    )
    started = time.monotonic()
    await env.start(force_build=False)
    attempt.setup_teardown_s = time.monotonic() - started
    try:
        await env.upload_dir(task_dir / "solution", "/solution")
        started = time.monotonic()
        agent = await env.exec(AGENT_COMMAND)
        attempt.commands_s = time.monotonic() - started
        started = time.monotonic()
        await env.end_phase()
        await env.end_phase(GRADING_CLEARS, grading=True)
        await env.start_due_holder()  # else the verifier's first command starts it
        attempt.phase_restarts_s = time.monotonic() - started
        await env.upload_dir(task_dir / "tests", "/tests")
        started = time.monotonic()
        verifier = await env.exec(VERIFIER_COMMAND)
        attempt.commands_s += time.monotonic() - started
        await env.download_file("/logs/verifier/reward.txt", root / "reward.txt")
        attempt.passed = agent.return_code == verifier.return_code == 0 and (
            (root / "reward.txt").read_text().strip() == "1"
        )
    finally:
        started = time.monotonic()
        await env.stop(delete=True)
        attempt.setup_teardown_s += time.monotonic() - started
    return attempt


def _p50(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return statistics.median(known) if known else None


async def _floor_attempts(kind: str, work: Path, count: int, max_concurrent: int) -> list[_Attempt]:
    task_dir = fixture_tasks_root() / TASK
    sandboxes = work / "sandboxes"
    sandboxes.mkdir(mode=0o711, parents=True, exist_ok=True)
    gate = asyncio.Semaphore(max_concurrent)
    serial = iter(range(1 << 30))
    from harbor.models.task.task import Task

    config = Task(task_dir).config.environment  # parsed once: Harbor's parsing is not the sandbox's cost

    async def one() -> _Attempt:
        root = work / f"attempt-{next(serial)}"
        async with gate:
            try:
                if kind == "rl360 sandbox":
                    return await _in_rl360(task_dir, root, sandboxes, config)
                return await _outside(kind, task_dir, root)
            except Exception:  # a failed attempt is counted, not raised
                return _Attempt()

    return list(await asyncio.gather(*(one() for _ in range(count))))


def _children() -> set[int]:
    """Pids of this process's children, zombies included."""
    mine, found = os.getpid(), set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(ValueError, IndexError):
            fields = stat_fields(stat.parent.name)
            if fields is not None and int(fields[PARENT]) == mine:
                found.add(int(stat.parent.name))
    return found


@contextlib.contextmanager
def adopting_orphans(reap_s: float = 5.0) -> Iterator[None]:
    """This process as a child subreaper inside, and what it adopted reaped on the way out.

    A bwrap with its own PID namespace exits as soon as its sandbox's init reports, without
    reaping it: the init and everything it reaped would count in nobody's children CPU. Adopted
    here, it counts in this process's (`os.times()`). On the way out, children that were not
    there before are reaped (the measured run has waited for its own by then), for at most
    `reap_s`."""
    libc = ctypes.CDLL(None, use_errno=True)
    before = _children()
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        yield
    finally:
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        adopted = _children() - before
        deadline = time.monotonic() + reap_s
        while adopted and time.monotonic() < deadline:
            for pid in list(adopted):
                with contextlib.suppress(ChildProcessError):
                    if os.waitpid(pid, os.WNOHANG)[0] == 0:
                        continue
                adopted.discard(pid)
            if adopted:
                time.sleep(0.01)


def measure_floor(kind: str, work: Path, max_concurrent: int) -> FloorFigures:
    """One floor: `ATTEMPTS_PER_SLOT` x max_concurrent attempts, `max_concurrent` at once, after
    one warm-up attempt. `work` must be searchable by the sandbox uid (rl360's sandboxes live there)."""
    asyncio.run(_floor_attempts(kind, work / "warm-up", 1, 1))
    count = ATTEMPTS_PER_SLOT * max_concurrent
    with adopting_orphans():
        before = os.times()
        attempts = asyncio.run(_floor_attempts(kind, work / "measured", count, max_concurrent))
    after = os.times()
    passed = [attempt for attempt in attempts if attempt.passed]
    children = (after.children_user + after.children_system) - (before.children_user + before.children_system)
    own = (after.user + after.system) - (before.user + before.system)
    return FloorFigures(
        kind=kind,
        max_concurrent=max_concurrent,
        attempts=count,
        failed=count - len(passed),
        setup_teardown_p50_s=_p50([attempt.setup_teardown_s for attempt in passed]),
        phase_restarts_p50_s=_p50([attempt.phase_restarts_s for attempt in passed]),
        commands_p50_s=_p50([attempt.commands_s for attempt in passed]),
        cpu_ms_per_attempt=1000 * children / count,
        driver_cpu_ms_per_attempt=1000 * own / count,
    )


def overhead_ratio(
    floors: list[dict[str, Any]], max_concurrent: int, ours: float | None = None
) -> float | None:
    """Seconds over the bare-bwrap floor's setup+teardown p50 at one concurrency: `ours`, by
    default rl360's sandbox floor's setup+teardown p50 (`setup_overhead_ratio_p50`)."""
    p50 = {
        row["kind"]: row["setup_teardown_p50_s"] for row in floors if row["max_concurrent"] == max_concurrent
    }
    ours = p50.get("rl360 sandbox") if ours is None else ours
    bare = p50.get("bare bwrap")
    return ours / bare if ours is not None and bare else None


def _server(work: Path, max_concurrent: int, warm: bool) -> HarborServer:
    settings: dict[str, Any] = {
        "max_concurrent": max_concurrent,
        "trials_dir": work / "trials",
        "keep_trials": "none",
    }
    if warm:
        settings["env_kwarg"] = (f"warm_sandboxes={max_concurrent}",)
    return HarborServer(name=f"harbor-{max_concurrent}", agent="oracle", settings=settings)


@contextlib.contextmanager
def replica(mode: str, work: Path, max_concurrent: int) -> Iterator[tuple[str, int]]:
    """(URL, pid) of one replica, as a process or as a one-replica `HarborPool`; stopped on exit."""
    server = _server(work, max_concurrent, warm=mode == WARM_MODE)
    if mode in ("process", WARM_MODE):
        service = start_harbor(
            work / "logs", fixture_tasks_root(), server.agent, *server.argv_flags(), name=server.name
        )
        try:
            yield service.url, service.pid
        finally:
            service.stop()
        return
    from rl360_ext.harbor.pool import HarborPool

    pool = HarborPool(server.server_settings(fixture_tasks_root()), 1, host=LOOPBACK, actor_num_cpus=0)
    try:
        yield pool.urls[0], pool.replicas[0].pid
    finally:
        pool.shutdown()


def collect(
    concurrency: tuple[int, ...] = CONCURRENCY,
    modes: tuple[str, ...] = MODES,
    floors: tuple[str, ...] = FLOORS,
) -> dict[str, Any]:
    rows, floor_rows = [], []
    with tempfile.TemporaryDirectory(prefix="rl360-bench-harbor-") as scratch:
        os.chmod(scratch, 0o711)  # the floor's rl360 sandboxes run as an unprivileged uid
        for max_concurrent in concurrency:
            for kind in floors:  # before Ray starts: its threads would count as this process's CPU
                stage(f"floor: {kind}, max_concurrent {max_concurrent}")
                work = Path(scratch) / f"floor-{kind.replace(' ', '-')}-{max_concurrent}"
                floor_rows.append(measure_floor(kind, work, max_concurrent))
        with local_ray() if "ray actor" in modes else contextlib.nullcontext():
            for max_concurrent in concurrency:
                for mode in modes:
                    work = Path(scratch) / f"{mode.replace(' ', '-')}-{max_concurrent}"
                    (work / "logs").mkdir(parents=True)
                    stage(f"{mode}, max_concurrent {max_concurrent}")
                    with replica(mode, work, max_concurrent) as (url, pid):
                        asyncio.run(_attempts(url, 1))  # warm-up: first sandbox, first imports
                        if mode == WARM_MODE:  # the spares made while the replica was idle
                            _wait_for_spares(url, max_concurrent)
                        rows.append(measure(mode, url, pid, max_concurrent))
    floor_dicts = [asdict(row) for row in floor_rows]
    cases = [
        {
            **asdict(row),
            "setup_overhead_ratio_p50": overhead_ratio(floor_dicts, row.max_concurrent),
            "env_setup_over_floor_p50": overhead_ratio(floor_dicts, row.max_concurrent, row.env_setup_p50_s),
        }
        for row in rows
    ]
    return {
        "task": TASK,
        "cpus": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
        "cases": cases,
        "floors": floor_dicts,
    }


def _figure(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000 * seconds


def main(as_json: bool) -> None:
    results = collect()
    if as_json:
        print(json.dumps(results, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=(
            f"one Harbor replica, oracle on {results['task']}, {ATTEMPTS_PER_SLOT} x max_concurrent attempts "
            f"at once ({results['cpus']} CPUs, load {results['load_average_1m']:.1f} after)"
        )
    )
    for column in (
        "replica", "max conc.", "attempts", "failed", "attempts/s", "starts/s", "env setup p50 s",
        "setup share", "setup / floor", "server CPU ms/attempt",
        "sandbox CPU ms/attempt", "server RSS MB", "MB per live sandbox",
        "peak live", "warm taken / missed",
    ):  # fmt: skip
        table.add_column(column, justify="left" if column == "replica" else "right")
    for row in results["cases"]:
        table.add_row(
            row["mode"],
            str(row["max_concurrent"]),
            str(row["attempts"]),
            str(row["failed"]),
            f"{row['attempts_per_s']:.2f}",
            _figure(row["starts_per_s"], ".2f"),
            _figure(row["env_setup_p50_s"], ".2f"),
            _figure(row["env_setup_share"], ".0%"),
            _figure(row["env_setup_over_floor_p50"], ".1f"),
            f"{row['server_cpu_ms_per_attempt']:.0f}",
            f"{row['sandbox_cpu_ms_per_attempt']:.0f}",
            f"{row['server_rss_mb']:.0f}",
            _figure(row["mb_per_live_sandbox"], ".1f"),
            str(row["peak_live_sandboxes"]),
            "-" if row["warm_taken"] is None else f"{row['warm_taken']} / {row['warm_missed']}",
        )
    Console().print(table)
    floors = Table(
        title=(
            "floors: the same commands (oracle agent, verifier) in rl360's sandbox (driven without "
            "Harbor), a bare bwrap and on the host, at the same concurrency"
        )
    )
    for column in (
        "floor", "max conc.", "attempts", "failed", "setup+teardown p50 ms", "/ bare bwrap's",
        "phase restarts p50 ms", "commands p50 ms", "processes CPU ms/attempt", "driver CPU ms/attempt",
    ):  # fmt: skip
        floors.add_column(column, justify="left" if column == "floor" else "right")
    for row in results["floors"]:
        setup = row["setup_teardown_p50_s"]
        floors.add_row(
            row["kind"],
            str(row["max_concurrent"]),
            str(row["attempts"]),
            str(row["failed"]),
            _figure(_ms(row["setup_teardown_p50_s"]), ".0f"),
            _figure(
                None if setup is None else overhead_ratio(results["floors"], row["max_concurrent"], setup),
                ".1f",
            ),
            _figure(_ms(row["phase_restarts_p50_s"]), ".0f"),
            _figure(_ms(row["commands_p50_s"]), ".0f"),
            f"{row['cpu_ms_per_attempt']:.0f}",
            f"{row['driver_cpu_ms_per_attempt']:.0f}",
        )
    Console().print(floors)
