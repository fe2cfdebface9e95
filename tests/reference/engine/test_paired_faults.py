"""Engine faults keyed by the attempt's sampling seed: the same attempts fail in every A/B arm."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.local.demo.plan import DemoConfig, attempt_sampling_seed, plan_step
from rl360_ext.local.demo.stack import demo_stack_config
from rl360_ext.local.stack import LocalStack
from rl360_ext.reference.engine.errors import FaultConfigError
from rl360_ext.reference.engine.faults import FaultConfig, FaultDraw, FaultInjector, FaultKey

KEYED = FaultConfig(error_rate=0.3, abort_rate=0.2, seed=7, draw_by=FaultKey.SAMPLING_SEED)


def _arm_draws(order: list[int | None], config: FaultConfig = KEYED) -> dict[int, FaultDraw]:
    """One arm: an engine answering requests in `order` (None: a request without a sampling seed)."""
    injector = FaultInjector(config)
    draws: dict[int, FaultDraw] = {}
    for seed in order:
        draw = injector.draw(16, seed)
        if seed is not None:
            assert draws.setdefault(seed, draw) == draw  # every turn of one attempt draws the same
    return draws


@settings(max_examples=50, deadline=None)
@given(
    seeds=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=30, unique=True),
    shuffle=st.randoms(use_true_random=False),
    extra=st.integers(0, 10),
)
def test_keyed_draws_do_not_depend_on_arrival_order_or_other_traffic(
    seeds: list[int], shuffle: random.Random, extra: int
) -> None:
    first = [s for s in seeds for _ in range(2)]  # two turns per attempt
    second = [*first, *[None] * extra]
    shuffle.shuffle(second)
    assert _arm_draws(first) == _arm_draws(second)


def test_request_order_draws_are_not_paired_and_stay_the_default() -> None:
    assert FaultConfig().draw_by == FaultKey.REQUEST
    unkeyed = FaultConfig(error_rate=0.3, abort_rate=0.2, seed=7)
    seeds = list(range(200))
    forward, backward = FaultInjector(unkeyed), FaultInjector(unkeyed)
    ahead = {s: forward.draw(16, s) for s in seeds}
    behind = {s: backward.draw(16, s) for s in reversed(seeds)}
    assert ahead != behind  # today's behaviour: which request fails follows the arrival order


def test_unseeded_requests_fall_back_to_the_stream() -> None:
    keyed, stream = FaultInjector(KEYED), FaultInjector(FaultConfig(error_rate=0.3, abort_rate=0.2, seed=7))
    assert [keyed.draw(16) for _ in range(50)] == [stream.draw(16) for _ in range(50)]


def test_keyed_rates_are_the_configured_fractions_of_attempts() -> None:
    draws = _arm_draws(list(range(4000)))
    refused = sum(d.unavailable for d in draws.values()) / len(draws)
    aborted = sum(d.abort_after is not None for d in draws.values()) / len(draws)
    assert 0.27 < refused < 0.33 and 0.12 < aborted < 0.16  # abort only where not refused: 0.7 * 0.2
    other = _arm_draws(list(range(4000)), FaultConfig(error_rate=0.3, seed=8, draw_by="sampling_seed"))
    assert {s for s, d in draws.items() if d.unavailable} != {s for s, d in other.items() if d.unavailable}


def test_every_arm_of_the_demo_loses_the_same_attempts_to_engine_503s() -> None:
    config = DemoConfig(out=Path("unused"), faults=0.4, seeded_sampling=True, tasks=4, attempts=4)
    body = demo_stack_config(config).engine_faults
    assert body is not None and body["draw_by"] == "sampling_seed"
    arms = []
    for arm in range(3):
        injector = FaultInjector(FaultConfig.from_dict(dict(body)))
        attempts = [a for step in range(3) for g in plan_step(step, config, ["q1", "q2", "q3"]) for a in g]
        random.Random(arm).shuffle(attempts)  # each arm's requests reach the engine in its own order
        arms.append(
            {
                a.index
                for a in attempts
                if injector.draw(16, attempt_sampling_seed(config.seed, a.index)).unavailable
            }
        )
    assert arms[0] == arms[1] == arms[2] and arms[0]
    unseeded = demo_stack_config(DemoConfig(out=Path("unused"), faults=0.4)).engine_faults
    assert unseeded is not None and "draw_by" not in unseeded  # the plain demo keeps request-order draws


def test_keyed_faults_reach_every_engine_with_the_same_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    posted: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(
        "rl360_ext.local.stack.httpx.post",
        lambda url, json, timeout: (
            posted.append((url, json)) or SimpleNamespace(raise_for_status=lambda: None)
        ),
    )
    engines = [SimpleNamespace(alive=lambda: True, url=f"http://engine-{n}") for n in range(3)]
    stack = LocalStack(out=Path("o"), logs=Path("l"), tokenizer_dir=Path("t"), tasks_root=Path("r"))
    stack.engines = engines  # type: ignore[assignment]
    stack.set_engine_faults({"error_rate": 0.1, "seed": 5, "draw_by": "sampling_seed"})
    assert [body["seed"] for _, body in posted] == [5, 5, 5]
    posted.clear()
    stack.set_engine_faults({"error_rate": 0.1, "seed": 5})
    assert [body["seed"] for _, body in posted] == [5, 6, 7]  # independent streams, as before


def test_draw_by_is_validated_and_round_trips() -> None:
    assert FaultConfig.parse_flag("error_rate=0.1,draw_by=sampling_seed").draw_by == FaultKey.SAMPLING_SEED
    assert FaultConfig.from_dict(KEYED.to_dict()) == KEYED and KEYED.to_dict()["draw_by"] == "sampling_seed"
    with pytest.raises(FaultConfigError) as err:
        FaultConfig.parse_flag("draw_by=arrival")
    assert err.value.field == "draw_by"


def test_the_engine_keys_its_503s_by_the_requests_sampling_seed(client: TestClient) -> None:
    assert (
        client.post(
            "/rl360/faults", json={"error_rate": 0.5, "seed": 1, "draw_by": "sampling_seed"}
        ).status_code
        == 200
    )
    outcomes: dict[int, list[int]] = {}
    for _ in range(2):
        for seed in range(12):
            body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2, "sampling_seed": seed}}
            outcomes.setdefault(seed, []).append(client.post("/generate", json=body).status_code)
    assert all(len(set(codes)) == 1 for codes in outcomes.values())
    assert {codes[0] for codes in outcomes.values()} == {200, 503}
    assert client.get("/rl360/faults").json()["draw_by"] == "sampling_seed"
    bad = client.post("/rl360/faults", json={"draw_by": "arrival"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "draw_by"
