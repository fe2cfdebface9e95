"""The /run guard as plain ASGI: the token and the body cap are checked before a byte of the body
is read, a streamed body is counted while it arrives, a stalled one times out; only a complete
body within the cap reaches the app."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from rl360_ext.harbor.guard import HttpLimits, RequestGuard

LIMITS = HttpLimits(max_body_bytes=1000, header_timeout_s=1.0, body_timeout_s=0.3)
TOKEN = "s3cret"


class Client:
    """One request: its headers, the body chunks it will send, what the guard read and answered."""

    def __init__(
        self, headers: dict[str, str], chunks: list[bytes] | None = None, stall: bool = False
    ) -> None:
        self.scope = {
            "type": "http",
            "method": "POST",
            "path": "/run",
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        }
        self.chunks = list(chunks or [])
        self.stall = stall
        self.received = 0
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        if not self.chunks:
            if self.stall:
                await asyncio.Event().wait()
            return {"type": "http.disconnect"}
        self.received += 1
        chunk = self.chunks.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(self.chunks) or self.stall}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return self.sent[0]["status"]

    @property
    def detail(self) -> dict[str, Any]:
        return json.loads(self.sent[1]["body"])["detail"][0]


class App:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        self.bodies.append(message["body"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def _run(client: Client, token: str | None = TOKEN) -> App:
    app = App()
    await RequestGuard(app, token, LIMITS)(client.scope, client.receive, client.send)
    return app


AUTH = {"authorization": f"Bearer {TOKEN}"}


@pytest.mark.parametrize(
    "headers", [{}, {"authorization": "Bearer nope"}, {"authorization": f"Basic {TOKEN}"}]
)
async def test_without_the_token_nothing_of_the_body_is_read(headers: dict[str, str]) -> None:
    client = Client({**headers, "content-length": str(10**9)}, [b"x" * 100] * 50)
    app = await _run(client)
    assert client.status == 401 and client.received == 0 and not app.bodies
    assert client.detail["loc"] == ["header", "authorization"]
    assert (b"connection", b"close") in client.sent[0]["headers"]


async def test_a_declared_length_over_the_cap_is_413_unread() -> None:
    client = Client({**AUTH, "content-length": "1001"}, [b"x" * 1001])
    app = await _run(client)
    assert (client.status, client.received, app.bodies) == (413, 0, [])
    assert client.detail["loc"] == ["body", "body"] and "1000 bytes" in client.detail["msg"]


async def test_a_streamed_body_is_cut_off_as_soon_as_it_passes_the_cap() -> None:
    client = Client(AUTH, [b"x" * 300] * 10)  # chunked: no Content-Length
    app = await _run(client)
    assert client.status == 413 and client.received == 4 and not app.bodies  # 1200 > 1000 at the 4th


async def test_a_stalled_body_times_out_with_408() -> None:
    client = Client({**AUTH, "content-length": "100"}, [b"x" * 10], stall=True)
    started = time.monotonic()
    app = await _run(client)
    assert client.status == 408 and not app.bodies
    assert time.monotonic() - started < LIMITS.body_timeout_s + 1.0


async def test_a_malformed_length_is_400() -> None:
    client = Client({**AUTH, "content-length": "12abc"})
    await _run(client)
    assert client.status == 400 and client.detail["loc"] == ["header", "content-length"]


async def test_a_complete_body_within_the_cap_reaches_the_app_whole() -> None:
    client = Client(AUTH, [b"a" * 400, b"b" * 600])
    app = await _run(client)
    assert client.status == 200 and app.bodies == [b"a" * 400 + b"b" * 600]
    open_client = Client({}, [b"{}"])
    assert (await _run(open_client, token=None)).bodies == [b"{}"] and open_client.status == 200


async def test_other_scopes_pass_through() -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    await RequestGuard(app, TOKEN, LIMITS)({"type": "lifespan"}, None, None)  # type: ignore[arg-type]
    assert seen == ["lifespan"]
