"""The session server's error tree: each refusal or failure is one class holding its HTTP status.

Hierarchy (status, default `code` in the OpenAI-style error body)::

    SessionServerError                 500 internal_error
    ├── RequestError                   400 invalid_request      the agent's request is malformed
    ├── UnauthorizedError              401 unauthorized         missing or wrong bearer token
    ├── SessionNotFoundError           404 unknown_session      no such session (typo, deleted)
    ├── HistoryMismatchError           409 history_mismatch     --history-mismatch reject
    ├── SessionGoneError               410 session_expired      dropped by the idle TTL
    │   └── SessionLostError           410 session_lost         made by an earlier server process
    ├── PayloadTooLargeError           413 request_too_large    body over --max-request-bytes
    ├── HeadTooLargeError              431 request_header_too_large  request line or headers over
    │                                                the protocol's caps (answered before routing)
    ├── TooManySessionsError           429 too_many_sessions    --max-sessions reached
    ├── EngineHTTPError                the engine's  engine_busy (429) / engine_rejected (4xx) /
    │                                  status        engine_failed (5xx): the engine's HTTP error,
    │                                                passed through with its body (+Retry-After: 1
    │                                                on 429 and 503, so clients retry)
    ├── EngineFaultError               502 engine_failed        transport failure
    │   └── EngineProtocolError        502 engine_protocol      the engine's answer breaks the protocol
    ├── EngineTimeoutError             504 engine_timeout       no answer within --engine-timeout
    ├── MergeError                     500 merge_failed         the turns do not merge (a bug;
    │                                                `samples/merge.py`)
    └── WireFormatError                500 wire_format          the sample does not encode
                                                     (`samples/wire.py`; a reader raises it too)

The tree sits under `rl360_ext.errors.Rl360Error` and mirrors Miles'
`miles/rollout/session/errors.py` (a status per class); the codes are rl360's. Owns the classes
and the error body; `app.py` turns them into responses, `core.py` and `chat_api.py` raise them.
Infra faults (`EngineFaultError`, `SessionLostError`) are what the generate hook counts as
infrastructure, never as a reward.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rl360_ext.errors import Rl360Error


class SessionServerError(Rl360Error):
    """A request the session server refuses or cannot serve; `status` is the HTTP status."""

    status: ClassVar[int] = 500
    default_code: ClassVar[str] = "internal_error"
    retry_after_s: ClassVar[int | None] = None  # sent as Retry-After when set

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code or self.default_code

    @property
    def kind(self) -> str:
        return "invalid_request_error" if self.status < 500 else "upstream_error"

    def to_json(self) -> dict[str, Any]:
        """The OpenAI-style error body."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}


class RequestError(SessionServerError):
    """The agent's request is malformed; the message names the field."""

    status = 400
    default_code = "invalid_request"


class UnauthorizedError(SessionServerError):
    """The server has a bearer token and the request did not carry it."""

    status = 401
    default_code = "unauthorized"


class SessionNotFoundError(SessionServerError):
    status = 404
    default_code = "unknown_session"


class HistoryMismatchError(SessionServerError):
    status = 409
    default_code = "history_mismatch"


class SessionGoneError(SessionServerError):
    """The session existed on this server process and was dropped (idle TTL)."""

    status = 410
    default_code = "session_expired"


class SessionLostError(SessionGoneError):
    """The session was made by another process of this server (it restarted): its turns are gone."""

    default_code = "session_lost"


class PayloadTooLargeError(SessionServerError):
    status = 413
    default_code = "request_too_large"


class HeadTooLargeError(SessionServerError):
    """The request line or headers are over the protocol guard's caps (`rl360_ext.util.http_guard`)."""

    status = 431
    default_code = "request_header_too_large"


class TooManySessionsError(SessionServerError):
    status = 429
    default_code = "too_many_sessions"
    retry_after_s = 1


class EngineHTTPError(SessionServerError):
    """The engine answered this turn with an HTTP error (nothing recorded): the agent gets the engine's
    status and body as sent, as Miles' session server passes a backend's non-200 reply through. A
    429 or 5xx stays retryable for the agent's client; a 4xx says the same request fails again."""

    default_code = "engine_http_error"

    def __init__(self, status: int, body: str, message: str) -> None:
        code = "engine_busy" if status == 429 else "engine_rejected" if status < 500 else "engine_failed"
        super().__init__(message, code=code)
        self.status = status  # type: ignore[misc]  # this error's status is the engine's
        self.body = body

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "1"} if self.status in (429, 503) else {}


class EngineFaultError(SessionServerError):
    """The engine side failed this turn (nothing recorded): an infra fault, never the policy's."""

    status = 502
    default_code = "engine_failed"


class EngineProtocolError(EngineFaultError):
    """The engine answered, but its answer breaks the protocol (nothing recorded)."""

    default_code = "engine_protocol"


class EngineTimeoutError(EngineFaultError):
    status = 504
    default_code = "engine_timeout"
