"""A pool of Harbor /run servers as Ray actors, under one sandbox start-rate limit for the pool.

Owns three things:
- `StartSlots` and its Ray actor: the pool-wide rolling-start limit. Every replica asks it for a
  start slot right before Harbor starts a sandbox, so at most `size` sandboxes start in any
  `interval_s` window across the whole pool (not `size` per replica). One actor call per start;
  the actor never waits, it hands out the delay until the caller's slot.
- `HarborReplica`: one Harbor /run server (the same FastAPI app and `TrialRunner` as
  `rl360 harbor serve`) inside a Ray actor, serving HTTP on its node. A replica dies with its
  actor: its in-flight HTTP calls break, and the client classifies them as infrastructure failures.
  Its uvicorn runs on asyncio's own loop (`HARBOR_EVENT_LOOP`), as `rl360 harbor serve` does: Ray
  would run an async actor on uvloop, which makes sandbox subprocess work slower, so the actor's
  runtime env sets `RAY_USE_UVLOOP=0`.
- `HarborPool`: N replicas placed SPREAD, or one per node by image group (`placement="image_groups"`:
  replica i on node i mod nodes, so the client's image-group pinning is node pinning), a health
  check that replaces a replica whose actor died, a watchdog thread that runs that check every few
  seconds (no human calls it), and shutdown. A replacement asks for the dead replica's node and
  binds its port again, so the URL the clients hold stays valid; when that port or node is not to be
  had it binds a new port. Either way the pool's `on_replace(old_url, new_url)` callback tells the
  clients (`rl360_ext.rollout.harbor_routing.replace_url`: swap the URL, or mark it live again).
It does not route attempts (the client does: `rl360_ext.rollout.harbor_routing`) or run trials
(`runner.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from rl360_ext.harbor.settings import HarborServerConfig

logger = logging.getLogger(__name__)

PLACEMENTS = ("spread", "image_groups")
HEALTH_TIMEOUT_S = 10.0
START_TIMEOUT_S = 120.0
WATCHDOG_INTERVAL_S = 2.0
# Ray runs an async actor's methods on uvloop when it is installed; Harbor's sandbox work is faster
# on asyncio's own loop (see `rl360_ext.harbor.app.HARBOR_EVENT_LOOP`).
REPLICA_RUNTIME_ENV = {"env_vars": {"RAY_USE_UVLOOP": "0"}}
DEAD = object()  # what `HarborPool._ask` answers for a replica whose actor died


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

    def take(self) -> tuple[float, float]:
        """(seconds until the booked slot, the slot's time in unix seconds), both read here, so
        the slot's time does not carry the caller's wait for this answer."""
        delay = self.slots.take()
        return delay, time.time() + delay

    def taken(self) -> int:
        return self.slots.taken


class SharedStartGate:
    """A replica's start gate that waits for a slot from the pool's `StartSlotsActor`.

    Same interface as `admission.StartGate` (`wait_turn`, `on_start`), so `TrialRunner` takes either.
    """

    def __init__(self, slots_actor: Any) -> None:
        self.slots_actor = slots_actor
        self.on_start: Callable[[], None] | None = None

    async def wait_turn(self) -> float:
        delay, slot_at = await self.slots_actor.take.remote()
        if delay > 0:
            await asyncio.sleep(delay)
        if self.on_start is not None:
            self.on_start()
        return slot_at


class HarborReplica:
    """One Harbor /run server inside a Ray actor: uvicorn on the actor's event loop."""

    def __init__(
        self,
        settings: HarborServerConfig,
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

    async def start(self) -> dict[str, Any]:
        """Serve /run on this node; returns the replica's URL, Ray node id, pid and event loop.

        The replica binds `port` itself (0: any free port); when that port is taken it binds a free
        one instead (uvicorn would exit the actor's process on a failed bind)."""
        import ray
        import uvicorn

        from rl360_ext.harbor.app import uvicorn_config
        from rl360_ext.harbor.runner import TrialRunner

        logging.getLogger("harbor").setLevel(logging.WARNING)
        # LiteLLM (terminus-2) otherwise fetches its model price map from the internet in every process.
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        gate = SharedStartGate(self.slots_actor) if self.slots_actor is not None else None
        self.runner = TrialRunner(self.settings, start_gate=gate)
        host = self.host or ray.util.get_node_ip_address()
        sock = bind_socket(host, self.port)
        config = uvicorn_config(self.runner, self.token, log_level="warning", access_log=False)
        self._server = uvicorn.Server(config)
        self._server.install_signal_handlers = lambda: None  # the actor's process owns its signals
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError(f"Harbor replica on {host}:{self.port} stopped while starting")
            await asyncio.sleep(0.02)
        port = sock.getsockname()[1]
        return {
            "url": f"http://{host}:{port}",
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "loop": type(asyncio.get_running_loop()).__module__,
        }

    async def health(self) -> dict[str, Any]:
        return self.runner.health()

    async def stats(self) -> dict[str, int]:
        """Attempts this replica finished and sandbox starts it admitted, since it started."""
        finished = starts = 0.0
        for family in self.runner.metrics.registry.collect():
            for sample in family.samples:
                if sample.name == "rl360_harbor_attempts_total":
                    finished += sample.value
                elif sample.name == "rl360_harbor_sandbox_starts_total":
                    starts += sample.value
        return {"attempts": int(finished), "sandbox_starts": int(starts)}

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            await self._task


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (SO_REUSEADDR: a dead replica's port is free at once);
    on a port that is taken, a free port on host instead."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for candidate in dict.fromkeys((port, 0)):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, candidate))
        except OSError:
            sock.close()
            if candidate == 0:
                raise
            continue
        sock.listen(2048)
        sock.set_inheritable(False)
        return sock
    raise AssertionError("unreachable")


@dataclass
class Replica:
    """One slot of the pool: its actor, URL, node and pid, and how many times it was replaced."""

    index: int
    actor: Any
    url: str
    node_id: str
    generation: int = 0
    pid: int = 0
    loop: str = ""
    served_before: int = 0
    """Attempts the slot's earlier (dead) generations finished, as last read from them."""
    served_last: int = 0
    """Attempts this generation had finished when last read (`stats`, `replace_dead`)."""

    @property
    def served(self) -> int:
        """Attempts this slot finished over all its generations (as last read)."""
        return self.served_before + self.served_last


class HarborPool:
    """N Harbor /run servers as Ray actors sharing one start-rate limit. Methods block (driver side).

    `settings` is what every replica serves (each gets its own `trials_dir/replica-<i>`);
    `start_rate` is the pool-wide `(size, interval_s)` rolling-start limit (None: unlimited; then
    `settings.rolling_start_size` would apply per replica, which is why the pool clears it).
    `on_replace(old_url, new_url)` is called (from the watchdog thread, or `replace_dead`'s caller)
    for every replacement, with the URL it serves on (mostly its predecessor's).
    """

    def __init__(
        self,
        settings: HarborServerConfig,
        replicas: int = 2,
        *,
        placement: str = "spread",
        start_rate: tuple[int, float] | None = None,
        host: str | None = None,
        token: str | None = None,
        actor_num_cpus: float = 1.0,
        on_replace: Callable[[str, str], None] | None = None,
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
        self.on_replace = on_replace
        self.slots_actor = (
            ray.remote(StartSlotsActor).options(num_cpus=0).remote(*start_rate) if start_rate else None
        )
        self.replicas: list[Replica] = []
        self.replacements: list[dict[str, Any]] = []
        self._lock = threading.RLock()
        self._watchdog: threading.Thread | None = None
        self._stop = threading.Event()
        launched: list[tuple[Any, Any]] = []
        try:
            for index in range(replicas):  # the replicas start in parallel
                launched.append(self._launch(index))
            for index, (actor, ref) in enumerate(launched):
                self.replicas.append(self._started(index, actor, ref))
        except BaseException:
            for actor, _ in launched[len(self.replicas) :]:
                with contextlib.suppress(Exception):
                    ray.kill(actor)
            self.shutdown()
            raise

    # -- placement and start --------------------------------------------------------------------

    def _strategy(self, index: int, node_id: str | None = None) -> Any:
        if self.placement == "spread" and node_id is None:
            return "SPREAD"
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if node_id is None:
            nodes = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))
            node_id = nodes[index % len(nodes)]
        return NodeAffinitySchedulingStrategy(node_id=node_id, soft=True)

    def _launch(self, index: int, port: int = 0, node_id: str | None = None) -> tuple[Any, Any]:
        import ray

        settings = replace(self.settings, trials_dir=self.settings.trials_dir / f"replica-{index}")
        actor = (
            ray.remote(HarborReplica)
            .options(
                scheduling_strategy=self._strategy(index, node_id),
                num_cpus=self.actor_num_cpus,
                runtime_env=REPLICA_RUNTIME_ENV,
            )
            .remote(settings, self.host, port, self.token, self.slots_actor)
        )
        return actor, actor.start.remote()

    def _started(self, index: int, actor: Any, ref: Any, generation: int = 0) -> Replica:
        import ray

        try:
            started = ray.get(ref, timeout=START_TIMEOUT_S)
        except BaseException:
            ray.kill(actor)
            raise
        return Replica(
            index, actor, started["url"], started["node_id"], generation, started["pid"], started["loop"]
        )

    # -- inspection and repair ------------------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        return [replica.url for replica in self.replicas]

    def health(self) -> list[dict[str, Any] | None]:
        """Each replica's /health body, or None for a replica that did not answer in time or died."""
        return [None if body is DEAD else body for body in self._ask("health")]

    def stats(self) -> list[dict[str, Any]]:
        """Per replica slot: index, URL, node, pid, generation, attempts served (all generations, as
        last read) and whether it answered now."""
        with self._lock:
            answers = self._ask("stats")
            rows = []
            for replica, body in zip(self.replicas, answers, strict=True):
                if isinstance(body, dict):
                    replica.served_last = body["attempts"]
                rows.append(
                    {
                        "index": replica.index,
                        "url": replica.url,
                        "node_id": replica.node_id,
                        "pid": replica.pid,
                        "generation": replica.generation,
                        "attempts": replica.served,
                        "alive": isinstance(body, dict),
                    }
                )
            return rows

    def _ask(self, method: str) -> list[Any]:
        """Each replica's answer to `method`; None for one that did not answer in time, `DEAD` for
        one whose actor died."""
        import ray

        refs = [getattr(replica.actor, method).remote() for replica in self.replicas]
        results: list[Any] = []
        for ref in refs:
            try:
                results.append(ray.get(ref, timeout=HEALTH_TIMEOUT_S))
            except ray.exceptions.RayActorError:
                results.append(DEAD)
            except (ray.exceptions.RayError, TimeoutError):
                results.append(None)
        return results

    def replace_dead(self) -> list[int]:
        """Start a new replica in place of each one whose actor died (a slow one is left alone);
        returns their indices.

        The replacement asks for the dead replica's node and port, so its URL is mostly the same;
        either way `on_replace(old_url, new_url)` is called (clients swap the URL, or mark it live)."""
        import ray

        with self._lock:
            replaced = []
            for position, (replica, body) in enumerate(zip(self.replicas, self._ask("stats"), strict=True)):
                if isinstance(body, dict):
                    replica.served_last = body["attempts"]
                if body is not DEAD:
                    continue
                with contextlib.suppress(Exception):
                    ray.kill(replica.actor)
                port = int(replica.url.rsplit(":", 1)[1])
                actor, ref = self._launch(replica.index, port, replica.node_id)
                new = self._started(replica.index, actor, ref, replica.generation + 1)
                new.served_before = replica.served
                self.replicas[position] = new
                replaced.append(replica.index)
                self.replacements.append(
                    {
                        "index": replica.index,
                        "generation": new.generation,
                        "old_url": replica.url,
                        "url": new.url,
                    }
                )
                logger.warning(
                    "rl360 harbor pool: replica %d (%s) died; replaced by generation %d at %s",
                    replica.index, replica.url, new.generation, new.url,
                )  # fmt: skip
                if self.on_replace is not None:
                    self.on_replace(replica.url, new.url)
            return replaced

    # -- the watchdog ---------------------------------------------------------------------------

    def start_watchdog(self, interval_s: float = WATCHDOG_INTERVAL_S) -> None:
        """Run `replace_dead` every `interval_s` seconds on a driver thread until `shutdown`."""
        if interval_s <= 0:
            raise ValueError(f"watchdog interval must be positive, got {interval_s}")
        if self._watchdog is not None:
            return
        self._stop.clear()
        self._watchdog = threading.Thread(
            target=self._watch, args=(interval_s,), name="rl360-harbor-watchdog", daemon=True
        )
        self._watchdog.start()

    def _watch(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.replace_dead()
            except Exception:  # a failed replacement is retried on the next tick
                logger.exception("rl360 harbor pool: replacing a dead replica failed; retrying")

    def starts_taken(self) -> int | None:
        """Sandbox starts the pool-wide limiter has handed out (None without a limit)."""
        import ray

        return None if self.slots_actor is None else ray.get(self.slots_actor.taken.remote())

    def shutdown(self) -> None:
        """Stop the watchdog, then every replica (their in-flight trials are cancelled), and release
        the actors."""
        import ray

        self._stop.set()
        if self._watchdog is not None:
            self._watchdog.join(timeout=HEALTH_TIMEOUT_S * 2 + START_TIMEOUT_S)
            self._watchdog = None
        with self._lock:
            stops = []
            for replica in self.replicas:  # every replica drains at once
                with contextlib.suppress(ray.exceptions.RayError):
                    stops.append(replica.actor.stop.remote())
            with contextlib.suppress(ray.exceptions.RayError, TimeoutError):
                ray.get(stops, timeout=60)
            for replica in self.replicas:
                ray.kill(replica.actor)
            self.replicas = []
            if self.slots_actor is not None:
                ray.kill(self.slots_actor)
                self.slots_actor = None
