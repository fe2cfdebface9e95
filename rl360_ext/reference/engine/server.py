"""The tiny engine's HTTP adapter: SGLang's native endpoints (FastAPI), nothing else.

Owns the routes (/generate, /health, /model_info, /server_info, /v1/models, /version, weight
update, pause/continue, flush, abort, and the /rl360/faults admin endpoint), each body declared as
a pydantic model (`schemas.py`, so /openapi.json documents it), the optional bearer token
(`--api-key`: every route but /health, compared in constant time, as SGLang does), mapping the
error tree (`errors.py`) to HTTP statuses in one handler (a body that fails its schema is a 400
naming the field; a string UTF-8 cannot encode is one), answers whose encoding cannot fail, the
shared head guard it runs under (`guarded_protocol`), and running blocking engine work (a long
`text`'s tokenization too) in worker threads so /health stays responsive. Logic lives in `engine.py`.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from rl360_ext.reference.engine.engine import ENGINE_VERSION, TinyEngine
from rl360_ext.reference.engine.errors import CacheBusy, EngineError, RequestError, Unauthorized
from rl360_ext.reference.engine.faults import FaultConfig
from rl360_ext.reference.engine.protocol import parse_generate_request
from rl360_ext.reference.engine.schemas import (
    AbortRequestBody,
    ContinueGenerationBody,
    FaultsBody,
    GenerateBody,
    PauseGenerationBody,
    UpdateWeightsFromDiskBody,
    UpdateWeightVersionBody,
    field_path,
)
from rl360_ext.util.http_guard import GuardedHttpProtocol, HeadLimits, default_refusal
from rl360_ext.util.text import json_bytes

MAX_CONCURRENT_REQUESTS = 256
INLINE_TEXT_CHARS = 4096  # a longer `text` is tokenized on a worker thread
DISCONNECT_POLL_S = 0.1
OPEN_PATHS = ("/health", "/health_generate")  # reachable without the bearer token, as in SGLang

logger = logging.getLogger(__name__)

BODY_MODELS: dict[str, type[BaseModel]] = {
    "/generate": GenerateBody,
    "/update_weights_from_disk": UpdateWeightsFromDiskBody,
    "/update_weight_version": UpdateWeightVersionBody,
    "/pause_generation": PauseGenerationBody,
    "/continue_generation": ContinueGenerationBody,
    "/abort_request": AbortRequestBody,
    "/rl360/faults": FaultsBody,
}


def json_response(body: Any, status: int = 200) -> Response:
    """A JSON answer whose encoding cannot fail on a string (`rl360_ext.util.text.json_bytes`)."""
    return Response(json_bytes(body), status_code=status, media_type="application/json")


def guarded_protocol(limits: HeadLimits = HeadLimits()) -> type[GuardedHttpProtocol]:
    """uvicorn's `http` for the engine (and the instant stand-in): the shared head guard."""
    return GuardedHttpProtocol.configured(limits, default_refusal)


def error_response(error: EngineError) -> Response:
    return json_response(error.to_json(), error.status)


def validation_error(err: RequestValidationError, model: type[BaseModel] | None) -> RequestError:
    """The first schema violation as a RequestError naming the field (`schemas.field_path`)."""
    errors = err.errors()
    first = errors[0] if errors else {"loc": ("body",), "msg": "invalid body"}
    loc = tuple(first.get("loc", ()))
    where = ".".join(str(part) for part in loc[1:])
    detail = first.get("msg", "invalid value") + (f" (at {where})" if where else "")
    return RequestError(field_path(model, loc), detail)


def _bearer_ok(request: Request, api_key: str) -> bool:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.encode(), api_key.encode())


