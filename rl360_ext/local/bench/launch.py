"""`rl360 bench launch`: a discrete-event simulation of 8,192 sandbox starts against an image registry.

Owns a small registry model and four launch strategies, so the effect of rolling-start waves
and image-group pinning can be seen without a cluster. It does not touch real sandboxes.

Model (all parameters printed with the results):
- `nodes` nodes in `pools` equal pools, `image_groups` images; each sandbox's task has one
  image group (uniformly drawn).
- Placement: random (any node) or pinned (a node of the image group's pool, by the same rendezvous hash
  the /run server uses, `rl360_ext.harbor.admission.ImagePinning`), where a node label names a
  pool of `nodes / pools` nodes and the sandbox lands on a random node of its pool.
- A start on a node that has the image is warm (`warm_start_s`). Otherwise the node pulls it
  once (later starts of the same image on that node wait for that pull) and then starts.
- The registry serves at most `registry_slots` pulls at once (FIFO queue beyond that), each
  taking `pull_s`. A pull fails with probability `base_fail + fail_slope * overload`, where
  overload = max(0, (pulls in flight + queued) / registry_slots - 1), capped at `max_fail`; a
  failed pull is noticed after `fail_after_s` and retried after an exponential backoff with
  jitter (`backoff_s` * 2^(attempt-1), capped at `max_backoff_s`).
- Launch: all at once at t=0, or rolling-start waves of `wave_size` starts per `wave_interval_s`.
Metrics per scenario: time until every sandbox is ready, median and p95 ready time, failed
pulls, pull attempts, images pulled (node, image pairs), cold and warm starts. The
all-at-once/random scenario is the baseline.
"""

from __future__ import annotations

import heapq
import json
import random
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from rl360_ext.harbor.admission import ImagePinning


@dataclass(frozen=True)
class LaunchModel:
    sandboxes: int = 8192
    nodes: int = 128
    pools: int = 32
    image_groups: int = 64
    registry_slots: int = 128
    pull_s: float = 30.0
    warm_start_s: float = 2.0
    base_fail: float = 0.01
    fail_slope: float = 0.05
    max_fail: float = 0.9
    fail_after_s: float = 15.0
    backoff_s: float = 5.0
    max_backoff_s: float = 120.0
    wave_size: int = 256
    wave_interval_s: float = 30.0
    seed: int = 0


@dataclass
class ScenarioResult:
    name: str
    launch: str
    placement: str
    all_ready_s: float
    p50_ready_s: float
    p95_ready_s: float
    failed_pulls: int
    pull_attempts: int
    images_pulled: int
    cold_starts: int
    warm_starts: int


@dataclass(order=True)
class _Event:
    time: float
    seq: int
    action: Callable[[], None] = field(compare=False)


