"""Two tiny engines behind the real SMG gateway: sticky routing keeps prefix caches hot.

Real processes on 127.0.0.1 (`rl360 engine serve` x2, `smg launch`). With `--policy manual`, one
X-SMG-Routing-Key always lands on one engine and its cached_tokens grow turn after turn; with
`--policy round_robin` the same conversations bounce between engines and the hit rate falls.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from rl360_ext.local.services import start_engine, start_smg
from rl360_ext.reference.engine.protocol import decode_routed_experts
from rl360_ext.util.procs import Service, running

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SESSIONS = 3  # odd, so round-robin cannot line sessions up with engines by accident
TURNS = 6
TURN_TOKENS = 60
OUTPUT_TOKENS = 12


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, Service]]:
    logs = tmp_path_factory.mktemp("engine-logs")
    first = start_engine(logs, "--seed", "0", name="engine-a")
    with running(first):
        second = start_engine(logs, "--seed", "0", name="engine-b")
        with running(second):
            yield first, second


def _flush(engines: tuple[Service, Service]) -> None:
    for engine in engines:
        assert httpx.post(engine.url + "/flush_cache", timeout=10).status_code == 200


def _converse(gateway: str) -> tuple[dict[str, list[str]], dict[str, list[int]], float]:
    """SESSIONS interleaved multi-turn chats through the gateway; returns workers, cached_tokens, hit rate."""
    rng = np.random.default_rng(0)
    histories: dict[str, list[int]] = {f"session-{i}": [] for i in range(SESSIONS)}
    workers: dict[str, list[str]] = defaultdict(list)
    cached: dict[str, list[int]] = defaultdict(list)
    prompt_total = cached_total = 0
    with httpx.Client(base_url=gateway, timeout=60) as client:
        for _turn in range(TURNS):
            for key, history in histories.items():
                history += rng.integers(0, 500, TURN_TOKENS).tolist()
                response = client.post(
                    "/generate",
                    headers={"X-SMG-Routing-Key": key},
                    json={
                        "input_ids": history,
                        "sampling_params": {"max_new_tokens": OUTPUT_TOKENS, "ignore_eos": True},
                    },
                )
                assert response.status_code == 200, response.text
                meta = response.json()["meta_info"]
                history += response.json()["output_ids"]
                workers[key].append(response.headers["x-smg-routed-worker-id"])
                cached[key].append(meta["cached_tokens"])
                prompt_total += meta["prompt_tokens"]
                cached_total += meta["cached_tokens"]
    return workers, cached, cached_total / prompt_total


def _gateway(engines: tuple[Service, Service], logs: Path, policy: str) -> Service:
    return start_smg([e.url for e in engines], logs, policy=policy, name=f"smg-{policy}")


def test_routing_key_is_sticky_and_beats_round_robin(
    engines: tuple[Service, Service], tmp_path: Path
) -> None:
    _flush(engines)
    with running(_gateway(engines, tmp_path, "manual")) as (gateway,):
        workers, cached, manual_rate = _converse(gateway.url)
    for key in workers:
        assert len(set(workers[key])) == 1, f"{key} moved between engines: {workers[key]}"
        assert cached[key][0] == 0
        assert all(b > a for a, b in zip(cached[key], cached[key][1:], strict=False)), cached[key]

    _flush(engines)
    with running(_gateway(engines, tmp_path, "round_robin")) as (gateway,):
        workers, _, round_robin_rate = _converse(gateway.url)
    assert any(len(set(w)) > 1 for w in workers.values())

    print(
        f"\nprefix-cache hit rate: manual (sticky key) {manual_rate:.1%}, round_robin {round_robin_rate:.1%}"
    )
    assert manual_rate > round_robin_rate


def test_rl_fields_survive_the_gateway(engines: tuple[Service, Service], tmp_path: Path) -> None:
    with running(_gateway(engines, tmp_path, "manual")) as (gateway,):
        prompt = list(range(1, 30))
        body = {
            "input_ids": prompt,
            "rid": "rl-fields-1",
            "return_logprob": True,
            "return_prompt_token_ids": True,
            "return_routed_experts": True,
            "routed_experts_start_len": 10,
            "sampling_params": {"max_new_tokens": 5, "ignore_eos": True, "sampling_seed": 1},
        }
        response = httpx.post(
            gateway.url + "/generate", json=body, headers={"X-SMG-Routing-Key": "k"}, timeout=30
        )
        assert response.status_code == 200, response.text
        data = response.json()
        meta = data["meta_info"]
        assert data["prompt_token_ids"] == prompt and meta["id"] == "rl-fields-1"
        assert len(meta["output_token_logprobs"]) == 5
        routing = decode_routed_experts(meta["routed_experts"], 4, 2)
        assert routing.shape == (len(prompt) + 5 - 1 - 10, 4, 2)
        bad = httpx.post(gateway.url + "/generate", json={"input_ids": [1, 10**6]}, timeout=30)
        assert bad.status_code == 400 and "input_ids" in bad.text
