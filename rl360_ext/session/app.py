"""The session server's HTTP adapter (FastAPI): routes, JSON decoding, status codes. Nothing else.

Owns the URL layout (`POST /sessions`, `/sessions/{id}/v1/chat/completions`,
`/sessions/{id}/v1/models`, `/sessions/{id}/merged`, `POST /sessions/{id}/samples` (Miles' samples
wire, encoded by `miles_wire.py`), `GET /sessions/{id}` (Miles' records view, `records.py`),
`DELETE /sessions/{id}` (204, as Miles), `/health` (with Miles' `session_server_instance_id`),
`/metrics`), mapping each `errors.SessionServerError` to its status (an OpenAI-style error object
on the agent's `/v1/` routes, Miles' `{"error": "<text>"}` on the session routes Miles' tooling
calls; an engine's HTTP error passes through with its status and body, as Miles passes it), the
request-size limit (413 before parsing), the protocol guard's 431 body for an oversized head
(`guarded_protocol`, which `service.py` and the pool serve with), JSON answers whose encoding cannot
fail on a string, the optional bearer token (constant-time comparison;
/health and /metrics stay open), each body's schema in `/openapi.json` (`schemas.py`), the
single-chunk SSE stream, and the idle-TTL sweeper task. Logic lives in `core.py`.

The agent's hot route, `POST /sessions/{id}/v1/chat/completions`, is served by `ChatFastPath`, a
plain ASGI layer in front of FastAPI's router: the same handler, body limit, bearer token and error
mapping, without the router's scan, the dependency solver and the exception middleware on every
turn. The route stays registered in FastAPI too (its schema, and every other method or path).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from rl360_ext.session.core import SessionCore
from rl360_ext.session.errors import (
    EngineHTTPError,
    HeadTooLargeError,
    PayloadTooLargeError,
    RequestError,
    SessionServerError,
    UnauthorizedError,
)
from rl360_ext.session.metrics import CONTENT_TYPE
from rl360_ext.session.options import default_of
from rl360_ext.session.samples import miles_wire
from rl360_ext.session.schemas import (
    ChatCompletionRequest,
    CreateSessionRequest,
    SamplesRequest,
    add_request_schemas,
    request_body,
)
from rl360_ext.util.http_guard import GuardedHttpProtocol, HeadLimits
from rl360_ext.util.loop_lag import watch_loop_lag
from rl360_ext.util.text import json_bytes

WIRE_MEDIA_TYPE = "application/vnd.rl360.merged-sample"
OPEN_PATHS = frozenset({"/health", "/metrics"})  # served without the bearer token (probes, Prometheus)
OPENAI_ROUTE = "/v1/"  # routes under it answer OpenAI error objects; the others Miles' {"error": "<text>"}
CHAT_TAIL = ["v1", "chat", "completions"]


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A JSON answer; its encoding cannot fail on a string (`rl360_ext.util.text.json_bytes`)."""
    content = json_bytes(body, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(content, status, headers=headers, media_type="application/json")


def _head_refusal(field: str, message: str) -> bytes:
    return json_bytes(HeadTooLargeError(message, param=field).to_json())


def guarded_protocol(limits: HeadLimits = HeadLimits()) -> type[GuardedHttpProtocol]:
    """uvicorn's `http` for a session server (process or pool actor): the shared head guard, its
    431 an OpenAI error object."""
    return GuardedHttpProtocol.configured(limits, _head_refusal)


def error_response(error: SessionServerError) -> Response:
    return json_response(error.to_json(), error.status, error.headers())


def chat_session_id(path: str) -> str | None:
    """The session id of a `/sessions/{id}/v1/chat/completions` path, else None (as the route matches)."""
    parts = path.split("/")
    if len(parts) == 6 and parts[:2] == ["", "sessions"] and parts[2] and parts[3:] == CHAT_TAIL:
        return parts[2]
    return None


class ChatFastPath:
    """ASGI layer: POSTs to the chat route go straight to `chat`; everything else to FastAPI."""

    def __init__(
        self,
        app: ASGIApp,
        chat: Callable[[str, Request], Awaitable[Response]],
        refused: Callable[[Request, SessionServerError], Awaitable[Response]],
    ) -> None:
        self.app = app
        self.chat = chat
        self.refused = refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        session_id = chat_session_id(scope["path"]) if scope["type"] == "http" else None
        if session_id is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            response = await self.chat(session_id, request)
        except SessionServerError as exc:
            response = await self.refused(request, exc)
        await response(scope, receive, send)


class BearerAuth:
    """ASGI middleware: every path but OPEN_PATHS needs `Authorization: Bearer <token>`."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = token.encode()

    def _authorized(self, scope: Scope) -> bool:
        given = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                given = value
        scheme, _, token = given.partition(b" ")
        # compare_digest on the token whatever the scheme, so timing says nothing about either
        same = hmac.compare_digest(token.strip(), self.expected)
        return same and scheme.lower() == b"bearer"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        error = UnauthorizedError(
            "Authorization: a valid 'Bearer <token>' header is required", param="authorization"
        )
        response = error_response(error)
        response.headers["WWW-Authenticate"] = "Bearer"
        await response(scope, receive, send)


async def _read_limited(request: Request, limit: int) -> bytes:
    """The body, or PayloadTooLargeError as soon as it (or its Content-Length) passes `limit` bytes."""
    declared = request.headers.get("content-length", "")
    too_large = f"is over this server's limit of {limit} bytes (--max-request-bytes)"
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(f"body: {int(declared)} bytes {too_large}", param="body")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"body: more than {limit} bytes {too_large}", param="body")
        chunks.append(chunk)
    return b"".join(chunks)


async def _json_body(request: Request, required: bool) -> Any:
    raw = await _read_limited(request, request.app.state.max_request_bytes)
    if not raw.strip():
        if required:
            raise RequestError("body: a JSON body is required", param="body")
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"body: malformed JSON: {exc}", param="body") from None


def create_app(
    core: SessionCore,
    public_url: str | None = None,
    max_request_bytes: int = default_of("max_request_bytes"),
    api_key: str | None = None,
) -> FastAPI:
    """The FastAPI app serving `core`; `public_url` is the base agents reach it at.

    Bodies over `max_request_bytes` are answered 413; with `api_key` every route but /health and
    /metrics needs `Authorization: Bearer <api_key>` (401 otherwise).
    """

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        background = [
            asyncio.create_task(_sweep(core)),
            asyncio.create_task(watch_loop_lag(core.metrics.loop_lag.observe)),
        ]
        try:
            yield
        finally:
            for task in background:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            close = getattr(core.backend, "aclose", None)
            if close is not None:
                await close()

    app = FastAPI(title="rl360 session server", lifespan=lifespan)
    app.state.max_request_bytes = max_request_bytes

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            app.openapi_schema = add_request_schemas(schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    async def refused(request: Request, exc: SessionServerError) -> Response:
        if isinstance(exc, EngineHTTPError):
            return _passed_through(exc)
        if OPENAI_ROUTE in request.url.path:
            return error_response(exc)
        body = {"error": exc.message, "code": exc.code, "param": exc.param}
        return json_response(body, exc.status, exc.headers())

    app.add_exception_handler(SessionServerError, refused)  # type: ignore[arg-type]

    async def chat(session_id: str, request: Request) -> Response:
        body = await _json_body(request, required=True)
        reply = await core.chat(session_id, body)
        if not (isinstance(body, dict) and body.get("stream")):
            return json_response(reply.completion())
        chunk = json_bytes(reply.chunk())

        async def events() -> AsyncIterator[bytes]:
            yield b"data: " + chunk + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    app.add_middleware(ChatFastPath, chat=chat, refused=refused)
    if api_key:  # added last, so it wraps the fast path too
        app.add_middleware(BearerAuth, token=api_key)

    @app.get("/health")
    async def health() -> Response:
        return json_response(
            {
                "status": "ok",
                "session_server_instance_id": core.config.instance_id,
                "sessions": len(core.sessions),
            }
        )

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(core.metrics.render(), media_type=CONTENT_TYPE)

    @app.post("/sessions", openapi_extra=request_body(CreateSessionRequest, required=False))
    async def create_session(request: Request) -> Response:
        body = await _json_body(request, required=False)
        if not isinstance(body, dict):
            raise RequestError("body: must be a JSON object", param="body")
        unknown = sorted(set(body) - {"metadata", "routing_key"})
        if unknown:
            raise RequestError(f"{unknown[0]}: unknown field", param=unknown[0])
        session = core.create(body.get("metadata"), body.get("routing_key"))
        base = (public_url or str(request.base_url)).rstrip("/")
        return json_response(
            {
                "session_id": session.id,
                "routing_key": session.routing_key,
                "base_url": f"{base}/sessions/{session.id}/v1",
            }
        )

    @app.post("/sessions/{session_id}/v1/chat/completions", openapi_extra=request_body(ChatCompletionRequest))
    async def chat_completions(session_id: str, request: Request) -> Response:
        return await chat(session_id, request)

    @app.get("/sessions/{session_id}/v1/models")
    async def models(session_id: str) -> Response:
        core.get(session_id)
        card = {"id": core.config.model_name, "object": "model", "created": 0, "owned_by": "rl360"}
        return json_response({"object": "list", "data": [card]})

    @app.get("/sessions/{session_id}/merged")
    async def merged(session_id: str, format: str = "binary") -> Response:
        if format not in ("binary", "json"):
            raise RequestError(f"format: must be binary or json, got {format!r}", param="format")
        if format == "binary":
            return Response(await core.merged_wire(session_id), media_type=WIRE_MEDIA_TYPE)
        sample = await core.merged(session_id)
        return Response(
            json_bytes(sample.to_json(), option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json"
        )

    @app.post("/sessions/{session_id}/samples", openapi_extra=request_body(SamplesRequest, required=False))
    async def samples(session_id: str, request: Request) -> Response:
        max_seq_len, metadata = miles_wire.parse_samples_request(await _json_body(request, required=False))
        if core.config.samples_wire == "v2":
            branches, session_metadata = await core.merged_branches(session_id)
            payload = miles_wire.encode_v2(branches, session_metadata, _decoder(core), max_seq_len, metadata)
            return Response(payload, media_type=miles_wire.MEDIA_TYPE)
        sample = await core.merged(session_id)
        payload = miles_wire.encode(sample, _decoder(core), max_seq_len, metadata)
        return Response(payload, media_type=miles_wire.MEDIA_TYPE)

    @app.get("/sessions/{session_id}")
    async def view(session_id: str) -> Response:
        return json_response(core.view(session_id))

    @app.delete("/sessions/{session_id}")
    async def delete(session_id: str) -> Response:
        core.delete(session_id)
        return Response(status_code=204)

    return app


def _passed_through(exc: EngineHTTPError) -> Response:
    """The engine's error reply as it sent it (JSON re-emitted compactly, other text verbatim)."""
    try:
        return json_response(orjson.loads(exc.body), exc.status, exc.headers())
    except orjson.JSONDecodeError:
        return Response(exc.body, exc.status, headers=exc.headers(), media_type="text/plain")


def _decoder(core: SessionCore) -> miles_wire.Decode:
    """The tokenizer's decode with special tokens kept, as Miles' session server decodes `response`."""
    tokenizer = core.tito.tokenizer
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)


async def _sweep(core: SessionCore) -> None:
    interval = min(max(core.config.idle_ttl_s / 4, 0.05), 30.0)
    while True:
        await asyncio.sleep(interval)
        core.evict_idle()
