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

With a Miles checkout (`miles_src`), every case also runs Miles' own session server
(`miles_server.py`, Miles' code unchanged) in front of the same backend with the same
conversations, alternating with rl360's (A/B, then B/A in the next round; each run gets fresh
server processes), without R3 once and with R3 in both of Miles' modes (`full`: its default, every
turn records the whole routing; `in_place`: deltas); each Miles row is followed by the ratio
rl360/Miles of every measure. Miles' server forwards `/v1/chat/completions` with `input_ids`,
which the instant backend answers as SGLang does; the tiny engine serves only `/generate`, so
there rl360 runs alone and the bench says so. Miles' server imports torch and sglang: it runs
under `miles_python`, an interpreter where it imports (integration_tests/miles/setup_venv.sh).

The stall case (`stall_s` > 0) asks whether one request can stall everyone else: one server with
`--max-context-tokens STALL_CONTEXT`, STALL_SESSIONS sessions taking turns and a `/health` probe
every HEALTH_EVERY_S, first idle, then while one more client keeps sending the largest request the
caps allow (a second turn whose new message has `max_context_tokens x max_chars_per_token` characters
less STALL_MARGIN_CHARS: about the most the server tokenizes, after which its context check refuses
the prompt unsent), in the same run.
It reports /health and the other sessions' turn latency (p50/p99) in both phases and their ratio;
the goal is a p99 within 2x of idle.

It asserts nothing and owns none of the code it measures.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from rl360_ext.local.local_ray import local_ray
from rl360_ext.local.services import start_engine
from rl360_ext.session.options import ServiceOptions
from rl360_ext.util.fielddocs import field_flags
from rl360_ext.util.proc_stat import SYSTEM_TICKS, USER_TICKS, stat_fields
from rl360_ext.util.procs import LOOPBACK, Service, free_port, rl360_argv, running, start_service
from rl360_ext.util.progress import stage

SYSTEM = {"role": "system", "content": "You are a coding agent. Run the tests and fix the bug."}
R3_SHAPE = (61, 8, 256)  # K2-Horizon-375B: 61 layers x top-8 of 256 experts, as in the field
CLIENT_TIMEOUT_S = 120.0
RL360 = "rl360"
MILES_MODES = ("full", "in_place")  # Miles' R3 modes: its default (whole routing per turn), deltas
MILES_SERVERS = {"full": "miles", "in_place": "miles in_place"}  # a mode's server name in the table
JSON_HEADERS = {"content-type": "application/json"}
AGENT_RETRIES = 2  # the OpenAI client's default max_retries for a connection the server dropped
MILES_SCRIPT = Path(__file__).with_name("miles_server.py")
MILES_READY_TIMEOUT_S = 300.0  # Miles imports torch, transformers and sglang before it serves
MILES_VENV_ENV = "MILES_VENV"  # setup_venv.sh's variable: the venv Miles' modules import in
DEFAULT_MILES_VENV = Path("/tmp/miles-venv")
MAX_SESSIONS = 100_000  # every session of the largest case stays open until the run ends
STALL_CONTEXT = 32768  # the stall case's --max-context-tokens (the tiny engine's default context)
STALL_SESSIONS = 4  # sessions taking turns beside the largest request
HEALTH_EVERY_S = 0.02  # the /health probe's period
STALL_MARGIN_CHARS = 1024  # the largest message is this much under the budget: the turn's other text fits
STALL_TURNS = 16  # turns per conversation of the stall case's other sessions (then a new session)
WORDS = ("def", "return", "self", "value", "(", ")", ":", "\n", "    ", "import", "numpy", "17", "fix")


class Hosting(StrEnum):
    """What an rl360 session server of a case runs in."""

    PROCESS = "process"  # `rl360 session serve`
    ACTOR = "actor"  # a `SessionPool` actor (uvicorn on the actor's event loop)


