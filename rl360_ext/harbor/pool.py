"""A pool of Harbor /run servers as Ray actors, under one sandbox start-rate limit for the pool.

Owns three things:
- `StartSlots` and its Ray actor: the pool-wide rolling-start limit. Every replica asks it for a
  start slot right before Harbor starts a sandbox, so at most `size` sandboxes start in any
  `interval_s` window across the whole pool (not `size` per replica). One actor call per start;
  the actor never waits, it hands out the delay until the caller's slot.
- `HarborReplica`: one Harbor /run server (the same FastAPI app and `TrialRunner` as
  `rl360 harbor serve`) inside a Ray actor, serving HTTP on its node. A replica dies with its
  actor: its in-flight HTTP calls break, and the client classifies them as infrastructure failures.
- `HarborPool`: N replicas placed SPREAD, or one per node by image group (`placement="image_groups"`:
  replica i on node i mod nodes, so the client's image-group pinning is node pinning), a health
  check that replaces a replica whose actor died, and shutdown.
It does not route attempts (the client does: `rl360_ext.rollout.harbor_routing`) or run trials
(`runner.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from rl360_ext.harbor.settings import ServerSettings

PLACEMENTS = ("spread", "image_groups")
HEALTH_TIMEOUT_S = 10.0


class StartSlots:
    """Start slots under a sliding-window limit: at most `size` slots in any `interval_s` window.

    `take()` books the earliest slot that keeps the limit and returns the delay until it. Slots are
    handed out in call order and never move, so a caller that sleeps its delay starts in its slot.
    """

    def __init__(self, size: int, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if size < 1:
            raise ValueError(f"start-rate size must be >= 1, got {size}")
        if not math.isfinite(interval_s) or interval_s <= 0:
            raise ValueError(f"start-rate interval must be a positive number of seconds, got {interval_s}")
        self.size = size
        self.interval_s = interval_s
        self._clock = clock
        self._recent: deque[float] = deque(maxlen=size)
        self.taken = 0

    def take(self) -> float:
        now = self._clock()
        slot = now
        if len(self._recent) == self.size:
            slot = max(now, self._recent[0] + self.interval_s)
        self._recent.append(slot)
        self.taken += 1
        return slot - now


class StartSlotsActor:
    """The Ray actor holding the pool's `StartSlots` (its methods run one at a time)."""

    def __init__(self, size: int, interval_s: float) -> None:
        self.slots = StartSlots(size, interval_s)

    def take(self) -> float:
        return self.slots.take()

    def taken(self) -> int:
        return self.slots.taken


class SharedStartGate:
    """A replica's start gate that waits for a slot from the pool's `StartSlotsActor`.

    Same interface as `admission.StartGate` (`wait_turn`, `on_start`), so `TrialRunner` takes either.
    """

    def __init__(self, slots_actor: Any) -> None:
        self.slots_actor = slots_actor
        self.on_start: Callable[[], None] | None = None

    async def wait_turn(self) -> None:
        delay = await self.slots_actor.take.remote()
        if delay > 0:
            await asyncio.sleep(delay)
        if self.on_start is not None:
            self.on_start()


