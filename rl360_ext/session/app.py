"""The session server's HTTP adapter (FastAPI): routes, JSON decoding, status codes. Nothing else.

Owns the URL layout (`POST /sessions`, `/sessions/{id}/v1/chat/completions`,
`/sessions/{id}/v1/models`, `/sessions/{id}/merged`, `POST /sessions/{id}/samples` (Miles' samples
wire, encoded by `miles_wire.py`), `GET /sessions/{id}` (Miles' records view, `records.py`),
`DELETE /sessions/{id}` (204, as Miles), `/health` (with Miles' `session_server_instance_id`),
`/metrics`), mapping `RequestError` to its status (an OpenAI-style error object on the agent's
`/v1/` routes, Miles' `{"error": "<text>"}` on the session routes Miles' tooling calls; an engine's
HTTP error passes through with its status and body, as Miles passes it), the single-chunk SSE
stream, and the idle-TTL sweeper task. Logic lives in `core.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from rl360_ext.session import miles_wire
from rl360_ext.session.chat_api import RequestError
from rl360_ext.session.core import BackendError, SessionCore
from rl360_ext.session.metrics import CONTENT_TYPE

WIRE_MEDIA_TYPE = "application/vnd.rl360.merged-sample"
OPENAI_ROUTE = "/v1/"  # routes under it answer OpenAI error objects; the others Miles' {"error": "<text>"}


def json_response(body: Any, status: int = 200) -> Response:
    content = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(content, status, media_type="application/json")


async def _json_body(request: Request, required: bool) -> Any:
    raw = await request.body()
    if not raw.strip():
        if required:
            raise RequestError(400, "body: a JSON body is required", param="body")
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RequestError(400, f"body: malformed JSON: {exc}", param="body") from None


def create_app(core: SessionCore, public_url: str | None = None) -> FastAPI:
    """The FastAPI app serving `core`; `public_url` is the base agents reach it at."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        sweeper = asyncio.create_task(_sweep(core))
        try:
            yield
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            close = getattr(core.backend, "aclose", None)
            if close is not None:
                await close()

    app = FastAPI(title="rl360 session server", lifespan=lifespan)

    @app.exception_handler(RequestError)
    async def _refused(request: Request, exc: RequestError) -> Response:
        if isinstance(exc, BackendError):
            return _passed_through(exc)
        if OPENAI_ROUTE in request.url.path:
            return json_response(exc.to_json(), exc.status)
        return json_response({"error": exc.message, "code": exc.code, "param": exc.param}, exc.status)

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

    @app.post("/sessions")
    async def create_session(request: Request) -> Response:
        body = await _json_body(request, required=False)
        if not isinstance(body, dict):
            raise RequestError(400, "body: must be a JSON object", param="body")
        unknown = sorted(set(body) - {"metadata", "routing_key"})
        if unknown:
            raise RequestError(400, f"{unknown[0]}: unknown field", param=unknown[0])
        session = core.create(body.get("metadata"), body.get("routing_key"))
        base = (public_url or str(request.base_url)).rstrip("/")
        return json_response(
            {
                "session_id": session.id,
                "routing_key": session.routing_key,
                "base_url": f"{base}/sessions/{session.id}/v1",
            }
        )

    @app.post("/sessions/{session_id}/v1/chat/completions")
    async def chat_completions(session_id: str, request: Request) -> Response:
        body = await _json_body(request, required=True)
        reply = await core.chat(session_id, body)
        if not (isinstance(body, dict) and body.get("stream")):
            return json_response(reply.completion())
        chunk = orjson.dumps(reply.chunk())

        async def events() -> AsyncIterator[bytes]:
            yield b"data: " + chunk + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/sessions/{session_id}/v1/models")
    async def models(session_id: str) -> Response:
        core.get(session_id)
        card = {"id": core.config.model_name, "object": "model", "created": 0, "owned_by": "rl360"}
        return json_response({"object": "list", "data": [card]})

    @app.get("/sessions/{session_id}/merged")
    async def merged(session_id: str, format: str = "binary") -> Response:
        if format not in ("binary", "json"):
            raise RequestError(400, f"format: must be binary or json, got {format!r}", param="format")
        if format == "binary":
            return Response(await core.merged_wire(session_id), media_type=WIRE_MEDIA_TYPE)
        sample = await core.merged(session_id)
        return Response(
            orjson.dumps(sample.to_json(), option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json"
        )

    @app.post("/sessions/{session_id}/samples")
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


def _passed_through(exc: BackendError) -> Response:
    """The engine's error reply as it sent it (JSON re-emitted compactly, other text verbatim)."""
    try:
        return json_response(orjson.loads(exc.body), exc.status)
    except orjson.JSONDecodeError:
        return Response(exc.body, exc.status, media_type="text/plain")


def _decoder(core: SessionCore) -> miles_wire.Decode:
    """The tokenizer's decode with special tokens kept, as Miles' session server decodes `response`."""
    tokenizer = core.tito.tokenizer
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)


async def _sweep(core: SessionCore) -> None:
    interval = min(max(core.config.idle_ttl_s / 4, 0.05), 30.0)
    while True:
        await asyncio.sleep(interval)
        core.evict_idle()