def create_app(engine: TinyEngine) -> FastAPI:
    """The FastAPI app serving `engine`."""
    app = FastAPI(title="rl360 tiny engine (SGLang protocol)", version=ENGINE_VERSION)
    limiter = anyio.CapacityLimiter(MAX_CONCURRENT_REQUESTS)
    created = int(time.time())
    api_key = engine.config.api_key

    if api_key is not None:

        @app.middleware("http")
        async def _require_token(
            request: Request, call_next: Callable[[Request], Awaitable[Response]]
        ) -> Response:
            if request.method == "OPTIONS" or request.url.path in OPEN_PATHS or _bearer_ok(request, api_key):
                return await call_next(request)
            return error_response(
                Unauthorized("a valid `Authorization: Bearer <api key>` header is required")
            )

    @app.exception_handler(EngineError)
    async def _engine_error(_: Request, err: EngineError) -> Response:
        return error_response(err)

    @app.exception_handler(RequestValidationError)
    async def _invalid_body(request: Request, err: RequestValidationError) -> Response:
        return error_response(validation_error(err, BODY_MODELS.get(request.url.path)))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException) -> Response:
        if err.status_code == 400:  # FastAPI could not read the body (not UTF-8, say)
            return error_response(RequestError("body", f"{err.detail}: not a UTF-8 JSON body"))
        return await http_exception_handler(request, err)

    @app.exception_handler(Exception)
    async def _bug(request: Request, err: Exception) -> Response:
        logger.exception("tiny engine: %s %s failed", request.method, request.url.path)
        return error_response(EngineError(f"internal error: {type(err).__name__}"))

    @app.get("/health")
    @app.post("/health")
    @app.get("/health_generate")
    @app.post("/health_generate")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> Response:
        return json_response(engine.model_info())

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> Response:
        return json_response(engine.server_info())

    @app.get("/version")
    async def version() -> Response:
        return json_response({"version": ENGINE_VERSION})

    @app.get("/v1/models")
    async def models() -> Response:
        card = {
            "id": engine.config.model_name,
            "object": "model",
            "created": created,
            "owned_by": "sglang",
            "root": engine.model_path,
            "max_model_len": engine.config.context_length,
        }
        return json_response({"object": "list", "data": [card]})

    @app.post("/generate")
    async def generate(body: GenerateBody, request: Request) -> Response:
        raw = body.to_dict()
        args = (raw, engine.vocab_size, engine.encode, engine.max_text_chars)
        text = raw.get("text")
        if isinstance(text, str) and len(text) > INLINE_TEXT_CHARS:
            parsed = await anyio.to_thread.run_sync(parse_generate_request, *args)
        else:
            parsed = parse_generate_request(*args)
        if parsed.stream:
            raise RequestError("stream", "streaming is not supported by the tiny engine")
        engine.check_limits(parsed)
        parsed.rid = parsed.rid or uuid.uuid4().hex
        work = asyncio.ensure_future(anyio.to_thread.run_sync(engine.generate, parsed, limiter=limiter))
        aborted = False
        while not work.done():
            await asyncio.wait({work}, timeout=DISCONNECT_POLL_S)
            if not work.done() and not aborted and await request.is_disconnected():
                engine.abort(rid=parsed.rid, message="client disconnected")  # as SGLang does
                aborted = True
        return json_response(work.result())

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(body: UpdateWeightsFromDiskBody) -> Response:
        if body.abort_all_requests:
            engine.abort(abort_all=True, message="aborted by update_weights_from_disk(abort_all_requests)")
        flush = True if body.flush_cache is None else body.flush_cache
        success, message = await anyio.to_thread.run_sync(
            engine.update_weights_from_disk, body.model_path, body.weight_version, flush
        )
        return json_response(  # SGLang answers a refused flush with 400 and success false
            {"success": success, "message": message, "num_paused_requests": 0},
            200 if success else 400,
        )

    @app.post("/update_weight_version")
    async def update_weight_version(body: UpdateWeightVersionBody) -> Response:
        new_version = body.new_version or body.weight_version
        if new_version is None:
            raise RequestError("new_version", "is required")
        if body.abort_all_requests is not False:
            engine.abort(abort_all=True, message="aborted by update_weight_version")
        await anyio.to_thread.run_sync(engine.update_weight_version, new_version)
        return json_response({"success": True, "message": f"Weight version updated to {new_version}"})

    @app.post("/pause_generation")
    async def pause_generation(body: PauseGenerationBody) -> Response:
        mode = body.mode or "abort"  # SGLang's default; the body itself is required
        running = await anyio.to_thread.run_sync(engine.pause, mode)  # retract waits for the KV
        return json_response(
            {"success": True, "message": f"Generation paused ({mode}).", "num_running": running}
        )

    @app.post("/continue_generation")
    async def continue_generation(body: ContinueGenerationBody) -> Response:
        engine.resume()
        return json_response({"success": True, "message": "Generation continued."})

    @app.get("/flush_cache")
    @app.post("/flush_cache")
    async def flush_cache() -> Response:
        if not await anyio.to_thread.run_sync(engine.flush_cache):
            raise CacheBusy("Cache not flushed: requests are running or queued.")
        return json_response({"success": True, "message": "Cache flushed."})

    @app.post("/abort_request")
    async def abort_request(body: AbortRequestBody) -> Response:
        if body.rid is None and not body.abort_all:
            raise RequestError("rid", "give a rid or abort_all=true")
        message = body.aborted_message or "aborted by abort_request"
        count = engine.abort(rid=body.rid, abort_all=bool(body.abort_all), message=message)
        return json_response({"success": True, "aborted": count})

    @app.get("/rl360/faults")
    async def get_faults() -> Response:
        return json_response({**engine.faults.config.to_dict(), "injected": dict(engine.faults.injected)})

    @app.post("/rl360/faults")
    async def set_faults(body: FaultsBody) -> Response:
        config = FaultConfig.from_dict(body.model_dump())
        engine.set_faults(config)
        return json_response(config.to_dict())

    return app
