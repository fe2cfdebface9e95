"""Real agent clients against session server -> tiny engine: the official openai client and litellm."""

from __future__ import annotations

import httpx
import litellm
import numpy as np
import openai
import pytest

from rl360_ext.reference.engine.tokenizer import load_tiny_tokenizer

from .conftest import END_OF_TURN_BIAS, LS_CALL, SYSTEM, TOOLS, USER, merged, new_session, session_client

pytestmark = pytest.mark.integration


def _chat(client: openai.OpenAI, messages: list, seed: int, **kw):
    return client.chat.completions.create(
        model="policy", messages=messages, max_tokens=48, seed=seed, logit_bias=END_OF_TURN_BIAS, **kw
    )


def test_openai_client_multi_turn(session_server) -> None:
    session_id, base_url = new_session(session_server, metadata={"task": "plain"})
    client = session_client(base_url)
    messages = [SYSTEM, USER]
    finishes = []
    for turn in range(3):
        completion = _chat(client, messages, seed=turn)
        choice = completion.choices[0]
        assert isinstance(choice.message.content, str) and completion.usage.completion_tokens > 0
        finishes.append(choice.finish_reason)
        messages += [
            choice.message.model_dump(exclude_none=True),
            {"role": "user", "content": f"step {turn}"},
        ]
    sample = merged(session_server, session_id)
    kept = finishes.index("length") + 1 if "length" in finishes else 3
    assert len(sample.turns) == kept and sample.status == (
        "TRUNCATED" if "length" in finishes else "COMPLETED"
    )
    assert sample.metadata["task"] == "plain" and sample.metadata["session"]["forks"] == []
    assert len(sample.routed_experts) == len(sample.tokens) - 1
    assert [t["cached_tokens"] > 0 for t in sample.turns[1:]] == [True] * (
        kept - 1
    )  # the prefix stays cached


def test_openai_client_with_tools(session_server) -> None:
    session_id, base_url = new_session(session_server)
    client = session_client(base_url)
    messages = [
        SYSTEM,
        USER,
        {"role": "assistant", "content": None, "tool_calls": [LS_CALL]},
        {"role": "tool", "tool_call_id": "call_0", "content": "app.py  test_app.py"},
    ]
    first = _chat(client, messages, seed=1, tools=TOOLS, tool_choice="auto")
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "user", "content": "Now run pytest."},
    ]
    _chat(client, messages, seed=2, tools=TOOLS, tool_choice="auto")
    sample = merged(session_server, session_id)
    text = load_tiny_tokenizer().decode(sample.tokens.tolist())
    assert '"name": "bash"' in text and "<tool_response>app.py  test_app.py</tool_response>" in text
    assert sample.metadata["session"]["forks"] == []
    first_cut = sample.turns[0]["finish_reason"] == "length"
    assert len(sample.turns) == (1 if first_cut else 2) and ("Now run pytest." in text) != first_cut


def test_openai_client_streaming(session_server) -> None:
    session_id, base_url = new_session(session_server)
    client = session_client(base_url)
    chunks = list(_chat(client, [USER], seed=3, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    reply = {"role": "assistant", "content": content}
    _chat(client, [USER, reply, {"role": "user", "content": "again"}], seed=4)  # streaming kept the history
    sample = merged(session_server, session_id)
    assert sample.metadata["session"]["forks"] == []
    assert load_tiny_tokenizer().decode(sample.tokens[sample.loss_mask == 1].tolist()).startswith(content)


def test_litellm_client(session_server) -> None:
    session_id, base_url = new_session(session_server)
    messages = [SYSTEM, USER]
    for turn in range(2):
        response = litellm.completion(
            model="openai/policy",
            api_base=base_url,
            api_key="unused",
            messages=messages,
            max_tokens=48,
            seed=turn,
            logit_bias=END_OF_TURN_BIAS,
            num_retries=0,
        )
        message = response.choices[0].message
        messages += [{"role": "assistant", "content": message.content}, {"role": "user", "content": "next"}]
    sample = merged(session_server, session_id)
    assert sample.metadata["session"]["forks"] == []
    assert len(sample.turns) == (1 if sample.turns[0]["finish_reason"] == "length" else 2)
    assert np.all(sample.rollout_log_probs[sample.loss_mask == 1] <= 0)


def test_errors_are_clear_to_clients(session_server) -> None:
    session_id, base_url = new_session(session_server)
    client = session_client(base_url)
    with pytest.raises(openai.BadRequestError, match="n=2 is not supported"):
        client.chat.completions.create(model="policy", messages=[USER], n=2)
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\].role"):
        client.chat.completions.create(model="policy", messages=[{"role": "robot", "content": "x"}])
    assert [m.id for m in client.models.list()] == ["rl360-tiny-moe"]  # the engine's served model
    missing = openai.OpenAI(
        base_url=f"{session_server.url}/sessions/no-such-session/v1", api_key="x", max_retries=0
    )
    with pytest.raises(openai.NotFoundError, match="session not found"):
        missing.chat.completions.create(model="policy", messages=[USER])
    malformed = httpx.post(f"{base_url}/chat/completions", content=b"{not json", timeout=10)
    assert malformed.status_code == 400 and "malformed JSON" in malformed.json()["error"]["message"]
    bad_format = httpx.get(f"{session_server.url}/sessions/{session_id}/merged?format=xml", timeout=10)
    assert bad_format.status_code == 400
    assert httpx.delete(f"{session_server.url}/sessions/{session_id}", timeout=10).status_code == 204
    gone = httpx.get(f"{session_server.url}/sessions/{session_id}/merged", timeout=10)
    assert gone.status_code == 404 and "deleted" in gone.json()["error"]  # Miles' {"error": "<text>"}


def test_json_merged_health_and_metrics(session_server) -> None:
    session_id, base_url = new_session(session_server)
    session_client(base_url).chat.completions.create(model="policy", messages=[USER], max_tokens=8)
    as_json = httpx.get(f"{session_server.url}/sessions/{session_id}/merged?format=json", timeout=10).json()
    binary = merged(session_server, session_id)
    assert as_json["tokens"] == binary.tokens.tolist()
    assert as_json["routed_experts"] == binary.routed_experts.tolist()
    assert httpx.get(session_server.url + "/health", timeout=10).json()["status"] == "ok"
    metrics = httpx.get(session_server.url + "/metrics", timeout=10).text
    for name in (
        "rl360_session_r3_rows_from_prefill_fraction",
        "rl360_session_cached_tokens_total",
        "rl360_session_routing_wire_bytes_total",
        "rl360_session_turns_total",
    ):
        assert name in metrics
