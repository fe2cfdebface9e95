"""The protocol-level guard every rl360 HTTP server runs under: a request's head is bounded before
anything reads it.

Owns `HeadLimits` (the deadline for a request's start line and headers, the most bytes they may
take, the most header fields) and `GuardedHttpProtocol`, uvicorn's httptools protocol enforcing them
while the bytes arrive, before authentication, routing or the body:
- a head over `max_head_bytes` or with more than `max_headers` fields is answered 431 and the
  connection closed; the parser is fed at most the cap plus one socket read of an unfinished head
  (httptools itself has no limit: it would buffer a header line of any length);
- a head that does not arrive within `header_timeout_s` of the connection opening (the first
  request) or of its first byte (the next ones; an idle keep-alive connection is uvicorn's
  keep-alive timeout's) is dropped.
Each server gives the 431 body its own error shape (`Refusal`); `guarded_protocol` is what a server
passes as uvicorn's `http`. It does not own bodies, tokens or routes (each server's adapter does).
"""

from __future__ import annotations

import asyncio
import json
from asyncio import TimerHandle
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from rl360_ext.errors import Rl360Error

Refusal = Callable[[str, str], bytes]
"""(field, message) -> the JSON body a server answers a refused head with."""
HEAD_OVERHEAD = 4  # ": " and CRLF around each header field, counted with its name and value
START_LINE_OVERHEAD = 16  # the method, spaces, "HTTP/1.1" and CRLF around the URL (at least)


@dataclass(frozen=True)
class HeadLimits:
    """How much of a request's head a server reads, and how long it waits for it."""

    header_timeout_s: float = 10.0
    """Deadline for a request's start line and headers (past it: the connection is closed)."""
    max_head_bytes: int = 64 * 1024
    """Largest start line plus header fields, in bytes (over it: 431 and close)."""
    max_headers: int = 100
    """Most header fields in one request (over it: 431 and close)."""


def default_refusal(field: str, message: str) -> bytes:
    """An SGLang/OpenAI-style error body (the tiny engine's shape)."""
    status = HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE
    error = {"message": message, "type": "request_header_fields_too_large", "param": field}
    return json.dumps({"error": {**error, "code": int(status)}}).encode()


class _HeadRefused(Rl360Error):
    """Raised from a parser callback to stop parsing a head over its limits."""


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of `HeadLimits` on every request's head."""

    limits: HeadLimits = HeadLimits()
    refusal: Refusal = staticmethod(default_refusal)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: TimerHandle | None = None
        self._in_head = True  # between a message's end (or the connection's start) and its headers
        self._head_fed = 0  # bytes fed to the parser while in the head
        self._head_size = 0  # start line and fields as the parser reported them
        self._fields = 0
        self._refused: tuple[str, str] | None = None

    @classmethod
    def configured(cls, limits: HeadLimits, refusal: Refusal = default_refusal) -> type[GuardedHttpProtocol]:
        return type(cls.__name__, (cls,), {"limits": limits, "refusal": staticmethod(refusal)})

    # ---- the head's deadline ----------------------------------------------------------------

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.limits.header_timeout_s, self._headers_too_slow)

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

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    # ---- the head's size ---------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._refused is not None:
            return  # refused: the connection is closing, nothing more is parsed
        if self._in_head:
            if self._head_fed > self.limits.max_head_bytes:
                self._refuse("headers", "the request's start line and headers are still incomplete")
                return
            self._head_fed += len(data)
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        except httptools.HttpParserError:
            if self._refused is not None:
                self._refuse(*self._refused)
                return
            self.logger.warning("Invalid HTTP request received.")
            self.send_400_response("Invalid HTTP request received.")
            return
        if self._in_head and self._head_fed > self.limits.max_head_bytes:
            self._refuse("headers", "the request's start line and headers are still incomplete")

    def _over(self, field: str, message: str) -> None:
        self._refused = (field, message)
        raise _HeadRefused(message)

    def _refuse(self, field: str, message: str) -> None:
        """Answer 431 and close: whatever the client still sends is not read. Behind a pipelined
        request still being answered the connection is closed unanswered (a 431 now would be read
        as that request's answer)."""
        self._refused = (field, message)
        self._disarm()
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self.transport.close()
            return
        limits = self.limits
        body = self.refusal(
            field,
            f"{message}: a request's start line and headers may take at most {limits.max_head_bytes} bytes "
            f"in at most {limits.max_headers} fields",
        )
        status = HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE
        head = (
            f"HTTP/1.1 {int(status)} {status.phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self.transport.write(head.encode("ascii") + body)
        self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_size = START_LINE_OVERHEAD
        self._fields = 0
        if self._header_timer is None:
            self._arm()

    def on_url(self, url: bytes) -> None:
        self._head_size += len(url)
        if self._head_size > self.limits.max_head_bytes:
            self._over("url", "the request line is too long")
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields += 1
        self._head_size += len(name) + len(value) + HEAD_OVERHEAD
        if self._fields > self.limits.max_headers:
            self._over("headers", f"more than {self.limits.max_headers} header fields")
        if self._head_size > self.limits.max_head_bytes:
            self._over("headers", "the header fields are too large")
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()
        self._in_head = False
        self._head_fed = 0
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_head = True
        super().on_message_complete()
