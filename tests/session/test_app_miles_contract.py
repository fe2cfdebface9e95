"""The session server's Miles-facing HTTP surface, in process (the app over the scripted backend).

Health with the instance id, 32-hex ids, `GET /sessions/{id}` records, DELETE 204, the two error
shapes, engine errors passed through, and the v2 `/samples` wire with one sample per branch.
Miles' own tests of the same surface run in integration_tests/miles/test_miles_session_contract.py.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import numpy as np
import pytest
import safetensors.numpy

from rl360_ext.session.app import create_app
from rl360_ext.sglang.client import EngineError

from .conftest import Step

USER = {"role": "user", "content": "Run the tests."}


async def _client(core: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(core)), base_url="http://t")


async def _chat(client: httpx.AsyncClient, sid: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    response = await client.post(f"/sessions/{sid}/v1/chat/completions", json={"messages": messages})
    assert response.status_code == 200, response.text
    return response.json()


def _decode(payload: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    tensors = safetensors.numpy.load(payload)
    return json.loads(tensors.pop("_samples_meta").tobytes()), tensors


async def test_health_ids_view_and_delete_as_miles_has_them(make_core) -> None:
    core, _ = make_core(instance_id="ab" * 16)
    async with await _client(core) as client:
        health = [(await client.get("/health")).json() for _ in range(2)]
        assert health[0]["session_server_instance_id"] == health[1]["session_server_instance_id"] == "ab" * 16
        sid = (await client.post("/sessions")).json()["session_id"]
        assert re.fullmatch(r"[0-9a-f]{32}", sid)
        assert (await client.get(f"/sessions/{sid}")).json()["records"] == []
        first = await _chat(client, sid, [USER])
        history = [USER, first["choices"][0]["message"], {"role": "user", "content": "Again."}]
        second = await _chat(client, sid, history)
        view = (await client.get(f"/sessions/{sid}")).json()
        records = view["records"]
        assert [r["path"] for r in records] == ["/v1/chat/completions"] * 2
        assert [r["status_code"] for r in records] == [200, 200]
        assert records[1]["request"]["messages"] == history
        session = core.get(sid)
        turns = session.turns
        assert records[0]["request"]["input_ids"] == turns[0].input_ids.tolist()
        assert records[1]["request"]["input_ids"] == [
            *turns[0].input_ids.tolist(),
            *turns[0].output_ids.tolist(),
            *turns[1].input_ids.tolist(),
        ]
        assert records[1]["request"]["routed_experts_start_len"] == turns[1].routing_start
        meta = records[1]["response"]["choices"][0]["meta_info"]
        assert [t for _, t in meta["output_token_logprobs"]] == turns[1].output_ids.tolist()
        assert np.allclose([lp for lp, _ in meta["output_token_logprobs"]], turns[1].output_logprobs)
        assert records[1]["response"]["id"] == second["id"]
        assert view["metadata"]["accumulated_token_ids"] == session.segment.tokens
        assert view["metadata"]["tree"]["leaves"] == [{"node_id": 1, "path_node_ids": [0, 1]}]
        deleted = await client.delete(f"/sessions/{sid}")
        assert (deleted.status_code, deleted.content) == (204, b"")
        gone = await client.delete(f"/sessions/{sid}")
        assert gone.status_code == 404 and "was deleted" in gone.json()["error"]


async def test_session_routes_answer_miles_errors_and_v1_routes_openai_errors(make_core) -> None:
    core, _ = make_core()
    async with await _client(core) as client:
        missing = await client.get("/sessions/nonexistent")
        assert missing.status_code == 404
        assert missing.json()["error"] == "session not found: session_id=nonexistent"
        agent = await client.post("/sessions/nonexistent/v1/chat/completions", json={"messages": [USER]})
        assert agent.status_code == 404
        assert agent.json()["error"]["message"] == "session not found: session_id=nonexistent"


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (400, '{"error": "context too long"}', {"error": "context too long"}),
        (503, "overloaded", "overloaded"),
    ],
)
async def test_engine_errors_pass_through_unrecorded(
    make_core, status: int, body: str, expected: Any
) -> None:
    core, backend = make_core()
    async with await _client(core) as client:
        sid = (await client.post("/sessions")).json()["session_id"]
        backend.push(Step(error=EngineError(f"HTTP {status}", status=status, body=body)))
        response = await client.post(
            f"/sessions/{sid}/v1/chat/completions", json={"messages": [USER], "stream": True}
        )
        assert response.status_code == status
        assert (response.json() if isinstance(expected, dict) else response.text) == expected
        assert (await client.get(f"/sessions/{sid}")).json()["records"] == []


async def test_v2_samples_one_per_branch_and_the_retried_turn_is_dropped(make_core) -> None:
    core, _ = make_core(samples_wire="v2")
    async with await _client(core) as client:
        sid = (await client.post("/sessions")).json()["session_id"]
        first = await _chat(client, sid, [USER])
        history = [USER, first["choices"][0]["message"], {"role": "user", "content": "Fix it."}]
        await _chat(client, sid, history)  # turn 1: abandoned by the retry below
        await _chat(client, sid, [*history[:2], {"role": "user", "content": "Fix it, please."}])  # fork
        response = await client.post(
            f"/sessions/{sid}/samples", json={"max_seq_len": None, "metadata": {"reward": 1.0, "leaf": "x"}}
        )
        meta, tensors = _decode(response.content)
    session = core.get(sid)
    assert [t.segment for t in session.turns] == [0, 0, 1]
    first_branch, retry = meta["samples"]
    assert first_branch["metadata"]["leaf"]["path_node_ids"] == [0, 1]  # its chain; turn 1 was retried
    assert first_branch["metadata"]["merge"]["turns_kept"] == 1
    assert retry["metadata"]["leaf"] == {
        "node_id": 2,
        "parent": None,
        "path_node_ids": [2],
        "response_id": session.exchanges[2].completion["id"],
    }
    assert first_branch["reward"] == retry["reward"] == 1.0
    assert tensors["tokens.0"].tolist() == [*session.turns[0].input_ids, *session.turns[0].output_ids]
    tree = meta["session_metadata"]["tree"]
    assert [n["parent"] for n in tree["nodes"]] == [None, 0, None]
    assert tree["leaves"] == [{"node_id": 1, "path_node_ids": [0, 1]}, {"node_id": 2, "path_node_ids": [2]}]
    assert meta["session_metadata"]["agent"] == {"reward": 1.0, "leaf": "x"}


async def test_v2_samples_of_a_session_without_turns(make_core) -> None:
    core, _ = make_core(samples_wire="v2")
    async with await _client(core) as client:
        sid = (await client.post("/sessions")).json()["session_id"]
        meta, tensors = _decode((await client.post(f"/sessions/{sid}/samples")).content)
    assert (meta["samples"], meta["empty_reason"], tensors) == ([], "no_records", {})
