"""`rl360 bench sessions --stall-s`: whether one request can stall everyone else.

The stall case (`stall_s` > 0) asks whether one request can stall everyone else: one server with
`--max-context-tokens STALL_CONTEXT`, STALL_SESSIONS sessions taking turns and a `/health` probe
every HEALTH_EVERY_S, first idle, then while one more client keeps sending the largest request the
caps allow (a second turn whose new message has `max_context_tokens x max_chars_per_token` characters
less STALL_MARGIN_CHARS: about the most the server tokenizes, after which its context check refuses
the prompt unsent), in the same run. One such request goes first, unmeasured: the server starts
its tokenizer worker process on the first long text (seconds, at the lowest priority). The large
requests are sent from a client process of their own (started before the phases), so building and
writing 1 MB bodies never delays the probes' and sessions' own event loop: a user's health check
does not share a loop with another client.
It reports /health and the other sessions' turn latency (p50/p99) in both phases and their ratio
(the goal is a p99 within 2x of idle), and the server's own event-loop lag over each phase (its
`rl360_session_loop_lag_seconds` histogram, read from /metrics before and after): the p99 bucket
and the wake-ups late by more than LATE_TICK_S. The client's latencies also count every process's
share of the CPU (client, server, backend on one machine); the loop lag counts only the server's loop.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson

from rl360_ext.local.bench.session_case import Case, ratio_of, server_options, start_backend, start_server
from rl360_ext.local.bench.session_load import CLIENT_TIMEOUT_S, JSON_HEADERS, SYSTEM, WORDS, run_conversation
from rl360_ext.session.options import SessionServerConfig
from rl360_ext.util.procs import running

STALL_CONTEXT = 32768  # the stall case's --max-context-tokens (the tiny engine's default context)


STALL_SESSIONS = 4  # sessions taking turns beside the largest request


HEALTH_EVERY_S = 0.02  # the /health probe's period
LATE_TICK_S = 0.025  # a loop-lag wake-up later than this is counted as late
LOOP_LAG = "rl360_session_loop_lag_seconds"


STALL_MARGIN_CHARS = 1024  # the largest message is this much under the budget: the turn's other text fits


STALL_TURNS = 16  # turns per conversation of the stall case's other sessions (then a new session)


@dataclass
class StallResult:
    """One phase of the stall case: idle, or while the largest allowed request keeps arriving."""

    load: str  # "idle" | "largest request"
    seconds: float
    health_probes: int
    health_p50_ms: float
    health_p99_ms: float
    health_max_ms: float
    turns: int
    turn_p50_ms: float
    turn_p99_ms: float
    big_requests: int = 0
    big_chars: int = 0
    big_statuses: str = ""  # the large requests' statuses, e.g. "400 x 5"
    big_mean_s: float = 0.0
    loop_ticks: int = 0  # the server's loop-lag wake-ups over the phase
    loop_lag_p99_ms: float = 0.0  # the histogram bucket holding their 99th percentile (its upper bound)
    loop_late_ticks: int = 0  # of them, those later than LATE_TICK_S


def _ms(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _largest_text(chars: int) -> str:
    """`chars` characters of code-like text (deterministic)."""
    piece = " ".join(WORDS[(i * 7 + i // 5) % len(WORDS)] for i in range(4096))
    return (piece * (chars // len(piece) + 1))[:chars]


async def _probe_health(http: aiohttp.ClientSession, url: str, until: float, out: list[float]) -> None:
    while time.perf_counter() < until:
        started = time.perf_counter()
        async with http.get(f"{url}/health") as response:
            await response.read()
        out.append(time.perf_counter() - started)
        await asyncio.sleep(HEALTH_EVERY_S)


async def _keep_talking(http: aiohttp.ClientSession, url: str, until: float, out: list[float]) -> None:
    """Conversations of STALL_TURNS turns, one after another, until `until` (latencies to `out`)."""
    while time.perf_counter() < until:
        latencies: list[list[float]] = [[] for _ in range(STALL_TURNS)]
        errors: list[str] = []
        await run_conversation(http, url, STALL_TURNS, latencies, [0], errors, [0])
        if errors:
            raise RuntimeError(f"a turn beside the largest request failed: {errors[0]}")
        out.extend(x for per_turn in latencies for x in per_turn)


async def _one_largest(http: aiohttp.ClientSession, url: str, text: str) -> tuple[int, float]:
    """A new session whose second turn appends a message of `text`: its status and seconds."""
    small = [SYSTEM, {"role": "user", "content": "The test suite fails; fix it."}]
    async with http.post(f"{url}/sessions", json={}) as created:
        session_id = (await created.json())["session_id"]
    chat = f"{url}/sessions/{session_id}/v1/chat/completions"
    async with http.post(chat, json={"messages": small, "max_tokens": 16}) as first:
        reply = (await first.json())["choices"][0]["message"]
    messages = [*small, {"role": "assistant", "content": reply.get("content") or ""}]
    body = orjson.dumps({"messages": [*messages, {"role": "user", "content": text}], "max_tokens": 16})
    started = time.perf_counter()
    async with http.post(chat, data=body, headers=JSON_HEADERS) as response:
        await response.read()
    return response.status, time.perf_counter() - started


async def _send_largest(
    http: aiohttp.ClientSession, url: str, until: float, text: str, statuses: list[int], seconds: list[float]
) -> None:
    """Largest requests one after another until `until`."""
    while time.perf_counter() < until:
        status, took = await _one_largest(http, url, text)
        statuses.append(status)
        seconds.append(took)


def _largest_for(url: str, seconds: float, text: str) -> tuple[list[int], list[float]]:
    """(In the sender process.) Largest requests for `seconds`: their statuses and seconds each."""
    statuses: list[int] = []
    took: list[float] = []

    async def send() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)) as http:
            await _send_largest(http, url, time.perf_counter() + seconds, text, statuses, took)

    asyncio.run(send())
    return statuses, took


def _sender_ready() -> bool:
    """(In the sender process.) Nothing: submitted once so the process and this module are loaded."""
    return True


async def _warm_up(url: str, text: str) -> None:
    """One largest request before the phases: the server starts its tokenizer worker on the first."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)) as http:
        await _one_largest(http, url, text)


