"""The instant SGLang stand-in: SGLang's response shape, routed_experts rows as SGLang counts them."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.reference.engine.instant import InstantConfig, create_app

CONFIG = InstantConfig(layers=3, top_k=2, experts=8)
CLIENT = TestClient(create_app(CONFIG))


def test_a_reply_ends_with_the_end_of_turn_token_and_carries_logprobs() -> None:
    body = CLIENT.post("/generate", json={"input_ids": [1, 2, 3], "return_logprob": True}).json()
    meta = body["meta_info"]
    assert (
        meta["finish_reason"]["type"] == "stop" and meta["finish_reason"]["matched"] == body["output_ids"][-1]
    )
    assert [entry[1] for entry in meta["output_token_logprobs"]] == body["output_ids"]
    assert meta["prompt_tokens"] == 3 and meta["completion_tokens"] == len(body["output_ids"])


def test_max_new_tokens_cuts_the_reply_as_a_length_finish() -> None:
    body = CLIENT.post("/generate", json={"input_ids": [1], "sampling_params": {"max_new_tokens": 2}}).json()
    assert len(body["output_ids"]) == 2 and body["meta_info"]["finish_reason"] == {
        "type": "length",
        "length": 2,
    }


@settings(max_examples=30, deadline=None)
@given(prompt=st.integers(1, 300), start=st.integers(0, 300))
def test_routed_experts_rows_are_prompt_plus_output_minus_one_minus_start(prompt: int, start: int) -> None:
    start = min(start, prompt)
    body = CLIENT.post(
        "/generate",
        json={
            "input_ids": list(range(prompt)),
            "return_routed_experts": True,
            "routed_experts_start_len": start,
        },
    ).json()
    raw = np.frombuffer(base64.b64decode(body["meta_info"]["routed_experts"]), dtype="<i4")
    rows = prompt + len(body["output_ids"]) - 1 - start
    assert raw.size == rows * CONFIG.layers * CONFIG.top_k
    assert raw.max(initial=0) < CONFIG.experts


def test_model_info_reports_the_moe_shape() -> None:
    info = CLIENT.get("/model_info").json()
    assert (info["num_layers"], info["num_experts_per_tok"], info["num_experts"]) == (3, 2, 8)


@pytest.mark.parametrize("body", [[1, 2], {"input_ids": "abc"}, {}])
def test_bad_bodies_are_400(body: object) -> None:
    assert CLIENT.post("/generate", json=body).status_code == 400


def test_an_impossible_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="top_k"):
        InstantConfig(top_k=9, experts=8)


def test_chat_completions_with_input_ids_answers_as_sglang_does_for_miles() -> None:
    body = {
        "input_ids": [1, 2, 3, 4],
        "messages": [{"role": "user", "content": "hi"}],
        "logprobs": True,
        "return_meta_info": True,
        "return_routed_experts": True,
        "routed_experts_start_len": 2,
    }
    reply = CLIENT.post("/v1/chat/completions", json=body).json()
    choice = reply["choices"][0]
    generated = CLIENT.post("/generate", json={"input_ids": [1, 2, 3, 4]}).json()
    assert choice["message"]["content"] == generated["text"] and choice["finish_reason"] == "stop"
    meta = choice["meta_info"]
    assert [entry[1] for entry in meta["output_token_logprobs"]] == generated["output_ids"]
    assert meta["completion_tokens"] == len(choice["logprobs"]["content"]) == len(generated["output_ids"])
    raw = np.frombuffer(base64.b64decode(meta["routed_experts"]), dtype="<i4")
    assert raw.size == (4 + len(generated["output_ids"]) - 1 - 2) * CONFIG.layers * CONFIG.top_k
    assert reply["usage"]["prompt_tokens"] == 4


def test_chat_completions_without_meta_info_or_ids() -> None:
    plain = CLIENT.post("/v1/chat/completions", json={"input_ids": [1], "max_tokens": 1}).json()
    assert "meta_info" not in plain["choices"][0] and plain["choices"][0]["finish_reason"] == "length"
    assert CLIENT.post("/v1/chat/completions", json={"messages": []}).status_code == 400
