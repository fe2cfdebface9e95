"""Typed /generate results: finish reasons, logprobs checked against output_ids, routed_experts decoding."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

from rl360_ext.sglang.client import (
    EngineClient,
    EngineError,
    EngineResponseError,
    EngineTimeoutError,
    FinishReason,
    GenerateResult,
    decode_routed_experts,
)


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
    timeout = client._client.timeout
    assert (timeout.connect, timeout.read, timeout.pool) == (123.0, 123.0, 123.0)


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