@dataclass(frozen=True)
class Case:
    """One load: `sessions` concurrent conversations of `turns` turns on `servers` servers."""

    sessions: int
    turns: int
    r3: bool
    servers: int
    backend: str  # "instant" | "tiny"
    hosting: Hosting = Hosting.PROCESS


@dataclass(frozen=True)
class Miles:
    """A Miles checkout and the interpreter its session server imports in."""

    src: Path
    python: str


class MilesUnavailable(ValueError):
    """--miles-src is not a Miles checkout, or Miles' session server imports under no interpreter."""


@dataclass
class CaseResult:
    case: Case
    server: str  # "rl360", "miles" (Miles' default R3 mode: full routing) or "miles in_place"
    turns_done: int
    turns_lost: int
    seconds: float
    turns_per_s: float
    p50_ms: float
    p99_ms: float
    second_turn_p50_ms: float
    last_turn_p50_ms: float
    server_cpu_ms_per_turn: float
    bytes_per_turn: float
    memory_mb_per_session: float
    lost_because: str = ""  # the first failed turn's cause, "" when none was lost
    turns_retried: int = 0  # turns the agent sent again after the server dropped them unanswered


def _cpu_seconds(pid: int) -> float:
    fields = stat_fields(pid)
    if fields is None:
        raise ProcessLookupError(f"process {pid} is gone")
    return (int(fields[USER_TICKS]) + int(fields[SYSTEM_TICKS])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _backend(case: Case, logs: Path) -> Service:
    layers, top_k, experts = R3_SHAPE if case.r3 else (4, 2, 8)
    if case.backend == "tiny":
        return start_engine(logs, name="engine")
    port = free_port()
    argv = rl360_argv(
        "engine", "instant", "--host", LOOPBACK, "--port", str(port),
        "--layers", str(layers), "--top-k", str(top_k), "--experts", str(experts),
    )  # fmt: skip
    return start_service("instant", argv, port, logs, repick_port=True)


def _server_options(case: Case, backend: Service, tokenizer: str) -> dict[str, Any]:
    """The `ServiceOptions` values every rl360 server of a case serves with, process or actor alike."""
    options: dict[str, Any] = {
        "backend_url": backend.url, "tokenizer_dir": tokenizer, "r3": case.r3, "max_sessions": MAX_SESSIONS,
    }  # fmt: skip
    if case.r3 and case.backend == "instant":  # a tiny engine reports its shape in /model_info
        layers, top_k, experts = R3_SHAPE
        options |= {"routing_layers": layers, "routing_top_k": top_k, "routing_experts": experts}
    return options


def _server(options: dict[str, Any], logs: Path, number: int) -> Service:
    port = free_port()
    flags = field_flags(ServiceOptions, options)
    argv = rl360_argv("session", "serve", "--host", LOOPBACK, "--port", str(port), *flags)
    return start_service(f"session{number}", argv, port, logs, repick_port=True)


@contextlib.contextmanager
def _pool(options: dict[str, Any], servers: int) -> Iterator[tuple[list[str], list[int]]]:
    """(URLs, pids) of a `SessionPool` of `servers` actors in this process's Ray."""
    import ray

    from rl360_ext.session.pool import SessionPool

    pool = SessionPool(servers, host=LOOPBACK, **options)
    try:
        yield list(pool.urls), ray.get([actor.pid.remote() for actor in pool.actors])
    finally:
        pool.shutdown()


def _miles_server(
    case: Case, mode: str, backend: Service, tokenizer: str, logs: Path, miles: Miles, number: int
) -> Service:
    port = free_port()
    argv = [
        miles.python, str(MILES_SCRIPT), "--miles-src", str(miles.src), "--backend", backend.url,
        "--tokenizer", tokenizer, "--host", LOOPBACK, "--port", str(port), "--mode", mode,
        "--timeout", str(CLIENT_TIMEOUT_S), *(["--r3"] if case.r3 else []),
    ]  # fmt: skip
    return start_service(
        f"miles{number}", argv, port, logs, ready_timeout_s=MILES_READY_TIMEOUT_S, repick_port=True
    )


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


async def _turn(http: aiohttp.ClientSession, url: str, body: bytes, retried: list[int]) -> bytes:
    """The reply's body; a turn the server dropped unanswered is sent again, as OpenAI clients do."""
    for attempt in range(AGENT_RETRIES + 1):
        try:
            async with http.post(url, data=body, headers=JSON_HEADERS) as response:
                content = await response.read()
                if response.status >= 400:
                    raise ValueError(f"HTTP {response.status}: {content[:200].decode(errors='replace')}")
                return content
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            if attempt == AGENT_RETRIES:
                raise
            retried[0] += 1
    raise AssertionError("unreachable: the last attempt returns or raises")


async def _conversation(
    http: aiohttp.ClientSession,
    url: str,
    turns: int,
    latencies: list[list[float]],
    sent: list[int],
    errors: list[str],
    retried: list[int],
) -> tuple[int, int, str | None]:
    """(turns done, turns lost, session id) of one session; a failed turn's cause goes to `errors`."""
    async with http.post(f"{url}/sessions", json={}) as created:
        created.raise_for_status()
        session_id = (await created.json())["session_id"]
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "The test suite fails; fix it."}]
    done = lost = 0
    for turn in range(turns):
        body = orjson.dumps({"model": "policy", "messages": messages, "max_tokens": 16, "temperature": 0.0})
        started = time.perf_counter()
        try:
            content = await _turn(http, f"{url}/sessions/{session_id}/v1/chat/completions", body, retried)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            errors.append(f"turn {turn}: {type(exc).__name__}: {exc}")
            lost += turns - turn
            break
        latencies[turn].append(time.perf_counter() - started)
        sent[0] += len(body) + len(content)
        reply = orjson.loads(content)["choices"][0]["message"]
        messages = [
            *messages,
            {"role": "assistant", "content": reply.get("content") or ""},
            {"role": "user", "content": f"Turn {turn}: the tests still fail on case {turn % 7}; look again."},
        ]
        done += 1
    return done, lost, session_id


