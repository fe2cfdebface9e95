"""The Harbor /run server's HTTP adapter (FastAPI). Thin: schemas, auth, error mapping, shutdown.

Owns the wire schema of `POST /run`, `POST /flush`, `GET /health`, `GET /metrics`; putting the
connection guard (`rl360_ext.harbor.guard`: the optional bearer token on every path, checked
before a body is read, the body cap, the header and body timeouts) in front of every route (with
a token the docs routes are off); turning a `rl360_ext.harbor.errors.HarborRequestError`
into its status with a body that names the request field, in FastAPI's own validation-error
shape (schema errors too, with inputs such as NaN or a lone surrogate written so the body is valid
JSON; every answer is a `SafeJSONResponse`, whose encoding cannot fail on a string); refusing, with
a 422 naming the field, any body string UTF-8 cannot encode (`rl360_ext.util.text.TextModel`) and
control characters in names and the URL; and
`serve`, which on SIGTERM first cancels every attempt in flight (each client gets its
`failure_cause: cancelled` answer) and only then lets uvicorn close connections. Everything
else is `rl360_ext.harbor.runner.TrialRunner`.
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ConfigDict, Field, ValidationInfo, field_validator

from rl360_ext.harbor.catalog import MAX_TASK_NAME
from rl360_ext.harbor.errors import FieldInvalid, HarborRequestError, detail
from rl360_ext.harbor.guard import RequestGuard, guarded_protocol
from rl360_ext.harbor.runner import RunRequest, TrialRunner
from rl360_ext.util.text import TextModel, encodable, has_control, shown

_GRACEFUL_S = 5


class SafeJSONResponse(JSONResponse):
    """FastAPI's JSON answer, except that a string UTF-8 cannot encode (a lone surrogate) is
    written as its JSON escape instead of failing the answer with a 500."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")


def _no_control(value: str | None, name: str) -> str | None:
    if value is not None and has_control(value):
        raise ValueError(f"{name}: holds a control character (NUL, CR, LF, ...): {shown(value)!r}")
    return value


class RunBody(TextModel):
    """`POST /run` body. Every string, at any depth, must be UTF-8 text (a lone surrogate is a
    422 naming the field); names and the URL hold no control character."""

    model_config = ConfigDict(extra="forbid")

    task: str = Field(
        min_length=1,
        max_length=MAX_TASK_NAME,
        description="Task directory, relative to the server's --tasks-root.",
    )
    deadline_s: float = Field(
        gt=0,
        allow_inf_nan=False,
        description="The client's remaining deadline for this attempt, seconds (at most --max-deadline-s).",
    )
    base_url: str | None = Field(default=None, description="The session's OpenAI base URL (…/v1).")
    model: str | None = Field(default=None, min_length=1, description="Model name to send to base_url.")
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    session_id: str | None = None
    session_server_instance_id: str | None = Field(default=None, description="Key for POST /flush.")
    max_seq_len: int | None = Field(default=None, gt=0)
    agent: str | None = Field(default=None, description="One of the agents the server was started with.")
    agent_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Extra agent kwargs (win over rl360's; Harbor's own are refused)."
    )

    @field_validator("base_url", "model", "agent", "session_id", "session_server_instance_id")
    @classmethod
    def _names(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _no_control(value, str(info.field_name))


class FlushBody(TextModel):
    model_config = ConfigDict(extra="forbid")

    session_server_instance_id: str = Field(min_length=1)


def _field_error(error: HarborRequestError) -> JSONResponse:
    return SafeJSONResponse(status_code=error.status, content=detail(error))


def _json_safe(value: Any) -> Any:
    """A validation error's input as JSON can carry it (NaN, Infinity and bytes become text; a
    string UTF-8 cannot encode is written escaped)."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {_text(str(k)): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, str):
        return _text(value)
    if value is None or isinstance(value, int | float | bool):
        return value
    return _text(repr(value))


def _text(value: str) -> str:
    return value if encodable(value) else shown(value, len(value))


def _schema_error(exc: RequestValidationError) -> JSONResponse:
    detail = [
        {
            "loc": _json_safe(list(error.get("loc", ()))),
            "msg": _text(str(error.get("msg", ""))),
            "type": str(error.get("type", "value_error")),
            "input": _json_safe(error.get("input")),
        }
        for error in exc.errors()
    ]
    return SafeJSONResponse(status_code=FieldInvalid.status, content={"detail": detail})


def create_app(runner: TrialRunner, token: str | None = None) -> FastAPI:
    """The app, behind the guard with the limits of the runner's settings."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await runner.shutdown()

    docs = {} if token is None else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(
        title="rl360 Harbor /run server", lifespan=lifespan, default_response_class=SafeJSONResponse, **docs
    )
    app.add_middleware(RequestGuard, token=token, limits=runner.settings.http_limits)  # type: ignore[arg-type]

    @app.exception_handler(HarborRequestError)
    async def refused(request: Request, exc: HarborRequestError) -> JSONResponse:
        return _field_error(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _schema_error(exc)

    @app.post("/run")
    async def run(body: RunBody) -> Any:
        return await runner.run(RunRequest(**body.model_dump()))

    @app.post("/flush")
    async def flush(body: FlushBody) -> dict[str, Any]:
        return await runner.flush(body.session_server_instance_id)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return runner.health()

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(runner.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app


class _CancellingServer(uvicorn.Server):
    """uvicorn, but on SIGTERM/SIGINT the runner cancels its attempts before connections close,
    so every in-flight /run answers `failure_cause: cancelled` instead of being cut off."""

    def __init__(self, config: uvicorn.Config, runner: TrialRunner) -> None:
        super().__init__(config)
        self.runner = runner

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()  # no new connections while the attempts are cancelled
        await self.runner.shutdown()
        await super().shutdown(sockets)


# asyncio's own loop, not uvloop (which uvicorn would pick once installed, as the session server's
# dependency): the server's work is sandbox subprocesses and their pipes, and under uvloop the
# demo's rollouts took 65 s instead of 41 s for 4 steps of 32 attempts (same machine, idle).
HARBOR_EVENT_LOOP = "asyncio"


def uvicorn_config(runner: TrialRunner, token: str | None, **options: Any) -> uvicorn.Config:
    """uvicorn's config for the app (the server's and each pool replica's): httptools with the
    head caps and deadline of the runner's settings (`guard.guarded_protocol`), `options` for the rest."""
    return uvicorn.Config(
        create_app(runner, token),
        http=guarded_protocol(runner.settings.http_limits),
        ws="none",  # no route speaks WebSocket: an upgrade request is plain HTTP to the guard
        timeout_graceful_shutdown=_GRACEFUL_S,
        **options,
    )


def serve(runner: TrialRunner, token: str | None, host: str, port: int, log_level: str) -> None:
    """Serve the app until SIGTERM/SIGINT; in-flight attempts then answer `cancelled`."""
    config = uvicorn_config(runner, token, host=host, port=port, log_level=log_level, loop=HARBOR_EVENT_LOOP)
    _CancellingServer(config, runner).run()
