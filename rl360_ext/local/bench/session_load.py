"""The session bench's load generator: N concurrent agent conversations of T turns against the
session servers (sessions spread round robin, each turn appending the reply it got and one new
user message), measured from the client (turn latency, bytes, turns lost or retried) and from the
servers' processes (CPU per turn, RSS per session): `run_load` gives one case's `CaseResult`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
import orjson

from rl360_ext.local.bench.session_case import Case, CaseResult
from rl360_ext.util.proc_stat import cpu_seconds, rss_mb

SYSTEM = {"role": "system", "content": "You are a coding agent. Run the tests and fix the bug."}


CLIENT_TIMEOUT_S = 120.0


JSON_HEADERS = {"content-type": "application/json"}


AGENT_RETRIES = 2  # the OpenAI client's default max_retries for a connection the server dropped


WORDS = ("def", "return", "self", "value", "(", ")", ":", "\n", "    ", "import", "numpy", "17", "fix")


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


async def run_conversation(
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


async def run_load(case: Case, server: str, urls: Sequence[str], pids: Sequence[int]) -> CaseResult:
    latencies: list[list[float]] = [[] for _ in range(case.turns)]
    sent = [0]
    errors: list[str] = []
    retried = [0]
    connector = aiohttp.TCPConnector(limit=case.sessions + 8)
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
    rss_before = sum(rss_mb(pid) for pid in pids)
    cpu_before = sum(cpu_seconds(pid) for pid in pids)
    started = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        outcomes = await asyncio.gather(
            *(
                run_conversation(http, urls[k % len(urls)], case.turns, latencies, sent, errors, retried)
                for k in range(case.sessions)
            ),
            return_exceptions=True,
        )
        seconds = time.perf_counter() - started
        cpu = sum(cpu_seconds(pid) for pid in pids) - cpu_before
        rss = sum(rss_mb(pid) for pid in pids) - rss_before
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
