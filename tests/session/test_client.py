"""Typed /generate results: finish reasons, logprobs checked against output_ids, routed_experts decoding."""

from __future__ import annotations

import asyncio
import base64

import httpx
import numpy as np
import orjson
import pytest
from aiohttp import web

from rl360_ext.sglang.client import (
    STALE_RETRIES,
    EngineClient,
    EngineError,
    EngineResponseError,
    EngineTimeoutError,
    FinishReason,
    GenerateResult,
    decode_routed_experts,
)
from rl360_ext.util.procs import free_port


def _body(**meta):
    return {
        "text": "ab",
        "output_ids": [5, 6],
        "meta_info": {
            "id": "r1",
            "finish_reason": {"type": "length", "length": 2},
            "prompt_tokens": 3,
            "completion_tokens": 2,
            "cached_tokens": 1,
            "weight_version": "v2",
            "weight_versions": [
                {"version": "v1", "start": 0, "end": 1},
                {"version": "v2", "start": 1, "end": 2},
            ],
            "output_token_logprobs": [[-0.1, 5, None], [-0.2, 6, None]],
            **meta,
        },
    }


def test_a_full_response_is_typed() -> None:
    rows = np.arange(3 * 4 * 2, dtype="<i4").reshape(3, 4, 2)  # prompt 3 + output 2 - 1 - start 1
    body = _body(routed_experts=base64.b64encode(rows.tobytes()).decode())
    result = GenerateResult.from_json(body, routed_experts_start_len=1)
    assert result.finish_reason == FinishReason("length", length=2)
    assert result.weight_versions[1].version == "v2" and result.cached_tokens == 1
    assert result.output_logprobs.tolist() == [-0.1, -0.2]
    assert result.expected_routing_rows == 3
    assert np.array_equal(result.routing_rows(4, 2), rows)
    assert result.routed_experts_wire_bytes == len(body["meta_info"]["routed_experts"])


def test_protocol_violations_are_named() -> None:
    with pytest.raises(EngineResponseError, match="is for token 9"):
        GenerateResult.from_json(_body(output_token_logprobs=[[-0.1, 9, None], [-0.2, 6, None]]))
    with pytest.raises(EngineResponseError, match="1 entries for 2 output tokens"):
        GenerateResult.from_json(_body(output_token_logprobs=[[-0.1, 5, None]]))
    with pytest.raises(EngineResponseError, match="finish_reason"):
        GenerateResult.from_json(_body(finish_reason=None))
    with pytest.raises(EngineResponseError, match="multiple of 4"):
        decode_routed_experts(base64.b64encode(b"abc").decode())
    result = GenerateResult.from_json(_body(routed_experts=base64.b64encode(bytes(12)).decode()))
    with pytest.raises(EngineResponseError, match="not a multiple of layers"):
        result.routing_rows(4, 2)


def test_connecting_gets_the_whole_engine_timeout_not_a_short_connect_limit() -> None:
    client = EngineClient("http://127.0.0.1:9", timeout_s=123.0)
    timeout = client.timeout
    assert timeout.total == 123.0
    assert (timeout.connect, timeout.sock_connect, timeout.sock_read) == (None, None, None)


async def test_a_timeout_and_a_429_are_told_apart_from_other_failures() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/slow":
            raise httpx.ReadTimeout("no answer", request=request)
        return httpx.Response(429, text="busy")

    http = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    async with EngineClient("http://engine", client=http) as client:
        with pytest.raises(EngineTimeoutError, match="timed out"):
            await client._get("/slow")
        with pytest.raises(EngineError) as busy:
            await client.generate([1, 2])
    assert busy.value.is_overloaded and busy.value.is_client_error
    await http.aclose()


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def _engine_app(keys: list[str] | None = None) -> web.Application:
    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        if keys is not None:
            keys.append(request.headers.get("X-SMG-Routing-Key", ""))
        if body["input_ids"] == [0]:
            return web.Response(status=429, text="busy")
        reply = _body()
        reply["meta_info"]["prompt_tokens"] = len(body["input_ids"])
        return web.json_response(reply, headers={"X-SMG-Routed-Worker-Id": "w1"})

    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response(text="late")

    async def not_json(_: web.Request) -> web.Response:
        return web.Response(text="<html>")

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_get("/slow", slow)
    app.router.add_get("/server_info", not_json)
    return app


