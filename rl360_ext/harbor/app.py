"""The Harbor /run server's HTTP adapter (FastAPI). Thin: schemas, auth, error mapping.

Owns the wire schema of `POST /run`, `POST /flush`, `GET /health`, `GET /metrics`; the optional
bearer token, checked on every route (with a token the unauthenticated docs routes are off);
and turning `RunRejected` into a 4xx whose body names the request field, in FastAPI's own
validation-error shape. Everything else is `rl360_ext.harbor.runner.TrialRunner`.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field

from rl360_ext.harbor.runner import RunRejected, RunRequest, TrialRunner


class RunBody(BaseModel):
    """`POST /run` body."""

    model_config = ConfigDict(extra="forbid")

    task: str = Field(min_length=1, description="Task directory, relative to the server's --tasks-root.")
    deadline_s: float = Field(gt=0, description="The client's remaining deadline for this attempt, seconds.")
    base_url: str | None = Field(default=None, description="The session's OpenAI base URL (…/v1).")
    model: str | None = Field(default=None, min_length=1, description="Model name to send to base_url.")
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    session_id: str | None = None
    session_server_instance_id: str | None = Field(default=None, description="Key for POST /flush.")
    max_seq_len: int | None = Field(default=None, gt=0)
    agent: str | None = Field(default=None, description="Harbor agent name or module.path:Class.")
    agent_kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra agent kwargs (win).")


class FlushBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_server_instance_id: str = Field(min_length=1)


def _field_error(status: int, field: str, message: str) -> JSONResponse:
    return JSONResponse(
        status_code=status,
        content={"detail": [{"loc": ["body", field], "msg": message, "type": "value_error"}]},
    )


def create_app(runner: TrialRunner, token: str | None = None) -> FastAPI:
    async def require_token(request: Request) -> None:
        if token is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip(), token):
            raise HTTPException(status_code=401, detail="missing or wrong bearer token")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await runner.flush_all()

    docs = {} if token is None else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(
        title="rl360 Harbor /run server", dependencies=[Depends(require_token)], lifespan=lifespan, **docs
    )

    @app.post("/run")
    async def run(body: RunBody) -> Any:
        try:
            return await runner.run(RunRequest(**body.model_dump()))
        except RunRejected as exc:
            return _field_error(exc.status, exc.field, str(exc))

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