async def _load(case: Case, server: str, urls: Sequence[str], pids: Sequence[int]) -> CaseResult:
    latencies: list[list[float]] = [[] for _ in range(case.turns)]
    sent = [0]
    errors: list[str] = []
    retried = [0]
    connector = aiohttp.TCPConnector(limit=case.sessions + 8)
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
    rss_before = sum(_rss_mb(pid) for pid in pids)
    cpu_before = sum(_cpu_seconds(pid) for pid in pids)
    started = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        outcomes = await asyncio.gather(
            *(
                _conversation(http, urls[k % len(urls)], case.turns, latencies, sent, errors, retried)
                for k in range(case.sessions)
            ),
            return_exceptions=True,
        )
        seconds = time.perf_counter() - started
        cpu = sum(_cpu_seconds(pid) for pid in pids) - cpu_before
        rss = sum(_rss_mb(pid) for pid in pids) - rss_before
        ids = [(urls[k % len(urls)], o[2]) for k, o in enumerate(outcomes) if isinstance(o, tuple) and o[2]]
        await asyncio.gather(
            *(_delete(http, f"{url}/sessions/{sid}") for url, sid in ids), return_exceptions=True
        )
    errors += [f"session: {type(o).__name__}: {o}" for o in outcomes if isinstance(o, BaseException)]
    done = sum(o[0] for o in outcomes if isinstance(o, tuple))
    lost = case.sessions * case.turns - done
    flat = sorted(x for per_turn in latencies for x in per_turn)

    def ms(values: Sequence[float], q: float) -> float:
        if not values:
            return float("nan")
        ordered = sorted(values)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return CaseResult(
        case=case,
        server=server,
        turns_done=done,
        turns_lost=lost,
        seconds=seconds,
        turns_per_s=done / seconds if seconds > 0 else 0.0,
        p50_ms=ms(flat, 0.5),
        p99_ms=ms(flat, 0.99),
        second_turn_p50_ms=ms(latencies[min(1, case.turns - 1)], 0.5),
        last_turn_p50_ms=ms(latencies[-1], 0.5),
        server_cpu_ms_per_turn=1000 * cpu / done if done else float("nan"),
        bytes_per_turn=sent[0] / done if done else float("nan"),
        memory_mb_per_session=rss / case.sessions,
        lost_because=errors[0] if errors else "",
        turns_retried=retried[0],
    )


