"""What the /run server checks before the app reads a byte of a body, and how long it waits for one.

Owns the connection-level rules of the Harbor /run server, applied in front of FastAPI:
- `RequestGuard` (ASGI middleware): with a token, every request (every path, unknown ones
  too) must carry `Authorization: Bearer <token>`, compared in constant time, before the body is
  read; then a declared `Content-Length` over `HttpLimits.max_body_bytes` is a 413 unread; then
  the body is read here, counted while it streams (chunked bodies too: over the cap is a 413 as
  soon as the count passes it) and bounded by `HttpLimits.body_timeout_s` (a 408), and only a
  complete body within both reaches the app. Every refusal closes the connection, so a client
  still sending is cut off rather than drained.
- the protocol below it (`rl360_ext.util.http_guard.GuardedHttpProtocol`, `guarded_protocol`
  here): a request's start line and headers are capped (bytes and fields: 431, answered in this
  server's shape) and must arrive within `HttpLimits.header_timeout_s`, before any of the above;
- a body must be UTF-8 (JSON's encoding): other bytes are a 400 naming the body and the offset.
Refusals are `rl360_ext.harbor.errors` classes, answered in their shape. It does not own the
routes, the schema or what a request does.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from rl360_ext.harbor.errors import (
    BodyInvalid,
    BodyTimeout,
    BodyTooLarge,
    HarborRequestError,
    HeaderInvalid,
    HeadTooLarge,
    Unauthorized,
    detail,
)
from rl360_ext.util.http_guard import GuardedHttpProtocol, HeadLimits

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class HttpLimits:
    """The connection limits of one server (from `rl360_ext.harbor.settings.HarborServerConfig`)."""

    max_body_bytes: int = 1 << 20
    """Largest body, declared or counted while it streams (over it: 413)."""
    header_timeout_s: float = 10.0
    """Deadline for a request's start line and headers (past it: the connection is closed)."""
    body_timeout_s: float = 30.0
    """Deadline for the whole body, from the headers (past it: 408)."""
    max_head_bytes: int = HeadLimits.max_head_bytes
    """Largest start line plus headers (over it: 431 and close, before the token is checked)."""
    max_headers: int = HeadLimits.max_headers
    """Most header fields in one request (over it: 431 and close)."""

    @property
    def head(self) -> HeadLimits:
        return HeadLimits(self.header_timeout_s, self.max_head_bytes, self.max_headers)


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
            _check_utf8(body)
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


def _check_utf8(body: bytes) -> None:
    """A JSON body is UTF-8 (RFC 8259); any other bytes are refused here, naming where."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyInvalid("body", f"the body is not UTF-8 (byte {exc.start}: {exc.reason})") from None


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


def _head_refusal(field: str, message: str) -> bytes:
    return json.dumps(detail(HeadTooLarge(field, message))).encode()


def guarded_protocol(limits: HttpLimits) -> type[GuardedHttpProtocol]:
    """uvicorn's `http` for this server: the shared head guard, refusals in this server's shape."""
    return GuardedHttpProtocol.configured(limits.head, _head_refusal)
