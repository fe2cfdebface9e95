"""The Harbor /run server's HTTP adapter (FastAPI). Thin: schemas, auth, error mapping, shutdown.

Owns the wire schema of `POST /run`, `POST /flush`, `GET /health`, `GET /metrics`; putting the
connection guard (`rl360_ext.harbor.guard`: the optional bearer token on every path, checked
before a body is read, the body cap, the header and body timeouts) in front of every route (with
a token the docs routes are off); turning a `rl360_ext.harbor.errors.HarborRequestError`
into its status with a body that names the request field, in FastAPI's own validation-error
shape (schema errors too, with inputs such as NaN written so the body is valid JSON); and
`serve`, which on SIGTERM first cancels every attempt in flight (each client gets its
`failure_cause: cancelled` answer) and only then lets uvicorn close connections. Everything
else is `rl360_ext.harbor.runner.TrialRunner`.
"""

from __future__ import annotations

import contextlib
import math
import socket
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field

from rl360_ext.harbor.catalog import MAX_TASK_NAME
from rl360_ext.harbor.errors import FieldInvalid, HarborRequestError, detail
from rl360_ext.harbor.guard import GuardedHttpProtocol, RequestGuard
from rl360_ext.harbor.runner import RunRequest, TrialRunner

_GRACEFUL_S = 5


class RunBody(BaseModel):
    """`POST /run` body."""

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


class FlushBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_server_instance_id: str = Field(min_length=1)


def _field_error(error: HarborRequestError) -> JSONResponse:
    return JSONResponse(status_code=error.status, content=detail(error))


def _json_safe(value: Any) -> Any:
    """A validation error's input as JSON can carry it (NaN, Infinity and bytes become text)."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return repr(value)


def _schema_error(exc: RequestValidationError) -> JSONResponse:
    detail = [
        {
            "loc": list(error.get("loc", ())),
            "msg": str(error.get("msg", "")),
            "type": str(error.get("type", "value_error")),
            "input": _json_safe(error.get("input")),
        }
        for error in exc.errors()
    ]
    return JSONResponse(status_code=FieldInvalid.status, content={"detail": detail})


def create_app(runner: TrialRunner, token: str | None = None) -> FastAPI:
    """The app, behind the guard with the limits of the runner's settings."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await runner.shutdown()

    docs = {} if token is None else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(title="rl360 Harbor /run server", lifespan=lifespan, **docs)
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
    header deadline of the runner's settings, `options` for the rest."""
    limits = runner.settings.http_limits
    return uvicorn.Config(
        create_app(runner, token),
        http=GuardedHttpProtocol.with_limits(limits),
        ws="none",  # no route speaks WebSocket: an upgrade request is plain HTTP to the guard
        timeout_graceful_shutdown=_GRACEFUL_S,
        **options,
    )


def serve(runner: TrialRunner, token: str | None, host: str, port: int, log_level: str) -> None:
    """Serve the app until SIGTERM/SIGINT; in-flight attempts then answer `cancelled`."""
    config = uvicorn_config(runner, token, host=host, port=port, log_level=log_level, loop=HARBOR_EVENT_LOOP)
    _CancellingServer(config, runner).run()