async def _delete(http: aiohttp.ClientSession, url: str) -> None:
    async with http.delete(url) as response:
        await response.read()


def _run_one(
    case: Case, server: str, backend: Service, tokenizer: str, logs: Path, miles: Miles | None
) -> CaseResult:
    if server == RL360:
        options = _server_options(case, backend, tokenizer)
        if case.hosting is Hosting.ACTOR:
            with _pool(options, case.servers) as (urls, pids):
                return asyncio.run(_load(case, server, urls, pids))
        started = [_server(options, logs, n) for n in range(case.servers)]
    else:
        assert miles is not None
        mode = next(mode for mode, name in MILES_SERVERS.items() if name == server)
        started = [_miles_server(case, mode, backend, tokenizer, logs, miles, n) for n in range(case.servers)]
    with running(*started):
        return asyncio.run(_load(case, server, [s.url for s in started], [s.pid for s in started]))


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
        await _conversation(http, url, STALL_TURNS, latencies, [0], errors, [0])
        if errors:
            raise RuntimeError(f"a turn beside the largest request failed: {errors[0]}")
        out.extend(x for per_turn in latencies for x in per_turn)


async def _send_largest(
    http: aiohttp.ClientSession, url: str, until: float, text: str, statuses: list[int], seconds: list[float]
) -> None:
    """New sessions whose second turn appends a message of `text`, until `until`."""
    small = [SYSTEM, {"role": "user", "content": "The test suite fails; fix it."}]
    while time.perf_counter() < until:
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
            statuses.append(response.status)
        seconds.append(time.perf_counter() - started)


async def _stall_phase(url: str, seconds: float, text: str | None) -> StallResult:
    health: list[float] = []
    turns: list[float] = []
    statuses: list[int] = []
    big_seconds: list[float] = []
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        until = time.perf_counter() + seconds
        work = [_probe_health(http, url, until, health)]
        work += [_keep_talking(http, url, until, turns) for _ in range(STALL_SESSIONS)]
        if text is not None:
            work.append(_send_largest(http, url, until, text, statuses, big_seconds))
        started = time.perf_counter()
        await asyncio.gather(*work)
        took = time.perf_counter() - started
    counts = {status: statuses.count(status) for status in sorted(set(statuses))}
    return StallResult(
        load="idle" if text is None else "largest request",
        seconds=took,
        health_probes=len(health),
        health_p50_ms=_ms(health, 0.5),
        health_p99_ms=_ms(health, 0.99),
        health_max_ms=_ms(health, 1.0),
        turns=len(turns),
        turn_p50_ms=_ms(turns, 0.5),
        turn_p99_ms=_ms(turns, 0.99),
        big_requests=len(statuses),
        big_chars=0 if text is None else len(text),
        big_statuses=", ".join(f"{status} x {n}" for status, n in counts.items()),
        big_mean_s=statistics.mean(big_seconds) if big_seconds else 0.0,
    )


def run_stall(tokenizer: str, logs: Path, seconds: float) -> list[StallResult]:
    """The stall case: idle, then under the largest allowed request, on one server (same run)."""
    from rl360_ext.session.service import chars_per_token
    from rl360_ext.templates.tokenizer import load_hf_tokenizer

    case = Case(sessions=STALL_SESSIONS, turns=STALL_TURNS, r3=False, servers=1, backend="instant")
    backend = _backend(case, logs)
    options = _server_options(case, backend, tokenizer) | {"max_context_tokens": STALL_CONTEXT}
    per_token = chars_per_token(load_hf_tokenizer(tokenizer), ServiceOptions(backend.url, tokenizer))
    text = _largest_text(STALL_CONTEXT * per_token - STALL_MARGIN_CHARS)
    with running(backend), running(_server(options, logs, 0)) as (server,):
        idle = asyncio.run(_stall_phase(server.url, seconds, None))
        return [idle, asyncio.run(_stall_phase(server.url, seconds, text))]


