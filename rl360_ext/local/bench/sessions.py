"""`rl360 bench sessions`: the session server under load, per concurrency, conversation length and R3.

Each case starts a backend (the instant SGLang stand-in, `rl360_ext.reference.engine.instant`, so the
server's own cost is what is measured; or a tiny engine) and `servers` real session servers in
front of it (`rl360 session serve` processes, or with hosting `actor` the Ray actors of a
`SessionPool`, as the rollout runs them), then runs N concurrent sessions of T turns each
(sessions spread round robin over the servers, as a pool spreads them), a growing agent
conversation whose every turn appends the reply it got and one new user message. Per case it reports:
- turns/s over the whole run, and p50/p99 latency a turn adds (client-measured; the instant
  backend answers in well under a millisecond, so this is the server's share);
- p50 latency of the second and of the last turn (the first renders and tokenizes the whole first
  prompt): flat when per-turn work is proportional to what is new, growing when a server re-does
  the history every turn;
- server CPU per turn (user + system time of the server processes over the run / turns);
- request + response bytes per turn between agent and server, and server memory per session
  (RSS growth with every session open and all turns done, / N);
- turns lost (any turn whose request failed) — the target is zero.
The baseline in the same run is the smallest case: the second/last-turn ratio and CPU per turn at
N = 1 are what the other cases are held against.

Miles' own session server as a contender: `rl360_ext.local.bench.miles_sessions`; the stall case:
`rl360_ext.local.bench.stall`; the client side of one case: `rl360_ext.local.bench.session_load`.

It asserts nothing and owns none of the code it measures.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import orjson

from rl360_ext.local.bench.miles_sessions import (
    MILES_MODES,
    MILES_SERVERS,
    Miles,
    find_miles,
    start_miles_server,
)
from rl360_ext.local.bench.session_case import (
    RL360,
    Case,
    CaseResult,
    Hosting,
    ratio_of,
    server_options,
    server_pool,
    start_backend,
    start_server,
)
from rl360_ext.local.bench.session_load import run_load
from rl360_ext.local.bench.stall import STALL_SESSIONS, StallResult, print_stall_table, run_stall
from rl360_ext.local.local_ray import local_ray
from rl360_ext.util.procs import Service, running
from rl360_ext.util.progress import stage


def contenders(case: Case, miles: Miles | None, miles_modes: Sequence[str] = MILES_MODES) -> list[str]:
    """The servers a case runs: rl360, and Miles in each of `miles_modes` that differ for this case.

    Without R3 Miles' modes serve alike, so Miles runs once whatever the modes. Miles' server has
    no Ray form: it runs beside rl360's processes, not its actors.
    """
    if miles is None or case.backend != "instant" or case.hosting is not Hosting.PROCESS:
        return [RL360]
    if not case.r3:
        return [RL360, "miles"]
    return [RL360, *(MILES_SERVERS[mode] for mode in MILES_MODES if mode in miles_modes)]


def _run_one(
    case: Case, server: str, backend: Service, tokenizer: str, logs: Path, miles: Miles | None
) -> CaseResult:
    if server == RL360:
        options = server_options(case, backend, tokenizer)
        if case.hosting is Hosting.ACTOR:
            with server_pool(options, case.servers) as (urls, pids):
                return asyncio.run(run_load(case, server, urls, pids))
        started = [start_server(options, logs, n) for n in range(case.servers)]
    else:
        assert miles is not None
        mode = next(mode for mode, name in MILES_SERVERS.items() if name == server)
        started = [
            start_miles_server(case, mode, backend, tokenizer, logs, miles, n) for n in range(case.servers)
        ]
    with running(*started):
        return asyncio.run(run_load(case, server, [s.url for s in started], [s.pid for s in started]))


def _median(runs: Sequence[CaseResult]) -> CaseResult:
    """Each measure's median over the rounds of one server on one case."""
    if len(runs) == 1:
        return runs[0]
    numbers = {
        f.name: statistics.median(getattr(r, f.name) for r in runs)
        for f in fields(CaseResult)
        if f.name not in ("case", "server", "lost_because")
    }
    numbers["turns_done"] = int(numbers["turns_done"])
    numbers["turns_lost"] = max(r.turns_lost for r in runs)
    numbers["turns_retried"] = max(r.turns_retried for r in runs)
    return replace(runs[0], **numbers)