class _Simulation:
    def __init__(self, model: LaunchModel, waves: bool, pinned: bool) -> None:
        self.model = model
        self.waves = waves
        self.rng = random.Random(model.seed)
        self.now = 0.0
        self._events: list[_Event] = []
        self._seq = 0
        self.active_pulls = 0
        self.pull_queue: deque[tuple[int, int, int]] = deque()  # (node, image, attempt)
        self.cache: dict[tuple[int, int], str] = {}
        self.waiting: dict[tuple[int, int], list[int]] = {}
        self.ready_at: list[float] = []
        self.failed_pulls = self.pull_attempts = self.images_pulled = self.cold = self.warm = 0
        images = [self.rng.randrange(model.image_groups) for _ in range(model.sandboxes)]
        pool_size = model.nodes // model.pools
        pinning = ImagePinning([f"pool-{i}" for i in range(model.pools)])
        pool_of_image = {
            i: int(pinning.node_for(f"image-{i}").removeprefix("pool-")) for i in range(model.image_groups)
        }
        self.placements = [
            (
                pool_of_image[image] * pool_size + self.rng.randrange(pool_size)
                if pinned
                else self.rng.randrange(model.nodes),
                image,
            )
            for image in images
        ]

    def at(self, time: float, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._events, _Event(time, self._seq, action))

    def run(self) -> None:
        model = self.model
        for index in range(model.sandboxes):
            start = (index // model.wave_size) * model.wave_interval_s if self.waves else 0.0
            self.at(start, lambda index=index: self.start(index))
        while self._events:
            event = heapq.heappop(self._events)
            self.now = event.time
            event.action()

    def start(self, index: int) -> None:
        node, image = self.placements[index]
        state = self.cache.get((node, image))
        if state == "ready":
            self.warm += 1
            self.at(self.now + self.model.warm_start_s, self.ready)
            return
        self.cold += 1
        self.waiting.setdefault((node, image), []).append(index)
        if state is None:
            self.images_pulled += 1
            self.cache[(node, image)] = "pulling"
            self.request_pull(node, image, attempt=1)

    def ready(self) -> None:
        self.ready_at.append(self.now)

    def request_pull(self, node: int, image: int, attempt: int) -> None:
        self.pull_queue.append((node, image, attempt))
        self.dispatch()

    def failure_probability(self) -> float:
        model = self.model
        overload = max(0.0, (self.active_pulls + len(self.pull_queue)) / model.registry_slots - 1.0)
        return min(model.max_fail, model.base_fail + model.fail_slope * overload)

    def dispatch(self) -> None:
        while self.pull_queue and self.active_pulls < self.model.registry_slots:
            node, image, attempt = self.pull_queue.popleft()
            self.active_pulls += 1
            self.pull_attempts += 1
            if self.rng.random() < self.failure_probability():
                self.at(
                    self.now + self.model.fail_after_s,
                    lambda n=node, i=image, a=attempt: self.pull_failed(n, i, a),
                )
            else:
                self.at(self.now + self.model.pull_s, lambda n=node, i=image: self.pulled(n, i))

    def pull_failed(self, node: int, image: int, attempt: int) -> None:
        self.active_pulls -= 1
        self.failed_pulls += 1
        model = self.model
        backoff = min(model.max_backoff_s, model.backoff_s * 2 ** (attempt - 1)) * (0.5 + self.rng.random())
        self.at(self.now + backoff, lambda: self.request_pull(node, image, attempt + 1))
        self.dispatch()

    def pulled(self, node: int, image: int) -> None:
        self.active_pulls -= 1
        self.cache[(node, image)] = "ready"
        for _ in self.waiting.pop((node, image), []):
            self.at(self.now + self.model.warm_start_s, self.ready)
        self.dispatch()


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def simulate(model: LaunchModel, waves: bool, pinned: bool) -> ScenarioResult:
    sim = _Simulation(model, waves, pinned)
    sim.run()
    launch = f"waves {model.wave_size}/{model.wave_interval_s:g}s" if waves else "all at once"
    placement = "pinned" if pinned else "random"
    return ScenarioResult(
        name=f"{'waves' if waves else 'all-at-once'}/{placement}",
        launch=launch,
        placement=placement,
        all_ready_s=max(sim.ready_at),
        p50_ready_s=_quantile(sim.ready_at, 0.5),
        p95_ready_s=_quantile(sim.ready_at, 0.95),
        failed_pulls=sim.failed_pulls,
        pull_attempts=sim.pull_attempts,
        images_pulled=sim.images_pulled,
        cold_starts=sim.cold,
        warm_starts=sim.warm,
    )


def run_all(model: LaunchModel) -> list[ScenarioResult]:
    return [simulate(model, waves, pinned) for pinned in (False, True) for waves in (False, True)]


def main(as_json: bool) -> None:
    model = LaunchModel()
    results = run_all(model)
    baseline = results[0]
    if as_json:
        print(
            json.dumps(
                {
                    "parameters": asdict(model),
                    "baseline": baseline.name,
                    "scenarios": [asdict(r) for r in results],
                },
                indent=2,
            )
        )
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{model.sandboxes} sandbox starts, one registry (baseline: {baseline.name})")
    table.add_column("scenario", no_wrap=True)
    for column in ("ready s", "speedup", "p50 s", "p95 s", "failed pulls", "pull attempts", "images pulled"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            r.name,
            f"{r.all_ready_s:,.0f}",
            f"{baseline.all_ready_s / r.all_ready_s:.2f}x",
            f"{r.p50_ready_s:,.0f}",
            f"{r.p95_ready_s:,.0f}",
            f"{r.failed_pulls:,}",
            f"{r.pull_attempts:,}",
            f"{r.images_pulled:,}",
        )
    console = Console(width=max(Console().width, 110))
    console.print(table)
    console.print("model: " + ", ".join(f"{k}={v}" for k, v in asdict(model).items()))
