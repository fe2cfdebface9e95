"""The HTTP adapter: bad input -> 400 naming the field; info, weights, pause/continue, abort, faults."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from rl360_ext.reference.engine.engine import TinyEngine
from rl360_ext.reference.engine.model import init_weights, perturb_weights, save_weights
from rl360_ext.reference.engine.protocol import GenerateRequest, SamplingParams


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2, "frobnicate": 1}},
            "sampling_params.frobnicate",
        ),
        ({"input_ids": [1, 999999]}, "input_ids"),
        ({"input_ids": [1, -1]}, "input_ids"),
        ({"input_ids": [1, "a"]}, "input_ids"),
        ({"input_ids": []}, "input_ids"),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": -1}}, "sampling_params.max_new_tokens"),
        ({"input_ids": [1], "sampling_params": {"temperature": -0.5}}, "sampling_params.temperature"),
        ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "sampling_params.top_p"),
        ({"input_ids": [1], "sampling_params": {"top_k": 0}}, "sampling_params.top_k"),
        ({"input_ids": [1], "sampling_params": {"stop": [""]}}, "sampling_params.stop"),
        (
            {"input_ids": [1], "sampling_params": {"stop_token_ids": [100000]}},
            "sampling_params.stop_token_ids",
        ),
        ({"input_ids": [1], "sampling_params": {"n": 2}}, "sampling_params.n"),
        ({"input_ids": [1], "sampling_params": {"regex": "a+"}}, "sampling_params.regex"),
        ({"input_ids": [1], "sampling_params": "fast"}, "sampling_params"),
        ({"text": "hi", "input_ids": [1]}, "input_ids"),
        ({"sampling_params": {}}, "input_ids"),
        ({"text": 5}, "text"),
        ({"input_ids": [[1, 2]]}, "input_ids"),
        ({"input_ids": [1], "return_logprob": "yes"}, "return_logprob"),
        ({"input_ids": [1, 2], "logprob_start_len": 5}, "logprob_start_len"),
        ({"input_ids": [1], "routed_experts_start_len": -1}, "routed_experts_start_len"),
        ({"input_ids": [1], "rid": 7}, "rid"),
        ({"input_ids": [1], "stream": True}, "stream"),
        ([1, 2, 3], "body"),
    ],
)
def test_bad_generate_requests_name_the_field(client: TestClient, body: Any, field: str) -> None:
    response = client.post("/generate", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field and field in error["message"]
    assert (
        client.post(
            "/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}}
        ).status_code
        == 200
    )


def test_malformed_json_and_missing_bodies(client: TestClient) -> None:
    response = client.post(
        "/generate", content=b'{"input_ids": [1,', headers={"content-type": "application/json"}
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "body"
    assert client.post("/pause_generation").json()["error"]["param"] == "body"
    assert client.post("/continue_generation").json()["error"]["param"] == "body"
    assert client.post("/pause_generation", json={"mode": "sideways"}).json()["error"]["param"] == "mode"
    assert client.post("/update_weights_from_disk", json={}).json()["error"]["param"] == "model_path"
    assert (
        client.post("/update_weights_from_disk", json={"model_path": "/nope"}).json()["error"]["param"]
        == "model_path"
    )
    assert client.post("/abort_request", json={}).json()["error"]["param"] == "rid"
    assert client.post("/update_weight_version", json={"bogus": 1}).json()["error"]["param"] == "bogus"
    assert client.get("/health").status_code == 200


def test_context_length_is_enforced(fresh_engine: TinyEngine) -> None:
    fresh_engine.config.context_length = 8
    from rl360_ext.reference.engine.protocol import RequestError

    with pytest.raises(RequestError) as err:
        fresh_engine.generate(GenerateRequest(list(range(8)), SamplingParams()))
    assert err.value.field == "input_ids"
    body = fresh_engine.generate(
        GenerateRequest(list(range(5)), SamplingParams(max_new_tokens=8, ignore_eos=True))
    )
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    with pytest.raises(RequestError) as err:
        fresh_engine.generate(GenerateRequest(list(range(5)), SamplingParams(max_new_tokens=9)))
    assert err.value.field == "sampling_params.max_new_tokens"


def test_info_endpoints(client: TestClient, fresh_engine: TinyEngine) -> None:
    assert client.get("/health").status_code == 200
    info = client.get("/model_info").json()
    assert info["weight_version"] == "default" and info["is_generation"] is True
    assert info["num_layers"] == 4 and info["num_experts"] == 8 and info["num_experts_per_tok"] == 2
    models = client.get("/v1/models").json()
    assert models["data"][0]["id"] == "rl360-tiny-moe" and models["data"][0]["owned_by"] == "sglang"
    assert "version" in client.get("/version").json()
    server = client.get("/server_info").json()
    assert server["enable_return_routed_experts"] is True
    assert server["internal_states"][0]["num_running_reqs"] == 0


def test_update_weights_from_disk_bumps_version_and_flushes(
    client: TestClient, fresh_engine: TinyEngine, tmp_path
) -> None:
    config = fresh_engine.model_config
    path = save_weights(tmp_path / "step1", config, perturb_weights(init_weights(config, 0), 0.05, 1))
    ids = fresh_engine.encode("a prompt that will be cached")
    greedy = {
        "input_ids": ids,
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": 3, "temperature": 0},
    }
    before = client.post("/generate", json=greedy).json()
    response = client.post(
        "/update_weights_from_disk", json={"model_path": str(path.parent), "weight_version": "step-1"}
    )
    assert response.status_code == 200 and response.json()["success"] is True
    assert client.get("/model_info").json()["weight_version"] == "step-1"
    after = client.post("/generate", json=greedy).json()
    assert after["meta_info"]["cached_tokens"] == 0  # flushed
    assert after["meta_info"]["weight_version"] == "step-1"
    assert after["meta_info"]["output_token_logprobs"] != before["meta_info"]["output_token_logprobs"]
    assert client.post("/update_weight_version", json={"new_version": "step-1b"}).status_code == 200
    assert client.get("/model_info").json()["weight_version"] == "step-1b"


def test_flush_cache_endpoint(client: TestClient, fresh_engine: TinyEngine) -> None:
    ids = fresh_engine.encode("cache me if you can")
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 2}}
    client.post("/generate", json=body)
    assert client.post("/generate", json=body).json()["meta_info"]["cached_tokens"] > 0
    assert client.post("/flush_cache").status_code == 200
    assert client.post("/generate", json=body).json()["meta_info"]["cached_tokens"] == 0


class _Background:
    """Run engine.generate in a thread and wait for its progress."""

    def __init__(self, engine: TinyEngine, request: GenerateRequest) -> None:
        self.engine, self.result, self.error = engine, None, None
        self.thread = threading.Thread(target=self._run, args=(request,), daemon=True)
        self.thread.start()

    def _run(self, request: GenerateRequest) -> None:
        try:
            self.result = self.engine.generate(request)
        except Exception as err:  # surfaced by the test through .error
            self.error = err

    def wait_for(self, predicate, timeout_s: float = 20.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for status in self.engine.inflight():
                if predicate(status):
                    return status
            time.sleep(0.005)
        raise AssertionError(f"in-flight state never matched; now {self.engine.inflight()}")

    def join(self) -> dict[str, Any]:
        self.thread.join(timeout=60)
        assert self.error is None and self.result is not None
        return self.result


def _long_request(rid: str, max_new: int = 400) -> GenerateRequest:
    return GenerateRequest(
        list(range(1, 40)), SamplingParams(max_new_tokens=max_new, ignore_eos=True), rid=rid
    )


def _new_weights(engine: TinyEngine, tmp_path) -> str:
    config = engine.model_config
    return str(save_weights(tmp_path / "w.npz", config, perturb_weights(init_weights(config, 0), 0.05, 2)))


@pytest.mark.parametrize("mode", ["in_place", "retract"])
def test_pause_holds_in_flight_requests_and_weight_versions_split(
    fresh_engine: TinyEngine, tmp_path, mode: str
) -> None:
    request = _long_request("long")
    request.return_routed_experts = True
    job = _Background(fresh_engine, request)
    job.wait_for(lambda s: s["output_tokens"] >= 5)
    fresh_engine.pause(mode)
    paused_at = job.wait_for(lambda s: s["waiting"])["output_tokens"]
    time.sleep(0.05)
    assert fresh_engine.inflight()[0]["output_tokens"] == paused_at  # nothing generated while paused
    success, _ = fresh_engine.update_weights_from_disk(_new_weights(fresh_engine, tmp_path), "v2", True)
    assert success == (mode == "retract")  # in_place keeps KV, so SGLang refuses the flush
    fresh_engine.resume()
    meta = job.join()["meta_info"]
    assert meta["finish_reason"]["type"] == "length"
    spans = meta["weight_versions"]
    assert [s["version"] for s in spans] == ["default", "v2"]
    assert spans[0]["start"] == 0 and spans[0]["end"] == spans[1]["start"] and spans[1]["end"] == 400
    assert meta["weight_version"] == "v2"


def test_pause_abort_mode_aborts_in_flight_and_queues_new(fresh_engine: TinyEngine) -> None:
    job = _Background(fresh_engine, _long_request("victim"))
    job.wait_for(lambda s: s["output_tokens"] >= 2)
    fresh_engine.pause("abort")
    finish = job.join()["meta_info"]["finish_reason"]
    assert finish["type"] == "abort" and "pause_generation" in finish["message"]
    waiter = _Background(fresh_engine, _long_request("queued", max_new=3))
    waiter.wait_for(lambda s: s["rid"] == "queued" and s["waiting"])
    fresh_engine.resume()
    assert waiter.join()["meta_info"]["finish_reason"]["type"] == "length"


def test_abort_request_by_rid(client: TestClient, fresh_engine: TinyEngine) -> None:
    job = _Background(fresh_engine, _long_request("to-abort", max_new=2000))
    job.wait_for(lambda s: s["output_tokens"] >= 2)
    response = client.post("/abort_request", json={"rid": "to-abort"})
    assert response.json()["aborted"] == 1
    result = job.join()
    assert result["meta_info"]["finish_reason"]["type"] == "abort"
    assert 2 <= len(result["output_ids"]) < 2000
    assert client.post("/abort_request", json={"rid": "unknown"}).json()["aborted"] == 0


def test_http_pause_and_continue(client: TestClient) -> None:
    assert client.post("/pause_generation", json={"mode": "in_place"}).status_code == 200
    assert client.get("/server_info").json()["paused"] == "in_place"
    assert client.post("/continue_generation", json={}).status_code == 200
    assert client.get("/server_info").json()["paused"] is None
    assert client.post("/pause_generation", json={}).json()["message"] == "Generation paused (abort)."
    assert client.post("/continue_generation", json={}).status_code == 200


def test_fault_injection_endpoint(client: TestClient) -> None:
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 20, "ignore_eos": True}}
    assert client.post("/rl360/faults", json={"error_rate": 1.0}).status_code == 200
    response = client.post("/generate", json=body)
    assert response.status_code == 503
    assert client.get("/health").status_code == 200
    client.post("/rl360/faults", json={"abort_rate": 1.0, "seed": 3})
    finish = client.post("/generate", json=body).json()["meta_info"]["finish_reason"]
    assert finish["type"] == "abort" and "injected" in finish["message"]
    client.post("/rl360/faults", json={"latency_s": 0.2})
    started = time.monotonic()
    assert client.post("/generate", json=body).status_code == 200
    assert time.monotonic() - started >= 0.2
    faults = client.get("/rl360/faults").json()
    assert faults["latency_s"] == 0.2 and faults["injected"]["unavailable"] == 1
    assert client.post("/rl360/faults", json={"error_rate": 2}).json()["error"]["param"] == "error_rate"
    assert client.post("/rl360/faults", json={"explode": 1}).json()["error"]["param"] == "explode"


def test_fault_rates_are_seeded_fractions(fresh_engine: TinyEngine) -> None:
    from rl360_ext.reference.engine.faults import FaultConfig, FaultInjector

    injector = FaultInjector(FaultConfig(error_rate=0.3, abort_rate=0.2, seed=5))
    draws = [injector.draw(10) for _ in range(400)]
    refused = sum(d.unavailable for d in draws) / len(draws)
    aborted = sum(d.abort_after is not None for d in draws) / len(draws)
    assert 0.2 < refused < 0.4 and 0.08 < aborted < 0.25
    again = FaultInjector(FaultConfig(error_rate=0.3, abort_rate=0.2, seed=5))
    assert [again.draw(10) for _ in range(400)] == draws
    assert FaultConfig.parse_flag("error_rate=0.1,latency_s=0.2,abort_rate=0.05,seed=1") == FaultConfig(
        0.1, 0.2, 0.05, 1
    )
    with pytest.raises(ValueError, match="error_rate"):
        FaultConfig.parse_flag("error_rate=1.5")