def run_case(
    case: Case,
    tokenizer: str,
    logs: Path,
    miles: Miles | None = None,
    rounds: int = 1,
    miles_modes: Sequence[str] = MILES_MODES,
) -> list[CaseResult]:
    """One result per contender; with several rounds the order alternates (A/B, B/A, ...)."""
    names = contenders(case, miles, miles_modes)
    runs: dict[str, list[CaseResult]] = {name: [] for name in names}
    backend = start_backend(case, logs)
    with running(backend):
        for number in range(rounds):
            for name in names if number % 2 == 0 else reversed(names):
                runs[name].append(_run_one(case, name, backend, tokenizer, logs, miles))
    return [_median(runs[name]) for name in names]


def cases(
    concurrency: Sequence[int],
    turns: Sequence[int],
    r3: Sequence[bool],
    servers: Sequence[int],
    backend: str,
    hostings: Sequence[Hosting] = (Hosting.PROCESS,),
) -> list[Case]:
    return [
        Case(n, t, flag, s, backend, hosting)
        for flag in r3
        for hosting in hostings
        for s in servers
        for t in turns
        for n in concurrency
    ]


RATIO_MEASURES = (
    "turns_per_s", "p50_ms", "p99_ms", "server_cpu_ms_per_turn", "bytes_per_turn", "memory_mb_per_session",
)  # fmt: skip


def ratios(results: Sequence[CaseResult]) -> list[dict[str, Any]]:
    """rl360/Miles for every measure of RATIO_MEASURES, per case and Miles mode."""
    out = []
    for miles in results:
        if miles.server == RL360:
            continue
        ours = next((r for r in results if r.server == RL360 and r.case == miles.case), None)
        if ours is None:
            continue
        out.append(
            {
                "case": asdict(miles.case),
                "miles": miles.server,
                **{m: ratio_of(getattr(ours, m), getattr(miles, m)) for m in RATIO_MEASURES},
            }
        )
    return out


def _table(results: Sequence[CaseResult], note: str | None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="rl360 bench sessions: the session server under load")
    for column in (
        "backend", "R3", "servers", "sessions", "turns", "server", "turns/s", "p50 ms", "p99 ms",
        "turn 2 / last p50 ms", "CPU ms/turn", "client bytes/turn", "MB/session", "lost",
    ):  # fmt: skip
        table.add_column(column, justify="right")
    by_server = {(r.case, r.server): r for r in results}
    for r in results:
        c = r.case
        table.add_row(
            c.backend, "61x8" if c.r3 else "off", f"{c.servers} x {c.hosting}", f"{c.sessions:,}",
            str(c.turns), r.server,
            f"{r.turns_per_s:,.0f}", f"{r.p50_ms:.1f}", f"{r.p99_ms:.1f}",
            f"{r.second_turn_p50_ms:.1f} / {r.last_turn_p50_ms:.1f}", f"{r.server_cpu_ms_per_turn:.2f}",
            f"{r.bytes_per_turn:,.0f}", f"{r.memory_mb_per_session:.2f}",
            f"{r.turns_lost} ({r.turns_retried} retried)" if r.turns_retried else str(r.turns_lost),
        )  # fmt: skip
        ours = by_server.get((c, RL360))
        if r.server != RL360 and ours is not None:
            x = {m: ratio_of(getattr(ours, m), getattr(r, m)) for m in RATIO_MEASURES}
            table.add_row(
                "", "", "", "", "", f"rl360/{r.server}", f"{x['turns_per_s']:.2f}x",
                f"{x['p50_ms']:.2f}x", f"{x['p99_ms']:.2f}x", "", f"{x['server_cpu_ms_per_turn']:.2f}x",
                f"{x['bytes_per_turn']:.2f}x", f"{x['memory_mb_per_session']:.2f}x", "", style="bold",
            )  # fmt: skip
    console = Console(width=max(Console().width, 190))
    console.print(table)
    if any(r.server != RL360 for r in results):
        console.print("rl360/Miles rows: above 1 is better for turns/s, below 1 for the others.")
    if note:
        console.print(note)
    for r in results:
        if r.turns_lost:
            console.print(
                f"{r.server}, {r.case.sessions} sessions x {r.case.turns} turns: "
                f"lost {r.turns_lost}, first: {r.lost_because}"
            )
    base = next((r for r in results if r.server == RL360), None)
    if base is not None:
        console.print(
            f"baseline (first case): {base.server_cpu_ms_per_turn:.2f} ms CPU per turn; p50 latency of "
            f"turn {base.case.turns} is {base.last_turn_p50_ms / base.second_turn_p50_ms:.2f}x turn 2's."
        )


