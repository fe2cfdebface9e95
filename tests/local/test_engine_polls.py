"""The in-flight wait's engine polls: one keep-alive connection per engine for a whole wait, every
read bounded, an unreadable engine counted 0 (real loopback HTTP servers stand in for the engines)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest

from rl360_ext.local.demo import driver as demo
from rl360_ext.local.demo.driver import DemoDriver
from rl360_ext.local.engines import engine_client, engine_requests


class FakeEngine:
    """A `/server_info` endpoint that counts the TCP connections and reads it is served on."""

    def __init__(self, answered: int, running_after: int | None = None, delay_s: float = 0.0) -> None:
        self.answered = answered
        self.running_after = running_after  # reads after which num_running_reqs turns 1
        self.delay_s = delay_s
        self.reads = 0
        self.connections: set[int] = set()
        self.lock = threading.Lock()
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive unless the client closes

            def do_GET(self) -> None:
                with engine.lock:
                    engine.connections.add(self.client_address[1])
                    engine.reads += 1
                    running = int(engine.running_after is not None and engine.reads > engine.running_after)
                time.sleep(engine.delay_s)
                body = json.dumps(
                    {"internal_states": [{"num_running_reqs": running, "requests": engine.answered}]}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.name = self.url
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def engines() -> Iterator[list[FakeEngine]]:
    made: list[FakeEngine] = []
    yield made
    for engine in made:
        engine.close()


def _closed_port_url() -> SimpleNamespace:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return SimpleNamespace(url=f"http://127.0.0.1:{port}", name="gone")


def test_polls_reuse_one_connection_per_engine(engines: list[FakeEngine]) -> None:
    engines += [FakeEngine(answered=3), FakeEngine(answered=4)]

    async def poll() -> list[tuple[int, int]]:
        async with engine_client(engines) as client:  # type: ignore[arg-type]
            return [await engine_requests(client, engines, 5.0) for _ in range(6)]  # type: ignore[arg-type]

    assert asyncio.run(poll()) == [(0, 7)] * 6
    assert [(e.reads, len(e.connections)) for e in engines] == [(6, 1), (6, 1)]


def test_an_unreadable_or_slow_engine_counts_zero_within_the_bound(engines: list[FakeEngine]) -> None:
    engines += [FakeEngine(answered=5), FakeEngine(answered=9, delay_s=2.0)]
    polled = [*engines, _closed_port_url()]

    async def poll() -> tuple[tuple[int, int], float]:
        async with engine_client(polled) as client:  # type: ignore[arg-type]
            started = time.monotonic()
            counts = await engine_requests(client, polled, 0.3)  # type: ignore[arg-type]
            return counts, time.monotonic() - started

    counts, seconds = asyncio.run(poll())
    assert counts == (0, 5) and seconds < 1.5


def _await_generation(engines: list[FakeEngine]) -> dict[str, Any]:
    """`DemoDriver.await_generation` over `engines` while a rollout that never finishes runs."""
    driver = SimpleNamespace(stack=SimpleNamespace(engines=engines))

    async def wait() -> dict[str, Any]:
        rollout = asyncio.get_running_loop().create_task(asyncio.sleep(30))
        try:
            return await DemoDriver.await_generation(driver, rollout)  # type: ignore[arg-type]
        finally:
            rollout.cancel()

    return asyncio.run(wait())


def test_await_generation_returns_when_an_engine_runs_the_rollout(engines: list[FakeEngine]) -> None:
    engines += [FakeEngine(answered=2), FakeEngine(answered=0, running_after=4)]
    seen = _await_generation(engines)
    assert seen["running_requests"] == 1 and seen["requests_answered"] == 0 and not seen["rollout_done"]
    assert [(e.reads, len(e.connections)) for e in engines] == [(5, 1), (5, 1)]


def test_await_generation_gives_up_at_the_wait_limit(
    engines: list[FakeEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    engines.append(FakeEngine(answered=1))
    monkeypatch.setattr(demo, "IN_FLIGHT_WAIT_S", 0.5)
    seen = _await_generation(engines)
    assert 0.4 <= seen["waited_s"] < 1.5 and seen["running_requests"] == 0
    assert engines[0].reads > 2 and len(engines[0].connections) == 1
