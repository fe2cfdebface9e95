"""`rl360 bench harbor`: one Harbor /run replica's throughput and cost on this machine, the
per-replica figures docs/scale-out.md sizes a pool from.

For each `max_concurrent` (8, 16) and each way a replica runs -- `process` (`rl360 harbor serve`,
the demo's one-replica path) and `ray actor` (one `HarborPool` replica in a local Ray, the demo's
path from two replicas on) -- it sends `ATTEMPTS_PER_SLOT` x max_concurrent oracle attempts of a
short task (`fizzbuzz`) at once, after one warm-up attempt, and measures: attempts/s (all of them
over the wall time), sandbox starts/s (between the first and the last sandbox start), p50
environment setup, the replica process's own CPU per attempt (user+system, not its sandboxes'),
the sandboxes' CPU per attempt (the replica's reaped children), the replica's RSS after the run,
and the memory per live sandbox (PSS of the replica's descendants over the live bubblewrap
sandboxes, median over samples every `SAMPLE_S`). No start-rate limit: starts/s is what one replica
does unpaced. It asserts nothing; an attempt that is not graded 1.0 is counted in `failed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from rl360_ext.local.bench.local_ray import local_ray
from rl360_ext.local.fixtures import tasks_root as fixture_tasks_root
from rl360_ext.local.services import start_harbor
from rl360_ext.local.stack import HarborServer
from rl360_ext.util.procs import LOOPBACK
from rl360_ext.util.progress import stage

TASK = "fizzbuzz"
CONCURRENCY = (8, 16)
MODES = ("process", "ray actor")
ATTEMPTS_PER_SLOT = 3
SAMPLE_S = 0.2
DEADLINE_S = 300.0  # the default phase budgets need 145 s for this task
TICKS = os.sysconf("SC_CLK_TCK")


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
    server_cpu_ms_per_attempt: float
    sandbox_cpu_ms_per_attempt: float
    server_rss_mb: float
    mb_per_live_sandbox: float | None
    peak_live_sandboxes: int


def _cpu_s(pid: int) -> tuple[float, float]:
    """(the process's own user+system CPU s, its reaped children's) from /proc/<pid>/stat."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return (utime + stime) / TICKS, (cutime + cstime) / TICKS


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


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
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
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


def measure(mode: str, url: str, pid: int, max_concurrent: int) -> ReplicaFigures:
    """One case against a replica serving at `url` in process `pid` (already warm)."""
    count = ATTEMPTS_PER_SLOT * max_concurrent
    own_before, children_before = _cpu_s(pid)
    started = time.monotonic()
    with Sampler(pid) as sampler:
        results = asyncio.run(_attempts(url, count))
    wall = time.monotonic() - started
    own_after, children_after = _cpu_s(pid)
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
    return ReplicaFigures(
        mode=mode,
        max_concurrent=max_concurrent,
        attempts=count,
        failed=count - len(graded),
        wall_s=wall,
        attempts_per_s=len(graded) / wall,
        starts_per_s=(len(starts) - 1) / span if span > 0 else None,
        env_setup_p50_s=statistics.median(setups) if setups else None,
        server_cpu_ms_per_attempt=1000 * (own_after - own_before) / count,
        sandbox_cpu_ms_per_attempt=1000 * (children_after - children_before) / count,
        server_rss_mb=_rss_mb(pid),
        mb_per_live_sandbox=sampler.per_sandbox_mb(),
        peak_live_sandboxes=sampler.peak(),
    )


def _server(work: Path, max_concurrent: int) -> HarborServer:
    return HarborServer(
        name=f"harbor-{max_concurrent}",
        agent="oracle",
        settings={"max_concurrent": max_concurrent, "trials_dir": work / "trials", "keep_trials": "none"},
    )


@contextlib.contextmanager
def replica(mode: str, work: Path, max_concurrent: int) -> Iterator[tuple[str, int]]:
    """(URL, pid) of one replica, as a process or as a one-replica `HarborPool`; stopped on exit."""
    server = _server(work, max_concurrent)
    if mode == "process":
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


def collect(concurrency: tuple[int, ...] = CONCURRENCY, modes: tuple[str, ...] = MODES) -> dict[str, Any]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="rl360-bench-harbor-") as scratch, local_ray():
        for max_concurrent in concurrency:
            for mode in modes:
                work = Path(scratch) / f"{mode.replace(' ', '-')}-{max_concurrent}"
                (work / "logs").mkdir(parents=True)
                stage(f"{mode}, max_concurrent {max_concurrent}")
                with replica(mode, work, max_concurrent) as (url, pid):
                    asyncio.run(_attempts(url, 1))  # warm-up: first sandbox, first imports
                    rows.append(measure(mode, url, pid, max_concurrent))
    return {
        "task": TASK,
        "cpus": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
        "cases": [asdict(row) for row in rows],
    }


def _figure(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


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
        "server CPU ms/attempt", "sandbox CPU ms/attempt", "server RSS MB", "MB per live sandbox",
        "peak live",
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
            f"{row['server_cpu_ms_per_attempt']:.0f}",
            f"{row['sandbox_cpu_ms_per_attempt']:.0f}",
            f"{row['server_rss_mb']:.0f}",
            _figure(row["mb_per_live_sandbox"], ".1f"),
            str(row["peak_live_sandboxes"]),
        )
    Console().print(table)
