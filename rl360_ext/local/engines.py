"""The running engines and the SMG gateway in front of them, as the local stack's users see them.

Owns ending one service's process group (`end_process`: SIGTERM, SIGKILL after a grace), adding
and removing a gateway worker (`POST /workers`, `DELETE /workers/{id}`, waiting until SMG lists the
change), and reading the tiny engines' counters: injected 503s, model-busy seconds, requests
running and answered (`engine_requests`, through one keep-alive `engine_client`). Starting and
stopping the stack is `rl360_ext.local.stack`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from typing import Any

import httpx

from rl360_ext.util.procs import Service

FENCE_GRACE_S = 1.0  # a fenced engine that ignores SIGTERM this long is killed
GATEWAY_WAIT_S = 30.0  # how long the gateway may take to add or drop a worker


def end_process(service: Service, grace_s: float = FENCE_GRACE_S) -> str:
    """End `service`'s process group: "sigterm" when SIGTERM ended it within `grace_s`, "sigkill"
    when it had to be killed (a hung engine), "gone" when it had already exited."""
    if not service.alive():
        service.stop()
        return "gone"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(service.pid, signal.SIGTERM)
    try:
        service.process.wait(timeout=grace_s)
        how = "sigterm"
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(service.pid, signal.SIGKILL)
        service.process.wait(timeout=10)
        how = "sigkill"
    service.stop()  # already exited: forgets it
    return how


def add_gateway_worker(gateway_url: str, url: str, timeout_s: float = GATEWAY_WAIT_S) -> None:
    """`POST /workers {url}` and wait until the gateway lists the worker healthy (SMG registers it
    in the background: it answers 202 first)."""
    reply = httpx.post(f"{gateway_url}/workers", json={"url": url}, timeout=timeout_s)
    if reply.status_code not in (200, 201, 202):
        raise RuntimeError(f"the gateway refused worker {url}: {reply.status_code} {reply.text[:300]}")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            for worker in _gateway_worker_list(gateway_url):
                if worker.get("url") == url and worker.get("is_healthy", True):
                    return
        time.sleep(0.1)
    raise RuntimeError(f"the gateway did not list worker {url} healthy within {timeout_s:g} s")


def remove_gateway_worker(gateway_url: str, url: str) -> bool:
    """`DELETE /workers/{id}` for the worker at `url` (its id read from `GET /workers`); False
    when the gateway does not list it."""
    worker_id = next((w.get("id") for w in _gateway_worker_list(gateway_url) if w.get("url") == url), None)
    if worker_id is None:
        return False
    reply = httpx.delete(f"{gateway_url}/workers/{worker_id}", timeout=GATEWAY_WAIT_S)
    return reply.status_code in (200, 202, 204)


def wait_gateway_without(gateway_url: str, url: str, timeout_s: float = GATEWAY_WAIT_S) -> bool:
    """Wait until the gateway no longer lists `url` (SMG removes a worker in the background)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            if all(w.get("url") != url for w in _gateway_worker_list(gateway_url)):
                return True
        time.sleep(0.1)
    return False


def _gateway_worker_list(gateway_url: str) -> list[dict[str, Any]]:
    body = httpx.get(f"{gateway_url}/workers", timeout=5.0).json()
    workers = body.get("workers", body) if isinstance(body, dict) else body
    return [w for w in workers if isinstance(w, dict)]


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


def engine_busy_seconds(engines: list[Service]) -> dict[str, float]:
    """Seconds each tiny engine has spent in model steps so far (`server_info`
    internal_states[0].model_busy_s), by engine name; -1 when unreadable."""
    busy = {}
    for engine in engines:
        try:
            body = httpx.get(f"{engine.url}/server_info", timeout=10.0).json()
            busy[engine.name] = float(body["internal_states"][0]["model_busy_s"])
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
            busy[engine.name] = -1.0
    return busy


def engine_client(engines: list[Service]) -> httpx.AsyncClient:
    """One keep-alive client for a wait's polls of the engines (`engine_requests`): the pool holds
    at most one connection per engine, reused from poll to poll."""
    width = max(len(engines), 1)
    return httpx.AsyncClient(limits=httpx.Limits(max_connections=width, max_keepalive_connections=width))


async def engine_requests(
    client: httpx.AsyncClient, engines: list[Service], timeout_s: float = 10.0
) -> tuple[int, int]:
    """(requests the tiny engines are generating now, requests they have answered since start):
    `server_info` internal_states[0] `num_running_reqs` and `requests`, summed over the engines,
    read at once through `client` (`engine_client`), each read bounded by `timeout_s` (an engine
    unreadable in that time counts 0)."""

    async def counts(engine: Service) -> tuple[int, int]:
        try:
            reply = await client.get(f"{engine.url}/server_info", timeout=timeout_s)
            state = reply.json()["internal_states"][0]
            return int(state["num_running_reqs"]), int(state["requests"])
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
            return 0, 0

    replies = await asyncio.gather(*(counts(engine) for engine in engines))
    return sum(running for running, _ in replies), sum(answered for _, answered in replies)
