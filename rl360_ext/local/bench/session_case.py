"""What one case of the session bench starts: its backend (the instant SGLang stand-in or a tiny
engine) and rl360's session servers in front of it, as processes or as the Ray actors of a
`SessionPool` (`Hosting`, `Case`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from rl360_ext.local.services import start_engine
from rl360_ext.session.options import SessionServerConfig
from rl360_ext.util.fielddocs import field_flags
from rl360_ext.util.procs import LOOPBACK, Service, free_port, rl360_argv, start_service

R3_SHAPE = (61, 8, 256)  # K2-Horizon-375B: 61 layers x top-8 of 256 experts, as in the field


RL360 = "rl360"


MAX_SESSIONS = 100_000  # every session of the largest case stays open until the run ends


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


def start_backend(case: Case, logs: Path) -> Service:
    layers, top_k, experts = R3_SHAPE if case.r3 else (4, 2, 8)
    if case.backend == "tiny":
        return start_engine(logs, name="engine")
    port = free_port()
    argv = rl360_argv(
        "engine", "instant", "--host", LOOPBACK, "--port", str(port),
        "--layers", str(layers), "--top-k", str(top_k), "--experts", str(experts),
    )  # fmt: skip
    return start_service("instant", argv, port, logs, repick_port=True)


def server_options(case: Case, backend: Service, tokenizer: str) -> dict[str, Any]:
    """The `SessionServerConfig` values every rl360 server of a case serves with, process or actor alike."""
    options: dict[str, Any] = {
        "backend_url": backend.url, "tokenizer_dir": tokenizer, "r3": case.r3, "max_sessions": MAX_SESSIONS,
    }  # fmt: skip
    if case.r3 and case.backend == "instant":  # a tiny engine reports its shape in /model_info
        layers, top_k, experts = R3_SHAPE
        options |= {"routing_layers": layers, "routing_top_k": top_k, "routing_experts": experts}
    return options


def start_server(options: dict[str, Any], logs: Path, number: int) -> Service:
    port = free_port()
    flags = field_flags(SessionServerConfig, options)
    argv = rl360_argv("session", "serve", "--host", LOOPBACK, "--port", str(port), *flags)
    return start_service(f"session{number}", argv, port, logs, repick_port=True)


@contextlib.contextmanager
def server_pool(options: dict[str, Any], servers: int) -> Iterator[tuple[list[str], list[int]]]:
    """(URLs, pids) of a `SessionPool` of `servers` actors in this process's Ray."""
    import ray

    from rl360_ext.session.pool import SessionPool

    pool = SessionPool(servers, host=LOOPBACK, **options)
    try:
        yield list(pool.urls), ray.get([actor.pid.remote() for actor in pool.actors])
    finally:
        pool.shutdown()


def ratio_of(ours: float, theirs: float) -> float:
    return ours / theirs if theirs and theirs == theirs else float("nan")
