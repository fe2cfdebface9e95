"""Admission for sandbox starts: global concurrency, rolling-start waves, reservations, pinning.

Owns when an attempt may start its sandbox and where: a FIFO queue in front of
- a global cap on running trials (`max_concurrent`),
- rolling-start waves: at most `size` sandbox starts in any `interval_s` window, so 8,192
  attempts do not hit the image registry at once (paced at admission, so waiting counts as
  queue time in the deadline budget, and held exactly by `StartGate` right before each start),
- per-trial resource reservations (cpus, memory) against an optional server capacity, so one
  heavy build cannot starve its neighbours (the sandbox enforces the reservation),
- image-group pinning: a stable map from a task's image group to a node label (rendezvous
  hashing, so adding a node moves only the groups that land on it).
It does not own running trials, budgets or metrics export; it reports counts through callbacks.
The queue is strict FIFO: a large reservation at the head waits rather than starving.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from rl360_ext.errors import Rl360Error


@dataclass(frozen=True)
class Reservation:
    cpus: float
    memory_mb: int

    def fits_in(self, capacity: Reservation) -> bool:
        return self.cpus <= capacity.cpus + 1e-9 and self.memory_mb <= capacity.memory_mb


@dataclass(frozen=True)
class Placement:
    node_label: str
    image_group: str


class AdmissionRefused(Rl360Error):
    """The attempt can never be admitted (its reservation exceeds the server's capacity)."""


class RollingStart:
    """At most `size` starts in any window of `interval_s` seconds (a sliding window).

    `waves` groups starts by fixed windows of `interval_s` from the first start, for reporting
    "starts per wave"; the sliding guarantee implies each fixed wave holds at most `size` too.
    """

    def __init__(self, size: int, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if size < 1:
            raise ValueError(f"rolling start size must be >= 1, got {size}")
        if interval_s <= 0:
            raise ValueError(f"rolling start interval must be > 0, got {interval_s}")
        self.size = size
        self.interval_s = interval_s
        self._clock = clock
        self._recent: deque[float] = deque()
        self._first: float | None = None
        self._wave_index = -1
        self._wave_count = 0
        self.on_wave_closed: Callable[[int], None] | None = None

    def _expire(self, now: float) -> None:
        while self._recent and self._recent[0] <= now - self.interval_s:
            self._recent.popleft()

    def delay_s(self) -> float:
        """Seconds until the next start is allowed (0 when allowed now)."""
        now = self._clock()
        self._expire(now)
        if len(self._recent) < self.size:
            return 0.0
        return max(0.0, self._recent[0] + self.interval_s - now)

    def record_start(self) -> None:
        now = self._clock()
        self._recent.append(now)
        if self._first is None:
            self._first = now
        index = math.floor((now - self._first) / self.interval_s)
        if index != self._wave_index:
            if self._wave_index >= 0 and self.on_wave_closed is not None:
                self.on_wave_closed(self._wave_count)
            self._wave_index, self._wave_count = index, 0
        self._wave_count += 1

    def in_window(self) -> int:
        self._expire(self._clock())
        return len(self._recent)


class Gate(Protocol):
    """What the runner waits on right before a sandbox starts (this server's or a pool's gate)."""

    async def wait_turn(self) -> float:
        """Wait for this start's slot; return the slot's time (unix seconds)."""
        ...


class StartGate:
    """The exact rolling-start gate, taken immediately before a sandbox starts.

    Admission already paces attempts with the same limits (so the wait here stays at the few
    milliseconds between admission and the actual start); this gate makes the measured sandbox
    starts hold the limit exactly. Waiters are served in arrival order.
    """

    def __init__(self, rolling: RollingStart) -> None:
        self.rolling = rolling
        self._lock = asyncio.Lock()
        self.on_start: Callable[[], None] | None = None

    async def wait_turn(self) -> float:
        async with self._lock:
            while (delay := self.rolling.delay_s()) > 0:
                await asyncio.sleep(delay)
            self.rolling.record_start()
            slot_at = time.time()
        if self.on_start is not None:
            self.on_start()
        return slot_at


@dataclass
class Ticket:
    reservation: Reservation
    admitted_at: float
    released: bool = False


@dataclass
class _Waiter:
    reservation: Reservation
    future: asyncio.Future[Ticket]
    enqueued_at: float = field(default_factory=time.monotonic)


class Admission:
    """FIFO admission under concurrency, reservation capacity and rolling-start limits."""

    def __init__(
        self,
        max_concurrent: int,
        rolling: RollingStart | None = None,
        capacity: Reservation | None = None,
    ) -> None:
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
        self.max_concurrent = max_concurrent
        self.rolling = rolling
        self.capacity = capacity
        self._queue: deque[_Waiter] = deque()
        self._running: list[Ticket] = []
        self._timer: asyncio.TimerHandle | None = None
        self.on_change: Callable[[], None] | None = None

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        return len(self._running)

    def reserved(self) -> Reservation:
        return Reservation(
            cpus=sum(t.reservation.cpus for t in self._running),
            memory_mb=sum(t.reservation.memory_mb for t in self._running),
        )

    def _fits(self, reservation: Reservation) -> bool:
        if self.capacity is None:
            return True
        used = self.reserved()
        total = Reservation(used.cpus + reservation.cpus, used.memory_mb + reservation.memory_mb)
        return total.fits_in(self.capacity)

    async def acquire(self, reservation: Reservation, timeout_s: float) -> Ticket:
        """Wait (FIFO) until the attempt may start; raises TimeoutError after `timeout_s`."""
        if self.capacity is not None and not reservation.fits_in(self.capacity):
            raise AdmissionRefused(
                f"reservation cpus={reservation.cpus} memory_mb={reservation.memory_mb} exceeds the "
                f"server capacity cpus={self.capacity.cpus} memory_mb={self.capacity.memory_mb}"
            )
        waiter = _Waiter(reservation, asyncio.get_running_loop().create_future())
        self._queue.append(waiter)
        self._pump()
        try:
            return await asyncio.wait_for(asyncio.shield(waiter.future), timeout=max(0.0, timeout_s))
        except BaseException:
            if waiter.future.done() and not waiter.future.cancelled():
                self.release(waiter.future.result())
            else:
                waiter.future.cancel()
                if waiter in self._queue:
                    self._queue.remove(waiter)
                self._pump()
            raise

    def release(self, ticket: Ticket) -> None:
        if ticket.released:
            return
        ticket.released = True
        self._running.remove(ticket)
        self._pump()

    def _pump(self) -> None:
        while self._queue:
            head = self._queue[0]
            if head.future.done():
                self._queue.popleft()
                continue
            if self.running >= self.max_concurrent or not self._fits(head.reservation):
                break
            if self.rolling is not None:
                delay = self.rolling.delay_s()
                if delay > 0:
                    self._wake_after(delay)
                    break
                self.rolling.record_start()
            self._queue.popleft()
            ticket = Ticket(head.reservation, time.monotonic())
            self._running.append(ticket)
            head.future.set_result(ticket)
        if self.on_change is not None:
            self.on_change()

    def _wake_after(self, delay_s: float) -> None:
        if self._timer is not None and not self._timer.cancelled():
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(delay_s + 1e-3, self._pump)


def _rendezvous_score(node: str, image_group: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{node}\0{image_group}".encode()).digest()[:8], "big")


class ImagePinning:
    """Stable image group -> node label map (highest random weight hashing)."""

    def __init__(self, node_labels: Sequence[str]) -> None:
        labels = [label for label in node_labels if label]
        if not labels:
            raise ValueError("at least one node label is required")
        if len(set(labels)) != len(labels):
            raise ValueError(f"node labels must be unique, got {labels}")
        self.node_labels = tuple(labels)

    def node_for(self, image_group: str) -> str:
        return max(self.node_labels, key=lambda node: _rendezvous_score(node, image_group))

    def place(self, image_group: str) -> Placement:
        return Placement(node_label=self.node_for(image_group), image_group=image_group)
