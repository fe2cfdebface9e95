"""HarborPool on a local two-node Ray cluster: placement on both nodes, one start-rate limit for the
pool, and a replica killed mid-step whose attempts fail in transport while the rest complete."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from rl360_ext.local.fixtures import tasks_root

pytestmark = [pytest.mark.integration, pytest.mark.slow]

START_INTERVAL_S = 1.5
TASK = "slow-sum"  # the oracle waits a second before solving: attempts overlap


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    local = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "include_dashboard": False},
    )
    local.add_node(num_cpus=2)
    local.wait_for_nodes()
    ray.init(address=local.address, log_to_driver=False)
    try:
        yield local
    finally:
        ray.shutdown()
        local.shutdown()


@pytest.fixture(scope="module")
def pool(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from rl360_ext.harbor.pool import HarborPool
    from rl360_ext.harbor.settings import ServerSettings

    settings = ServerSettings(
        tasks_root=tasks_root(),
        trials_dir=tmp_path_factory.mktemp("harbor-pool"),
        env="bwrap",
        default_agent="oracle",
        max_concurrent=4,
        keep_trials="none",
    )
    harbor_pool = HarborPool(
        settings,
        replicas=2,
        placement="image_groups",
        start_rate=(1, START_INTERVAL_S),
        host="127.0.0.1",
        actor_num_cpus=0.5,
    )
    try:
        yield harbor_pool
    finally:
        harbor_pool.shutdown()


async def _run(url: str, task: str = TASK) -> dict[str, Any] | BaseException:
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(330.0, connect=10.0)) as http:
            response = await http.post(url + "/run", json={"task": task, "deadline_s": 300.0})
            response.raise_for_status()
            return response.json()
    except httpx.HTTPError as exc:
        return exc


def test_replicas_land_on_both_nodes(pool: Any) -> None:
    assert len({replica.node_id for replica in pool.replicas}) == 2
    assert all(body is not None and body["status"] == "ok" for body in pool.health())


def test_the_start_rate_limit_holds_across_the_pool(pool: Any) -> None:
    before = pool.starts_taken()

    async def step() -> list[Any]:
        return await asyncio.gather(*(_run(url) for url in pool.urls for _ in range(2)))

    results = asyncio.run(step())
    assert all(isinstance(r, dict) for r in results), results
    assert [r["reward"] for r in results] == [1.0] * 4, results
    assert pool.starts_taken() - before == 4
    starts = sorted(r["timeline"]["sandbox_started_at"] for r in results)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # One limit for the pool: consecutive sandbox starts are an interval apart, wherever they ran.
    assert min(gaps) >= START_INTERVAL_S - 0.25, gaps


def test_a_killed_replica_masks_its_attempts_as_infra_and_is_replaced(pool: Any) -> None:
    import ray

    from rl360_ext.rollout import agent
    from rl360_ext.rollout.config import AgentConfig

    victim, survivor = pool.replicas
    config = AgentConfig(harbor_url=",".join(pool.urls), deadline_s=300.0)
    router = agent.harbor_router(config)
    groups = [f"image-{i}" for i in range(64)]
    on_victim = [g for g in groups if router.pinned(g) == victim.url][:2]
    on_survivor = [g for g in groups if router.pinned(g) == survivor.url][:2]

    async def attempt(group: str) -> dict[str, Any]:
        metadata = {"task": TASK, "image_group": group}
        result = await agent.run("http://127.0.0.1:9/sessions/s", None, {}, metadata, rl360_config=config)
        assert result is not None
        return result

    async def step() -> tuple[list[Any], list[Any]]:
        lost = [asyncio.create_task(attempt(g)) for g in on_victim]
        kept = [asyncio.create_task(attempt(g)) for g in on_survivor]
        await asyncio.sleep(1.0)  # both replicas have attempts in flight
        ray.kill(victim.actor)
        return await asyncio.gather(*lost), await asyncio.gather(*kept)

    lost, kept = asyncio.run(step())
    assert [(r["attempt_class"], r["reward"]) for r in lost] == [("infra:sandbox_lost", None)] * 2, lost
    assert [(r["attempt_class"], r["reward"]) for r in kept] == [("valid", 1.0)] * 2, kept
    assert pool.replace_dead() == [victim.index]
    assert pool.replicas[1].url == survivor.url
    replacement = pool.replicas[0]
    assert replacement.generation == 1
    again = asyncio.run(_run(replacement.url))
    assert isinstance(again, dict) and again["reward"] == 1.0, again