def _stall_table(results: Sequence[StallResult]) -> None:
    from rich.console import Console
    from rich.table import Table

    title = f"rl360 bench sessions: the largest allowed request vs {STALL_SESSIONS} sessions and /health"
    table = Table(title=title)
    for column in (
        "load", "s", "/health p50 / p99 / max ms", "turns", "turn p50 / p99 ms", "large requests", "chars",
        "statuses", "s each",
    ):  # fmt: skip
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            r.load, f"{r.seconds:.1f}",
            f"{r.health_p50_ms:.1f} / {r.health_p99_ms:.1f} / {r.health_max_ms:.0f}",
            str(r.turns), f"{r.turn_p50_ms:.1f} / {r.turn_p99_ms:.1f}", str(r.big_requests),
            f"{r.big_chars:,}", r.big_statuses, f"{r.big_mean_s:.2f}",
        )  # fmt: skip
    console = Console(width=max(Console().width, 150))
    console.print(table)
    if len(results) == 2:
        idle, loaded = results
        console.print(
            "p99 under the largest request / idle: "
            f"/health {_ratio(loaded.health_p99_ms, idle.health_p99_ms):.2f}x, "
            f"turns {_ratio(loaded.turn_p99_ms, idle.turn_p99_ms):.2f}x (goal: within 2x)"
        )


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
    backend = _backend(case, logs)
    with running(backend):
        for number in range(rounds):
            for name in names if number % 2 == 0 else reversed(names):
                runs[name].append(_run_one(case, name, backend, tokenizer, logs, miles))
    return [_median(runs[name]) for name in names]


def find_miles(src: str | None, python: str | None = None) -> Miles | None:
    """The Miles checkout (`src`, else $MILES_SRC) and an interpreter its session server imports in.

    None without a checkout. The interpreter is `python`, else this one if Miles imports here, else
    $MILES_VENV/bin/python, else /tmp/miles-venv/bin/python; MilesUnavailable if it imports in none.
    """
    src = src or os.environ.get("MILES_SRC")
    if not src:
        return None
    root = Path(src).expanduser().resolve()
    if not (root / "miles" / "rollout" / "session" / "server.py").is_file():
        raise MilesUnavailable(
            f"--miles-src: {root} is not a radixark/miles checkout (no miles/rollout/session/server.py)"
        )
    venv = os.environ.get(MILES_VENV_ENV)
    candidates = (
        [python]
        if python
        else [
            sys.executable,
            *([str(Path(venv) / "bin" / "python")] if venv else []),
            str(DEFAULT_MILES_VENV / "bin" / "python"),
        ]
    )
    errors = []
    for candidate in candidates:
        error = _miles_import_error(root, candidate)
        if error is None:
            return Miles(root, candidate)
        errors.append(f"{candidate}: {error}")
    raise MilesUnavailable(
        "Miles' session server does not import under " + "; ".join(errors) + " (it needs torch and sglang: "
        "build a venv with integration_tests/miles/setup_venv.sh and pass --miles-python or set MILES_VENV)"
    )


def _miles_import_error(root: Path, python: str) -> str | None:
    if not Path(python).is_file():
        return "no such interpreter"
    probe = f"import sys; sys.path.insert(0, {str(root)!r}); import miles.rollout.session.server"
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


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
                **{m: _ratio(getattr(ours, m), getattr(miles, m)) for m in RATIO_MEASURES},
            }
        )
    return out


def _ratio(ours: float, theirs: float) -> float:
    return ours / theirs if theirs and theirs == theirs else float("nan")


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
            x = {m: _ratio(getattr(ours, m), getattr(r, m)) for m in RATIO_MEASURES}
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
            _stall_table(stall)
    return results
