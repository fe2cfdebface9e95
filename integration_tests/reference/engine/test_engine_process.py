"""One `rl360 engine serve` process: concurrent requests stay exact, /health answers during generation."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from rl360_ext.local.services import start_engine
from rl360_ext.reference.engine.model import ModelConfig, TinyMoEModel
from rl360_ext.reference.engine.tokenizer import build_tokenizer
from rl360_ext.util.procs import Service, running

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEED = 5


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    service = start_engine(tmp_path_factory.mktemp("engine-logs"), "--seed", str(SEED), name="engine")
    with running(service):
        yield service


def _reference_model() -> TinyMoEModel:
    return TinyMoEModel.from_seed(ModelConfig(vocab_size=build_tokenizer().get_vocab_size()), SEED)


async def test_concurrent_requests_interleave_and_stay_exact(engine: Service) -> None:
    shared = list(range(10, 60))
    prompts = [shared + [100 + i] * (i + 1) for i in range(6)]

    async def one(client: httpx.AsyncClient, prompt: list[int], seed: int) -> dict:
        body = {
            "input_ids": prompt,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": 40, "ignore_eos": True, "sampling_seed": seed},
        }
        response = await client.post("/generate", json=body)
        assert response.status_code == 200, response.text
        return response.json()

    async with httpx.AsyncClient(base_url=engine.url, timeout=60) as client:
        results = await asyncio.gather(*(one(client, p, i) for i, p in enumerate(prompts)))
    model = _reference_model()
    for prompt, result in zip(prompts, results, strict=True):
        reported = np.array([entry[0] for entry in result["meta_info"]["output_token_logprobs"]])
        recomputed = model.sequence_logprobs(prompt + result["output_ids"])[len(prompt) - 1 :]
        assert np.max(np.abs(reported - recomputed)) <= 1e-5


async def test_health_answers_while_generating(engine: Service) -> None:
    async with httpx.AsyncClient(base_url=engine.url, timeout=60) as client:
        body = {
            "input_ids": list(range(1, 200)),
            "rid": "long-one",
            "sampling_params": {"max_new_tokens": 5000, "ignore_eos": True},
        }
        generation = asyncio.create_task(client.post("/generate", json=body))
        await asyncio.sleep(0.3)
        for _ in range(5):
            assert not generation.done()
            health = await client.get("/health", timeout=2.0)
            assert health.status_code == 200
            await asyncio.sleep(0.05)
        info = (await client.get("/server_info", timeout=2.0)).json()
        assert info["internal_states"][0]["num_running_reqs"] == 1
        assert (await client.post("/abort_request", json={"rid": "long-one"})).json()["aborted"] == 1
        result = await generation
        assert result.status_code == 200
        assert result.json()["meta_info"]["finish_reason"]["type"] == "abort"


def test_engine_survives_bad_requests(engine: Service) -> None:
    for body in (
        b"{not json",
        b'{"input_ids": [1, 99999]}',
        b'{"input_ids": [1], "sampling_params": {"max_new_tokens": -3}}',
    ):
        response = httpx.post(engine.url + "/generate", content=body, timeout=10)
        assert response.status_code == 400
    assert engine.alive()
    ok = httpx.post(
        engine.url + "/generate", json={"text": "still here", "sampling_params": {"max_new_tokens": 2}}
    )
    assert ok.status_code == 200


def test_client_disconnect_aborts_generation(engine: Service) -> None:
    body = {"input_ids": list(range(1, 50)), "sampling_params": {"max_new_tokens": 20000, "ignore_eos": True}}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(engine.url + "/generate", json=body, timeout=0.5)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        running_requests = httpx.get(engine.url + "/server_info").json()["internal_states"][0][
            "num_running_reqs"
        ]
        if running_requests == 0:
            return
        time.sleep(0.1)
    raise AssertionError("the engine kept generating for a client that went away")