async def test_the_default_transport_speaks_to_a_real_loopback_engine() -> None:
    keys: list[str] = []
    runner, url = await _serve(_engine_app(keys))
    try:
        async with EngineClient(url, timeout_s=0.5) as client:
            result = await client.generate([1, 2, 3], routing_key="session-1")
            assert keys == ["session-1"]
            assert result.prompt_tokens == 3 and result.output_ids == [5, 6]
            assert result.routed_worker == "w1"  # header names are case-insensitive
            with pytest.raises(EngineError) as busy:
                await client.generate([0])
            assert busy.value.is_overloaded and busy.value.body == "busy"
            with pytest.raises(EngineTimeoutError, match=r"GET .*/slow timed out"):
                await client._get("/slow")
            with pytest.raises(ValueError):
                (await client._get("/server_info")).json()
    finally:
        await runner.cleanup()


async def test_a_refused_connection_is_an_engine_error_not_a_timeout() -> None:
    async with EngineClient(f"http://127.0.0.1:{free_port()}", timeout_s=5.0) as client:
        with pytest.raises(EngineError, match="failed") as refused:
            await client.generate([1])
        assert not isinstance(refused.value, EngineTimeoutError) and refused.value.status is None
        assert not await client.health()


def test_one_client_serves_one_event_loop_after_another() -> None:
    client = EngineClient("http://127.0.0.1:9")

    async def once() -> str:
        runner, url = await _serve(_engine_app())
        try:
            client.base_url = url
            return (await client.generate([1, 2])).text
        finally:
            await runner.cleanup()

    assert asyncio.run(once()) == "ab"
    assert asyncio.run(once()) == "ab"
    asyncio.run(client.aclose())


async def test_many_concurrent_generates_share_the_pool_without_failures() -> None:
    runner, url = await _serve(_engine_app())
    try:
        async with EngineClient(url, max_connections=8) as client:
            results = await asyncio.gather(*(client.generate(list(range(1, n + 2))) for n in range(64)))
        assert [r.prompt_tokens for r in results] == [n + 1 for n in range(64)]
    finally:
        await runner.cleanup()


async def _dropping_server(drops: int) -> tuple[asyncio.Server, str, list[int]]:
    """A raw HTTP server that reads each request and, for the first `drops`, closes unanswered."""
    seen: list[int] = []
    answer = orjson.dumps(_body())

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(
            next(
                line.split(b":")[1]
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
        )
        await reader.readexactly(length)
        seen.append(len(seen))
        if len(seen) <= drops:
            writer.close()
            return
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")
        writer.write(b"content-length: %d\r\n\r\n" % len(answer) + answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}", seen


async def test_a_request_dropped_unanswered_is_sent_again_on_another_connection() -> None:
    server, url, seen = await _dropping_server(drops=STALE_RETRIES)
    async with server, EngineClient(url) as client:
        result = await client.generate([1, 2, 3])
    assert result.output_ids == [5, 6] and len(seen) == STALE_RETRIES + 1


async def test_a_server_that_keeps_dropping_fails_the_request_after_the_retries() -> None:
    server, url, seen = await _dropping_server(drops=STALE_RETRIES + 5)
    async with server, EngineClient(url) as client:
        with pytest.raises(EngineError, match="ServerDisconnectedError") as failed:
            await client.generate([1])
    assert not isinstance(failed.value, EngineTimeoutError)
    assert len(seen) == STALE_RETRIES + 1
