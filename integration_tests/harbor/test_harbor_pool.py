"""HarborPool on a local two-node Ray cluster: placement on both nodes, one start-rate limit for the
pool, replicas on asyncio's loop, and a replica killed mid-step whose attempts fail in transport
(masked as infra) while the rest complete; the pool's watchdog replaces it on the same URL, no
orphan sandbox process outlives it, and the next attempts routed to it are graded."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rl360_ext.local.fixtures import tasks_root

pytestmark = [pytest.mark.integration, pytest.mark.slow]

START_INTERVAL_S = 1.5
CLOCK_TOLERANCE_S = 0.01  # time.time() read in two processes on one host
TASK = "slow-sum"  # the oracle waits a second before solving: attempts overlap
WATCHDOG_S = 1.0
REPLACED_WITHIN_S = 90.0


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


replaced_urls: list[tuple[str, str]] = []


def _children(pid: int) -> dict[int, int]:
    """ppid of every live process, by pid."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            fields = text[text.rindex(")") + 2 :].split()
            if fields[0] != "Z":
                parents[int(stat.parent.name)] = int(fields[1])
    return parents


def _descendants(pid: int) -> set[int]:
    parents = _children(pid)
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pids: set[int]) -> set[int]:
    return pids & set(_children(0))


@pytest.fixture(scope="module")
def pool(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from rl360_ext.harbor.pool import HarborPool
    from rl360_ext.harbor.settings import HarborServerConfig

    settings = HarborServerConfig(
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
        on_replace=lambda old, new: replaced_urls.append((old, new)),
    )
    harbor_pool.start_watchdog(WATCHDOG_S)
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
    # Ray would run an async actor on uvloop; Harbor's replicas run on asyncio's own loop
    assert all(replica.loop.startswith("asyncio") for replica in pool.replicas), pool.replicas


def test_the_start_rate_limit_holds_across_the_pool(pool: Any) -> None:
    before = pool.starts_taken()

    async def step() -> list[Any]:
        return await asyncio.gather(*(_run(url) for url in pool.urls for _ in range(2)))

    results = asyncio.run(step())
    assert all(isinstance(r, dict) for r in results), results
    assert [r["reward"] for r in results] == [1.0] * 4, results
    assert pool.starts_taken() - before == 4
    # One limit for the pool: the slots it granted are an interval apart, wherever they ran (the
    # limiter's own clock, so a busy machine cannot shift them), and no sandbox started before its
    # slot (how much later it started is the host's start-up delay, which a loaded machine widens).
    slots = sorted(r["timeline"]["start_slot_at"] for r in results)
    gaps = [b - a for a, b in itertools.pairwise(slots)]
    assert min(gaps) >= START_INTERVAL_S - CLOCK_TOLERANCE_S, gaps
    for r in results:
        assert r["timeline"]["sandbox_started_at"] >= r["timeline"]["start_slot_at"] - CLOCK_TOLERANCE_S, r


def test_a_killed_replica_masks_its_attempts_as_infra_and_the_watchdog_replaces_it(pool: Any) -> None:
    import ray

    from rl360_ext.rollout import agent
    from rl360_ext.rollout.config import AgentConfig
    from rl360_ext.rollout.harbor_routing import replace_url

    pool.on_replace = lambda old, new: (replaced_urls.append((old, new)), replace_url(old, new))
    victim, survivor = pool.replicas
    config = AgentConfig(harbor_url=",".join(pool.urls), deadline_s=300.0)
    router = agent.harbor_router(config)
    groups = [f"image-{i}" for i in range(64)]
    on_victim = [g for g in groups if router.pinned(g) == victim.url][:2]
    on_survivor = [g for g in groups if router.pinned(g) == survivor.url][:2]
    sandboxes: set[int] = set()

    async def attempt(group: str) -> dict[str, Any]:
        metadata = {"task": TASK, "image_group": group}
        result = await agent.run("http://127.0.0.1:9/sessions/s", None, {}, metadata, rl360_config=config)
        assert result is not None
        return result

    async def step() -> tuple[list[Any], list[Any]]:
        lost = [asyncio.create_task(attempt(g)) for g in on_victim]
        kept = [asyncio.create_task(attempt(g)) for g in on_survivor]
        await asyncio.sleep(1.0)  # both replicas have attempts in flight
        deadline = time.monotonic() + 10.0  # and the victim has a sandbox up (starts are paced)
        while not sandboxes and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            sandboxes.update(_descendants(victim.pid))
        ray.kill(victim.actor)
        return await asyncio.gather(*lost), await asyncio.gather(*kept)

    lost, kept = asyncio.run(step())
    assert [(r["attempt_class"], r["reward"]) for r in lost] == [("infra:sandbox_lost", None)] * 2, lost
    assert [(r["attempt_class"], r["reward"]) for r in kept] == [("valid", 1.0)] * 2, kept
    # the killed replica's sandboxes (bwrap --die-with-parent, PID 1 of their namespace) die with it
    assert sandboxes, "the victim had no sandbox processes in flight"
    deadline = time.monotonic() + 15.0
    while _alive(sandboxes) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(sandboxes), _alive(sandboxes)

    # no hand call: the watchdog replaces it, on its node and port
    deadline = time.monotonic() + REPLACED_WITHIN_S
    while pool.replicas[0].generation == 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    replacement = pool.replicas[0]
    assert replacement.generation == 1 and len(pool.replacements) == 1
    assert (replacement.url, replacement.node_id) == (victim.url, victim.node_id)
    assert replacement.pid != victim.pid and pool.replicas[1].url == survivor.url
    assert replaced_urls[-1] == (victim.url, victim.url)

    # the next attempts pinned to it go to the replacement (its URL is live again) and are graded
    async def next_step() -> list[Any]:
        return await asyncio.gather(*(attempt(g) for g in on_victim))

    again = asyncio.run(next_step())
    assert [(r["attempt_class"], r["reward"]) for r in again] == [("valid", 1.0)] * 2, again
    # the slot's count spans generations: what the dead one served, plus the replacement's two
    assert pool.stats()[0]["attempts"] == replacement.served_before + 2
