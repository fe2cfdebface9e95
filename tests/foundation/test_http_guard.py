"""`rl360_ext.util.http_guard`: a real uvicorn on loopback under the guarded protocol; heads over
the caps are answered 431 and closed before the app sees them, unread beyond the cap; normal
requests and keep-alive connections are served as before."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from rl360_ext.util.http_guard import GuardedHttpProtocol, HeadLimits

LIMITS = HeadLimits(header_timeout_s=1.0, max_head_bytes=4096, max_headers=20)


class _App:
    def __init__(self) -> None:
        self.seen = 0

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        self.seen += 1
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[int, _App]]:
    app = _App()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app, http=GuardedHttpProtocol.configured(LIMITS), log_level="warning", lifespan="off", loop="asyncio"
    )
    runner = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(runner.serve(sockets=[sock])), daemon=True)
    thread.start()
    while not runner.started:
        time.sleep(0.01)
    yield sock.getsockname()[1], app
    runner.should_exit = True
    thread.join(10)


def _exchange(port: int, data: bytes) -> bytes:
    """Send `data` (as far as the server reads it), then read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        with contextlib.suppress(OSError):
            conn.sendall(data)
        answer = b""
        with contextlib.suppress(OSError):
            while chunk := conn.recv(65536):
                answer += chunk
                if b"connection: close" not in answer and answer.endswith(b"ok"):
                    break
    return answer


def test_a_normal_request_and_a_keep_alive_second_one_are_served(server: tuple[int, _App]) -> None:
    port, _ = server
    request = b"GET / HTTP/1.1\r\nhost: x\r\n" + b"x-a: b\r\n" * 10 + b"\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        for _ in range(2):
            conn.sendall(request)
            answer = b""
            while not answer.endswith(b"ok"):
                answer += conn.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize(
    ("head", "field"),
    [
        (b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 8192 + b"\r\n\r\n", "headers"),
        (b"GET / HTTP/1.1\r\nhost: x\r\n" + b"x-a: b\r\n" * 21 + b"\r\n", "headers"),
        (b"GET /" + b"a" * 8192 + b" HTTP/1.1\r\nhost: x\r\n\r\n", "url"),
        (b"POST / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * (4 << 20), "headers"),  # never ends
    ],
    ids=["big-header", "too-many-headers", "long-url", "endless-header-line"],
)
def test_heads_over_the_caps_are_431_and_never_reach_the_app(
    server: tuple[int, _App], head: bytes, field: str
) -> None:
    port, app = server
    seen = app.seen
    answer = _exchange(port, head)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["param"] == field and body["error"]["code"] == 431
    assert app.seen == seen


def test_a_head_that_stops_half_way_is_dropped_at_the_deadline(server: tuple[int, _App]) -> None:
    port, _ = server
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n")
        assert conn.recv(65536) == b""  # closed after header_timeout_s, nothing answered


def test_a_pipelined_oversized_head_is_never_answered_ahead_of_the_request_before_it(
    server: tuple[int, _App],
) -> None:
    port, _ = server
    first = b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhi"
    second = b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 8192 + b"\r\n\r\n"
    answer = _exchange(port, first + second)  # the 431, if any, comes after the first answer
    assert not answer.startswith(b"HTTP/1.1 431"), answer[:400]
    assert b"x-big" not in answer