def main(
    as_json: bool,
    concurrency: Sequence[int] = (1, 32, 256),
    turns: Sequence[int] = (16,),
    r3: Sequence[bool] = (False, True),
    servers: Sequence[int] = (1,),
    backend: str = "instant",
    miles_src: str | None = None,
    miles_python: str | None = None,
    rounds: int = 1,
    miles_modes: Sequence[str] = MILES_MODES,
    hostings: Sequence[Hosting] = (Hosting.PROCESS,),
    stall_s: float = 0.0,
) -> list[CaseResult]:
    """Run every case; with a Miles checkout (`miles_src` or $MILES_SRC) Miles' server beside rl360's.

    With `stall_s` > 0 the stall case runs too, each of its two phases that long.

    With R3 Miles runs in each of `miles_modes` (`full`: its default, `in_place`: deltas). Each
    server count runs once per hosting: `rl360 session serve` processes, and/or the actors of a
    `SessionPool` in a local Ray this run starts (one Ray CPU per actor, as the pool asks).
    """
    from rl360_ext.reference.engine.tokenizer import default_tokenizer_dir

    if backend not in ("instant", "tiny"):
        raise ValueError(f"backend must be instant or tiny, got {backend!r}")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    unknown = sorted(set(miles_modes) - set(MILES_MODES))
    if unknown or not miles_modes:
        raise ValueError(f"miles_modes must be among {', '.join(MILES_MODES)}, got {list(miles_modes)}")
    miles = find_miles(miles_src, miles_python)
    if miles is None:
        note = "no Miles checkout (--miles-src or MILES_SRC): rl360's server only."
    elif backend != "instant":
        note = (
            f"Miles' server forwards /v1/chat/completions, which the {backend} backend does not serve: "
            "rl360's server only."
        )
    else:
        note = f"Miles: {miles.src} under {miles.python}."
    stage(note)
    tokenizer = str(default_tokenizer_dir())
    results: list[CaseResult] = []
    with (
        tempfile.TemporaryDirectory(prefix="rl360-bench-sessions-") as scratch,
        contextlib.ExitStack() as stack,
    ):
        if Hosting.ACTOR in hostings:
            stack.enter_context(local_ray(num_cpus=max(os.cpu_count() or 1, *servers)))
        for case in cases(concurrency, turns, r3, servers, backend, hostings):
            who = ", ".join(contenders(case, miles, miles_modes))
            stage(f"{case.sessions} sessions x {case.turns} turns, R3 {'on' if case.r3 else 'off'}, "
                  f"{case.servers} server(s) as {case.hosting}, {case.backend} backend: {who}")  # fmt: skip
            results.extend(run_case(case, tokenizer, Path(scratch), miles, rounds, miles_modes))
        stall: list[StallResult] = []
        if stall_s > 0:
            stage(f"stall case: {STALL_SESSIONS} sessions and /health, idle then beside the largest request")
            stall = run_stall(tokenizer, Path(scratch), stall_s)
    if as_json:
        report = {
            "note": note, "results": [asdict(r) for r in results], "ratios": ratios(results),
            "stall": [asdict(r) for r in stall],
        }  # fmt: skip
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode())
    else:
        _table(results, note)
        if stall:
            print_stall_table(stall)
    return results
