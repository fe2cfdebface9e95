"""The tiny engine's HTTP adapter: SGLang's native endpoints (FastAPI), nothing else.

Owns the routes (/generate, /health, /model_info, /server_info, /v1/models, /version, weight
update, pause/continue, flush, abort, and the /rl360/faults admin endpoint), decoding JSON bodies,
mapping `RequestError` to 400 (naming the field) and `ServiceUnavailable` to 503, and running
blocking engine work in worker threads so /health stays responsive. Logic lives in `engine.py`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import anyio
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from rl360_ext.tiny_engine.engine import ENGINE_VERSION, TinyEngine
from rl360_ext.tiny_engine.faults import FaultConfig, FaultConfigError, ServiceUnavailable
from rl360_ext.tiny_engine.protocol import RequestError, parse_generate_request

MAX_CONCURRENT_REQUESTS = 256
DISCONNECT_POLL_S = 0.1


def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def error_response(status: int, message: str, field: str | None = None) -> Response:
    kind = "BadRequestError" if status == 400 else "ServiceUnavailableError" if status == 503 else "Error"
    return json_response(
        {"error": {"message": message, "type": kind, "param": field, "code": status}}, status
    )


async def _json_body(request: Request) -> Any:
    """The decoded JSON body; a missing or malformed one is a 400 naming `body`."""
    raw = await request.body()
    if not raw.strip():
        raise RequestError("body", "a JSON body is required")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        raise RequestError("body", f"malformed JSON: {err}") from None


def _object(body: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError("body", "must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise RequestError(unknown[0], "unknown field")
    return body


def _str_field(body: dict[str, Any], key: str, required: bool = False) -> str | None:
    value = body.get(key)
    if value is None:
        if required:
            raise RequestError(key, "is required")
        return None
    if not isinstance(value, str) or not value:
        raise RequestError(key, "must be a non-empty string")
    return value


def _bool_field(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(key, f"must be a boolean, got {value!r}")
    return value


def create_app(engine: TinyEngine) -> FastAPI:
    """The FastAPI app serving `engine`."""
    app = FastAPI(title="rl360 tiny engine (SGLang protocol)", version=ENGINE_VERSION)
    limiter = anyio.CapacityLimiter(MAX_CONCURRENT_REQUESTS)
    created = int(time.time())

    @app.exception_handler(RequestError)
    async def _bad_request(_: Request, err: RequestError) -> Response:
        return error_response(400, str(err), err.field)

    @app.exception_handler(ServiceUnavailable)
    async def _unavailable(_: Request, err: ServiceUnavailable) -> Response:
        return error_response(503, str(err))

    @app.api_route("/health", methods=["GET", "POST"])
    @app.api_route("/health_generate", methods=["GET", "POST"])
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
    async def generate(request: Request) -> Response:
        body = await _json_body(request)
        parsed = parse_generate_request(body, engine.vocab_size, engine.encode)
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
    async def update_weights_from_disk(request: Request) -> Response:
        body = _object(
            await _json_body(request),
            {
                "model_path",
                "load_format",
                "weight_version",
                "flush_cache",
                "abort_all_requests",
                "is_async",
                "torch_empty_cache",
                "keep_pause",
                "recapture_cuda_graph",
                "token_step",
            },
        )
        model_path = _str_field(body, "model_path", required=True)
        assert model_path is not None
        weight_version = _str_field(body, "weight_version")
        flush = _bool_field(body, "flush_cache", True)
        if _bool_field(body, "abort_all_requests", False):
            engine.abort(abort_all=True, message="aborted by update_weights_from_disk(abort_all_requests)")
        await anyio.to_thread.run_sync(engine.update_weights_from_disk, model_path, weight_version, flush)
        return json_response(
            {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}
        )

    @app.post("/update_weight_version")
    async def update_weight_version(request: Request) -> Response:
        body = _object(
            await _json_body(request), {"new_version", "weight_version", "abort_all_requests", "rid"}
        )
        new_version = _str_field(body, "new_version") or _str_field(body, "weight_version")
        if new_version is None:
            raise RequestError("new_version", "is required")
        if _bool_field(body, "abort_all_requests", True):
            engine.abort(abort_all=True, message="aborted by update_weight_version")
        await anyio.to_thread.run_sync(engine.update_weight_version, new_version)
        return json_response({"success": True, "message": f"Weight version updated to {new_version}"})

    @app.post("/pause_generation")
    async def pause_generation(request: Request) -> Response:
        body = _object(await _json_body(request), {"mode", "rid"})
        mode = _str_field(body, "mode") or "abort"  # SGLang's default; the body itself is required
        running = engine.pause(mode)
        return json_response(
            {"success": True, "message": f"Generation paused ({mode}).", "num_running": running}
        )

    @app.post("/continue_generation")
    async def continue_generation(request: Request) -> Response:
        _object(await _json_body(request), {"torch_empty_cache", "rid"})  # body required, as in SGLang
        engine.resume()
        return json_response({"success": True, "message": "Generation continued."})

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        await anyio.to_thread.run_sync(engine.flush_cache)
        return json_response({"success": True, "message": "Cache flushed."})

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        body = _object(await _json_body(request), {"rid", "abort_all", "finished_reason", "aborted_message"})
        rid = _str_field(body, "rid")
        abort_all = _bool_field(body, "abort_all", False)
        if rid is None and not abort_all:
            raise RequestError("rid", "give a rid or abort_all=true")
        message = _str_field(body, "aborted_message") or "aborted by abort_request"
        count = engine.abort(rid=rid, abort_all=abort_all, message=message)
        return json_response({"success": True, "aborted": count})

    @app.get("/rl360/faults")
    async def get_faults() -> Response:
        return json_response({**engine.faults.config.to_dict(), "injected": dict(engine.faults.injected)})

    @app.post("/rl360/faults")
    async def set_faults(request: Request) -> Response:
        try:
            config = FaultConfig.from_dict(await _json_body(request))
        except FaultConfigError as err:
            raise RequestError(err.field, str(err)) from None
        engine.set_faults(config)
        return json_response(config.to_dict())

    return app