class HarborReplica:
    """One Harbor /run server inside a Ray actor: uvicorn on the actor's event loop."""

    def __init__(
        self,
        settings: ServerSettings,
        host: str | None,
        port: int,
        token: str | None,
        slots_actor: Any | None,
    ) -> None:
        self.settings = settings
        self.host = host
        self.port = port
        self.token = token
        self.slots_actor = slots_actor
        self.runner: Any = None
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> dict[str, str]:
        """Serve /run on this node; returns the replica's URL and Ray node id."""
        import ray
        import uvicorn

        from rl360_ext.harbor.app import create_app
        from rl360_ext.harbor.runner import TrialRunner

        gate = SharedStartGate(self.slots_actor) if self.slots_actor is not None else None
        self.runner = TrialRunner(self.settings, start_gate=gate)
        host = self.host or ray.util.get_node_ip_address()
        config = uvicorn.Config(
            create_app(self.runner, self.token),
            host=host,
            port=self.port,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(config)
        self._server.install_signal_handlers = lambda: None  # the actor's process owns its signals
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError(f"Harbor replica on {host}:{self.port} stopped while starting")
            await asyncio.sleep(0.02)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        return {"url": f"http://{host}:{port}", "node_id": ray.get_runtime_context().get_node_id()}

    async def health(self) -> dict[str, Any]:
        return self.runner.health()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            await self._task


@dataclass
class Replica:
    """One slot of the pool: its actor, URL and node, and how many times it was replaced."""

    index: int
    actor: Any
    url: str
    node_id: str
    generation: int = 0


class HarborPool:
    """N Harbor /run servers as Ray actors sharing one start-rate limit. Methods block (driver side).

    `settings` is what every replica serves (each gets its own `trials_dir/replica-<i>`);
    `start_rate` is the pool-wide `(size, interval_s)` rolling-start limit (None: unlimited; then
    `settings.rolling_start_size` would apply per replica, which is why the pool clears it).
    """

    def __init__(
        self,
        settings: ServerSettings,
        replicas: int = 2,
        *,
        placement: str = "spread",
        start_rate: tuple[int, float] | None = None,
        host: str | None = None,
        token: str | None = None,
        actor_num_cpus: float = 1.0,
    ) -> None:
        import ray

        if replicas < 1:
            raise ValueError(f"a Harbor pool needs at least one replica, got {replicas}")
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
        if not ray.is_initialized():
            ray.init()
        self.settings = replace(settings, rolling_start_size=None)
        self.placement = placement
        self.host = host
        self.token = token
        self.actor_num_cpus = actor_num_cpus
        self.slots_actor = (
            ray.remote(StartSlotsActor).options(num_cpus=0).remote(*start_rate) if start_rate else None
        )
        self.replicas: list[Replica] = []
        self.replaced = 0
        try:
            self.replicas = [self._start(index) for index in range(replicas)]
        except BaseException:
            self.shutdown()
            raise

    # -- placement and start --------------------------------------------------------------------

    def _strategy(self, index: int) -> Any:
        if self.placement == "spread":
            return "SPREAD"
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))
        return NodeAffinitySchedulingStrategy(node_id=nodes[index % len(nodes)], soft=True)

    def _start(self, index: int, generation: int = 0) -> Replica:
        import ray

        settings = replace(self.settings, trials_dir=self.settings.trials_dir / f"replica-{index}")
        actor = (
            ray.remote(HarborReplica)
            .options(scheduling_strategy=self._strategy(index), num_cpus=self.actor_num_cpus)
            .remote(settings, self.host, 0, self.token, self.slots_actor)
        )
        try:
            started = ray.get(actor.start.remote(), timeout=120)
        except BaseException:
            ray.kill(actor)
            raise
        return Replica(index, actor, started["url"], started["node_id"], generation)

    # -- inspection and repair ------------------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        return [replica.url for replica in self.replicas]

    def health(self) -> list[dict[str, Any] | None]:
        """Each replica's /health body, or None for a replica that did not answer in time."""
        import ray

        refs = [replica.actor.health.remote() for replica in self.replicas]
        results: list[dict[str, Any] | None] = []
        for ref in refs:
            try:
                results.append(ray.get(ref, timeout=HEALTH_TIMEOUT_S))
            except (ray.exceptions.RayError, TimeoutError):
                results.append(None)
        return results

    def replace_dead(self) -> list[int]:
        """Start a new replica in place of each one whose actor died; returns their indices."""
        import ray

        replaced = []
        for position, (replica, body) in enumerate(zip(self.replicas, self.health(), strict=True)):
            if body is not None:
                continue
            ray.kill(replica.actor)
            self.replicas[position] = self._start(replica.index, replica.generation + 1)
            replaced.append(replica.index)
        self.replaced += len(replaced)
        return replaced

    def starts_taken(self) -> int | None:
        """Sandbox starts the pool-wide limiter has handed out (None without a limit)."""
        import ray

        return None if self.slots_actor is None else ray.get(self.slots_actor.taken.remote())

    def shutdown(self) -> None:
        """Stop every replica (their in-flight trials are cancelled) and release the actors."""
        import ray

        for replica in self.replicas:
            with contextlib.suppress(ray.exceptions.RayError, TimeoutError):
                ray.get(replica.actor.stop.remote(), timeout=60)
            ray.kill(replica.actor)
        self.replicas = []
        if self.slots_actor is not None:
            ray.kill(self.slots_actor)
            self.slots_actor = None
