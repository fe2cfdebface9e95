"""The tiny engine's error tree: every error the engine server answers, with its HTTP status.

Owns the exception classes the engine and its request parsing raise and the status and error
`type` each maps to (the body is SGLang/OpenAI-shaped: `{"error": {message, type, param, code}}`).
Each server (`server.py`, `instant.py`) has one handler for `EngineError` that answers `to_json()`
with the class's `status`; no route picks a status code itself. Anything that is not an
`EngineError` is a bug and answers 500. The tree sits under `rl360_ext.errors.Rl360Error`.

    EngineError                500  InternalServerError
    +-- RequestError           400  BadRequestError      (`field` names what was wrong)
    |   +-- FaultConfigError   400                       (a bad /rl360/faults setting)
    +-- Unauthorized           401  AuthenticationError  (`--api-key` set, bearer token missing/wrong)
    +-- ServiceUnavailable     503  ServiceUnavailableError (an injected fault)
    +-- CacheBusy              400  (SGLang's /flush_cache body: {"success": false, "message"})
"""

from __future__ import annotations

from typing import Any

from rl360_ext.errors import Rl360Error


class EngineError(Rl360Error):
    """Base of every error the engine server answers; `status` is the HTTP status."""

    status = 500
    kind = "InternalServerError"
    field: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The SGLang/OpenAI-shaped error body the servers answer with `status`."""
        return {"error": {"message": str(self), "type": self.kind, "param": self.field, "code": self.status}}


class RequestError(EngineError, ValueError):
    """A bad request; `field` names what was wrong (HTTP 400)."""

    status = 400
    kind = "BadRequestError"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class FaultConfigError(RequestError):
    """A bad fault-injection setting; `field` names it (HTTP 400 on /rl360/faults)."""


class Unauthorized(EngineError):
    """The engine was started with `--api-key` and the request's bearer token is missing or wrong."""

    status = 401
    kind = "AuthenticationError"


class ServiceUnavailable(EngineError, RuntimeError):
    """The engine refuses this request (an injected fault); HTTP 503."""

    status = 503
    kind = "ServiceUnavailableError"


class CacheBusy(EngineError):
    """/flush_cache while requests run or wait: HTTP 400 with SGLang's `{"success": false, ...}` body."""

    status = 400
    kind = "BadRequestError"

    def to_json(self) -> dict[str, Any]:
        return {"success": False, "message": str(self)}
