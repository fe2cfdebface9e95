"""Hostile input to the tiny engine: each answered 4xx naming the field, or served as documented.

Covers the bodies that used to 500 or be accepted (a negative sampling_seed, fault latencies of
1e308/NaN/inf, max_new_tokens of 2^64 or 1e30), the optional bearer token, the error tree's
statuses, and that /openapi.json documents every route's body.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from rl360_ext.reference.engine.config import EngineConfig
from rl360_ext.reference.engine.engine import TinyEngine
from rl360_ext.reference.engine.errors import (
    EngineError,
    FaultConfigError,
    RequestError,
    ServiceUnavailable,
    Unauthorized,
)
from rl360_ext.reference.engine.server import create_app

GREEDY = {"max_new_tokens": 4, "temperature": 0.0}


def _post_raw(client: TestClient, path: str, text: str) -> Any:
    """POST a body as raw text (json.dumps refuses NaN/Infinity only when asked; send them as-is)."""
    return client.post(path, content=text.encode(), headers={"content-type": "application/json"})


def test_negative_sampling_seed_is_a_seed_as_in_sglang(client: TestClient) -> None:
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 6, "sampling_seed": -1}}
    first = client.post("/generate", json=body)
    assert first.status_code == 200, first.text
    assert client.post("/generate", json=body).json()["output_ids"] == first.json()["output_ids"]
    # -1 is the two's complement of 2^64 - 1: SGLang reinterprets the int64 seed as uint64.
    wrapped = {**body, "sampling_params": {**body["sampling_params"], "sampling_seed": 2**63 - 1}}
    assert client.post("/generate", json=wrapped).status_code == 200
    for seed in (2**63, -(2**63) - 1, 2**64):
        bad = {**body, "sampling_params": {"max_new_tokens": 2, "sampling_seed": seed}}
        response = client.post("/generate", json=bad)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "sampling_params.sampling_seed"


@pytest.mark.parametrize("value", ["1e308", "NaN", "Infinity", "-Infinity", "-1", "-1e-9", "601", "true"])
def test_fault_latency_outside_its_bound_is_refused(client: TestClient, value: str) -> None:
    response = _post_raw(client, "/rl360/faults", '{"latency_s": ' + value + "}")
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "latency_s"
    assert client.get("/rl360/faults").json()["latency_s"] == 0.0
    assert client.post("/generate", json={"input_ids": [1, 2], "sampling_params": GREEDY}).status_code == 200


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"error_rate": NaN}', "error_rate"),
        ('{"abort_rate": -0.5}', "abort_rate"),
        ('{"seed": -1}', "seed"),
        ('{"seed": 1.5}', "seed"),
        (f'{{"seed": {2**64}}}', "seed"),
        ('{"error_rate": "0.1"}', "error_rate"),
    ],
)
def test_other_bad_fault_settings_name_the_field(client: TestClient, body: str, field: str) -> None:
    response = _post_raw(client, "/rl360/faults", body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == field


def test_fault_config_refuses_unbounded_latency_directly() -> None:
    from rl360_ext.reference.engine.faults import FaultConfig

    for latency in (1e308, float("nan"), float("inf"), -1.0):
        with pytest.raises(FaultConfigError) as err:
            FaultConfig(latency_s=latency)
        assert err.value.field == "latency_s"
    with pytest.raises(ValueError, match="latency_s"):
        FaultConfig.parse_flag("latency_s=1e308")


@pytest.mark.parametrize("value", [str(2**64), "1e30", "1e400", "32769", "4.5", '"8"'])
def test_max_new_tokens_beyond_the_context_is_refused(client: TestClient, value: str) -> None:
    text = '{"input_ids": [1, 2], "sampling_params": {"max_new_tokens": ' + value + "}}"
    response = _post_raw(client, "/generate", text)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "sampling_params.max_new_tokens"


def test_max_new_tokens_at_the_context_is_served_and_cut_at_it(fresh_engine: TinyEngine) -> None:
    fresh_engine.config.context_length = 16
    with TestClient(create_app(fresh_engine)) as client:
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 16, "ignore_eos": True}}
        response = client.post("/generate", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 13}


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"input_ids": [1], "sampling_params": {"temperature": NaN}}', "sampling_params.temperature"),
        ('{"input_ids": [1], "sampling_params": {"top_p": Infinity}}', "sampling_params.top_p"),
        ('{"input_ids": [1], "sampling_params": {"ignore_eos": "yes"}}', "sampling_params.ignore_eos"),
        ('{"input_ids": [1], "sampling_params": {"logit_bias": {"1": NaN}}}', "sampling_params.logit_bias"),
        ('{"input_ids": [1], "top_logprobs_num": 1e30}', "top_logprobs_num"),
        ('{"input_ids": [1], "logprob_start_len": -2}', "logprob_start_len"),
        ('{"text": "a\\u0000b", "input_ids": null, "rid": 5}', "rid"),
        ('{"input_ids": [1], "sampling_params": null, "lora_path": 3}', "lora_path"),
        ("null", "body"),
        ('"text"', "body"),
    ],
)
def test_schema_violations_are_400_naming_the_field(client: TestClient, text: str, field: str) -> None:
    response = _post_raw(client, "/generate", text)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field and error["type"] == "BadRequestError" and error["code"] == 400


def test_unknown_top_level_generate_keys_are_ignored_as_in_sglang(client: TestClient) -> None:
    body = {"input_ids": [1, 2], "sampling_params": GREEDY, "model": "x", "bootstrap_host": None}
    assert client.post("/generate", json=body).status_code == 200


def test_error_tree_statuses() -> None:
    assert issubclass(RequestError, EngineError) and RequestError.status == 400
    assert issubclass(FaultConfigError, RequestError)
    assert Unauthorized.status == 401 and ServiceUnavailable.status == 503 and EngineError.status == 500
    from rl360_ext.reference.engine import faults, protocol

    assert protocol.RequestError is RequestError and faults.ServiceUnavailable is ServiceUnavailable


def test_api_key_guards_every_route_but_health() -> None:
    engine = TinyEngine(EngineConfig(api_key="s3cret"))
    with TestClient(create_app(engine)) as client:
        body = {"input_ids": [1, 2], "sampling_params": GREEDY}
        assert client.get("/health").status_code == 200
        for response in (
            client.post("/generate", json=body),
            client.get("/server_info"),
            client.post("/generate", json=body, headers={"Authorization": "Bearer wrong"}),
            client.post("/generate", json=body, headers={"Authorization": "s3cret"}),
            client.post("/rl360/faults", json={"error_rate": 1.0}),
            client.get("/openapi.json"),
        ):
            assert response.status_code == 401, response.text
            assert response.json()["error"]["type"] == "AuthenticationError"
        ok = client.post("/generate", json=body, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert client.get("/rl360/faults", headers={"authorization": "bearer s3cret"}).status_code == 200
    assert "s3cret" not in json.dumps(engine.server_info()) and "s3cret" not in repr(engine.config)


def test_openapi_documents_every_request_body(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    expected = {
        "/generate": "GenerateBody",
        "/update_weights_from_disk": "UpdateWeightsFromDiskBody",
        "/update_weight_version": "UpdateWeightVersionBody",
        "/pause_generation": "PauseGenerationBody",
        "/continue_generation": "ContinueGenerationBody",
        "/abort_request": "AbortRequestBody",
        "/rl360/faults": "FaultsBody",
    }
    for path, model in expected.items():
        body = spec["paths"][path]["post"]["requestBody"]
        assert body["content"]["application/json"]["schema"]["$ref"].endswith("/" + model), path
    sampling = spec["components"]["schemas"]["SamplingParamsBody"]
    assert sampling["additionalProperties"] is False and "sampling_seed" in sampling["properties"]
    posts_without_body = {
        path
        for path, item in spec["paths"].items()
        if "post" in item and "requestBody" not in item["post"] and path not in expected
    }
    assert posts_without_body <= {"/health", "/health_generate", "/flush_cache"}


def test_engine_config_is_the_source_of_the_serve_flags() -> None:
    from typer.testing import CliRunner

    from rl360_ext.cli import app
    from rl360_ext.util.fielddocs import field_docs

    docs = field_docs(EngineConfig)
    result = CliRunner().invoke(app, ["engine", "serve", "--help"], terminal_width=400)
    assert result.exit_code == 0, result.output
    for flag in (
        "--tokenizer",
        "--weights",
        "--kv-capacity",
        "--chunked-prefill-size",
        "--api-key",
        "--faults",
    ):
        assert flag in result.output
    assert "SGLang's --chunked-prefill-size" in docs["chunked_prefill_size"]
    assert set(docs) == {f for f in EngineConfig.__dataclass_fields__}
    bad = CliRunner().invoke(app, ["engine", "serve", "--chunked-prefill-size", "0"])
    assert bad.exit_code != 0 and "chunked_prefill_size" in bad.output