async def _loop_lag(http: aiohttp.ClientSession, url: str) -> dict[float, float]:
    """The server's loop-lag histogram now: cumulative count per bucket bound (+Inf included)."""
    from prometheus_client.parser import text_string_to_metric_families

    async with http.get(f"{url}/metrics") as response:
        text = await response.text()
    return {
        float(sample.labels["le"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == LOOP_LAG
        for sample in family.samples
        if sample.name == f"{LOOP_LAG}_bucket"
    }


def _lag_summary(before: dict[float, float], after: dict[float, float]) -> tuple[int, float, int]:
    """Wake-ups between two readings, the bound of the bucket holding their p99 (ms), and those late."""
    counts = {bound: after[bound] - before.get(bound, 0.0) for bound in sorted(after)}
    ticks = int(counts.get(float("inf"), 0.0))
    p99 = next((bound for bound, n in counts.items() if n >= 0.99 * ticks), float("inf")) if ticks else 0.0
    on_time = max((n for bound, n in counts.items() if bound <= LATE_TICK_S), default=0.0)
    return ticks, 1000 * p99, int(ticks - on_time)


async def _stall_phase(
    url: str, seconds: float, largest: tuple[ProcessPoolExecutor, str] | None = None
) -> StallResult:
    """One phase; with `largest` (a one-process sender and the text), the sender sends the largest
    requests meanwhile."""
    health: list[float] = []
    turns: list[float] = []
    statuses: list[int] = []
    big_seconds: list[float] = []
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        lag_before = await _loop_lag(http, url)
        until = time.perf_counter() + seconds
        work = [_probe_health(http, url, until, health)]
        work += [_keep_talking(http, url, until, turns) for _ in range(STALL_SESSIONS)]
        sent = None
        if largest is not None:
            sender, text = largest
            sent = asyncio.wrap_future(sender.submit(_largest_for, url, seconds, text))
        started = time.perf_counter()
        await asyncio.gather(*work)
        if sent is not None:
            statuses, big_seconds = await sent
        took = time.perf_counter() - started
        loop_ticks, loop_p99_ms, loop_late = _lag_summary(lag_before, await _loop_lag(http, url))
    counts = {status: statuses.count(status) for status in sorted(set(statuses))}
    return StallResult(
        load="idle" if largest is None else "largest request",
        seconds=took,
        health_probes=len(health),
        health_p50_ms=_ms(health, 0.5),
        health_p99_ms=_ms(health, 0.99),
        health_max_ms=_ms(health, 1.0),
        turns=len(turns),
        turn_p50_ms=_ms(turns, 0.5),
        turn_p99_ms=_ms(turns, 0.99),
        big_requests=len(statuses),
        big_chars=0 if largest is None else len(largest[1]),
        big_statuses=", ".join(f"{status} x {n}" for status, n in counts.items()),
        big_mean_s=statistics.mean(big_seconds) if big_seconds else 0.0,
        loop_ticks=loop_ticks,
        loop_lag_p99_ms=loop_p99_ms,
        loop_late_ticks=loop_late,
    )


def run_stall(tokenizer: str, logs: Path, seconds: float) -> list[StallResult]:
    """The stall case: idle, then under the largest allowed request, on one server (same run)."""
    from rl360_ext.session.service import chars_per_token
    from rl360_ext.templates.tokenizer import load_hf_tokenizer

    case = Case(sessions=STALL_SESSIONS, turns=STALL_TURNS, r3=False, servers=1, backend="instant")
    backend = start_backend(case, logs)
    options = server_options(case, backend, tokenizer) | {"max_context_tokens": STALL_CONTEXT}
    per_token = chars_per_token(load_hf_tokenizer(tokenizer), SessionServerConfig(backend.url, tokenizer))
    text = _largest_text(STALL_CONTEXT * per_token - STALL_MARGIN_CHARS)
    spawn = multiprocessing.get_context("spawn")
    with (
        running(backend),
        running(start_server(options, logs, 0)) as (server,),
        ProcessPoolExecutor(max_workers=1, mp_context=spawn) as sender,
    ):
        sender.submit(_sender_ready).result()
        asyncio.run(_warm_up(server.url, text))
        idle = asyncio.run(_stall_phase(server.url, seconds))
        return [idle, asyncio.run(_stall_phase(server.url, seconds, (sender, text)))]


def print_stall_table(results: Sequence[StallResult]) -> None:
    from rich.console import Console
    from rich.table import Table

    title = f"rl360 bench sessions: the largest allowed request vs {STALL_SESSIONS} sessions and /health"
    table = Table(title=title)
    for column in (
        "load", "s", "/health p50 / p99 / max ms", "turns", "turn p50 / p99 ms", "large requests", "chars",
        "statuses", "s each", "loop lag p99 ms", f"late > {1000 * LATE_TICK_S:.0f} ms",
    ):  # fmt: skip
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            r.load, f"{r.seconds:.1f}",
            f"{r.health_p50_ms:.1f} / {r.health_p99_ms:.1f} / {r.health_max_ms:.0f}",
            str(r.turns), f"{r.turn_p50_ms:.1f} / {r.turn_p99_ms:.1f}", str(r.big_requests),
            f"{r.big_chars:,}", r.big_statuses, f"{r.big_mean_s:.2f}",
            f"<= {r.loop_lag_p99_ms:g}", f"{r.loop_late_ticks} of {r.loop_ticks}",
        )  # fmt: skip
    console = Console(width=max(Console().width, 150))
    console.print(table)
    if len(results) == 2:
        idle, loaded = results
        console.print(
            "p99 under the largest request / idle: "
            f"/health {ratio_of(loaded.health_p99_ms, idle.health_p99_ms):.2f}x, "
            f"turns {ratio_of(loaded.turn_p99_ms, idle.turn_p99_ms):.2f}x (goal: within 2x)"
        )
