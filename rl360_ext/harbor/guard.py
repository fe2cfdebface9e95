"""What the /run server checks before the app reads a byte of a body, and how long it waits for one.

Owns the connection-level rules of the Harbor /run server, applied in front of FastAPI:
- `RequestGuard` (ASGI middleware): with a token, every request (every path, unknown ones
  too) must carry `Authorization: Bearer <token>`, compared in constant time, before the body is
  read; then a declared `Content-Length` over `HttpLimits.max_body_bytes` is a 413 unread; then
  the body is read here, counted while it streams (chunked bodies too: over the cap is a 413 as
  soon as the count passes it) and bounded by `HttpLimits.body_timeout_s` (a 408), and only a
  complete body within both reaches the app. Every refusal closes the connection, so a client
  still sending is cut off rather than drained.
- `GuardedHttpProtocol` (uvicorn's httptools protocol): a request's start line and headers must
  arrive within `HttpLimits.header_timeout_s` of the connection opening (the first request) or
  of the request's first byte (the next ones; an idle keep-alive connection is uvicorn's
  keep-alive timeout's); a slow or half-sent request is dropped then.
Refusals are `rl360_ext.harbor.errors` classes, answered in their shape. It does not own the
routes, the schema or what a request does.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from asyncio import TimerHandle
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from rl360_ext.harbor.errors import (
    BodyTimeout,
    BodyTooLarge,
    HarborRequestError,
    HeaderInvalid,
    Unauthorized,
    detail,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class HttpLimits:
    """The connection limits of one server (from `rl360_ext.harbor.settings.ServerSettings`)."""

    max_body_bytes: int = 1 << 20
    """Largest body, declared or counted while it streams (over it: 413)."""
    header_timeout_s: float = 10.0
    """Deadline for a request's start line and headers (past it: the connection is closed)."""
    body_timeout_s: float = 30.0
    """Deadline for the whole body, from the headers (past it: 408)."""


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


def _token_matches(header: bytes | None, token: str) -> bool:
    """A `Bearer <token>` header carries exactly `token` (constant-time comparison)."""
    scheme, _, given = (header or b"").decode("latin-1").partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(given.strip().encode(), token.encode())


class RequestGuard:
    """ASGI middleware: the token, the body cap and the body timeout, before the app runs."""

    def __init__(self, app: ASGIApp, token: str | None, limits: HttpLimits) -> None:
        self.app, self.token, self.limits = app, token, limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            self._check_headers(scope)
            body = await self._read_body(receive)
        except HarborRequestError as refused:
            await _refuse(send, refused)
            return
        await self.app(scope, _replay(body, receive), send)

    def _check_headers(self, scope: Scope) -> None:
        if self.token is not None and not _token_matches(_header(scope, b"authorization"), self.token):
            raise Unauthorized("authorization", "missing or wrong bearer token")
        declared = _header(scope, b"content-length")
        if declared is None:
            return
        if not declared.strip().isdigit():
            raise HeaderInvalid("content-length", "Content-Length is not a number")
        if int(declared) > self.limits.max_body_bytes:
            raise self._too_large(f"Content-Length {int(declared)}")

    def _too_large(self, what: str) -> BodyTooLarge:
        return BodyTooLarge(
            "body", f"{what} is over the server's body cap of {self.limits.max_body_bytes} bytes"
        )

    async def _read_body(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.limits.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        break  # the client went away; the app sees the disconnect
                    chunk = bytes(message.get("body", b""))
                    size += len(chunk)
                    if size > self.limits.max_body_bytes:
                        raise self._too_large("the body")
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            raise BodyTimeout(
                "body", f"the body did not arrive within {self.limits.body_timeout_s:g}s"
            ) from None
        return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The app's `receive`: the body read by the guard once, then the connection's own messages."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed


async def _refuse(send: Send, refused: HarborRequestError) -> None:
    """Answer the refusal and close the connection (whatever the client is still sending is cut off)."""
    content = json.dumps(detail(refused)).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(content)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": int(refused.status), "headers": headers})
    await send({"type": "http.response.body", "body": content})


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline on each request's start line and headers."""

    header_timeout_s: float = HttpLimits.header_timeout_s

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: TimerHandle | None = None

    @classmethod
    def with_limits(cls, limits: HttpLimits) -> type[GuardedHttpProtocol]:
        return type(cls.__name__, (cls,), {"header_timeout_s": limits.header_timeout_s})

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._header_timer is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
