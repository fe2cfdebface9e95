"""Admission: concurrency cap, reservations, rolling-start waves, start gate, image-group pinning."""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.harbor.admission import (
    Admission,
    AdmissionRefused,
    ImagePinning,
    Reservation,
    RollingStart,
    StartGate,
)

SMALL = Reservation(cpus=1, memory_mb=512)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class RecordingRollingStart(RollingStart):
    """Records the limiter's own clock at every start it grants."""

    def __init__(self, size: int, interval_s: float) -> None:
        super().__init__(size, interval_s)
        self.granted: list[float] = []

    def record_start(self) -> None:
        self.granted.append(time.monotonic())
        super().record_start()


def max_in_window(times: list[float], interval: float) -> int:
    times = sorted(times)
    return max((sum(1 for t in times if start <= t < start + interval) for start in times), default=0)


def test_rolling_start_allows_k_per_sliding_window() -> None:
    clock = FakeClock()
    rolling = RollingStart(size=2, interval_s=10, clock=clock)
    waves: list[int] = []
    rolling.on_wave_closed = waves.append
    rolling.record_start()
    rolling.record_start()
    assert rolling.delay_s() == 10
    clock.now += 4
    assert rolling.delay_s() == 6
    clock.now += 6
    assert rolling.delay_s() == 0 and rolling.in_window() == 0
    rolling.record_start()
    assert waves == [2]


def test_rolling_start_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="size"):
        RollingStart(0, 1)
    with pytest.raises(ValueError, match="interval"):
        RollingStart(1, 0)


async def test_concurrency_is_capped_and_everyone_is_admitted_in_order() -> None:
    admission = Admission(max_concurrent=3)
    running, peak, order = 0, 0, []

    async def attempt(index: int) -> None:
        nonlocal running, peak
        ticket = await admission.acquire(SMALL, timeout_s=30)
        order.append(index)
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        admission.release(ticket)

    await asyncio.gather(*(attempt(i) for i in range(20)))
    assert peak == 3 and order == list(range(20))
    assert admission.running == 0 and admission.queue_depth == 0


async def test_reservations_are_admitted_against_capacity() -> None:
    admission = Admission(max_concurrent=10, capacity=Reservation(cpus=2, memory_mb=1024))
    first = await admission.acquire(SMALL, timeout_s=1)
    second = await admission.acquire(SMALL, timeout_s=1)
    third = asyncio.create_task(admission.acquire(SMALL, timeout_s=5))
    await asyncio.sleep(0.05)
    assert not third.done() and admission.queue_depth == 1 and admission.reserved().cpus == 2
    admission.release(first)
    ticket = await third
    admission.release(second)
    admission.release(ticket)
    assert admission.reserved() == Reservation(0, 0)


async def test_a_reservation_larger_than_capacity_is_refused_at_once() -> None:
    admission = Admission(max_concurrent=10, capacity=Reservation(cpus=2, memory_mb=1024))
    with pytest.raises(AdmissionRefused, match="exceeds"):
        await admission.acquire(Reservation(cpus=4, memory_mb=10), timeout_s=1)


async def test_a_timed_out_waiter_leaves_the_queue() -> None:
    admission = Admission(max_concurrent=1)
    ticket = await admission.acquire(SMALL, timeout_s=1)
    with pytest.raises(TimeoutError):
        await admission.acquire(SMALL, timeout_s=0.05)
    assert admission.queue_depth == 0
    admission.release(ticket)
    admission.release(await admission.acquire(SMALL, timeout_s=1))


async def test_a_cancelled_waiter_leaves_the_queue_and_frees_nothing_it_did_not_hold() -> None:
    admission = Admission(max_concurrent=1)
    ticket = await admission.acquire(SMALL, timeout_s=1)
    waiter = asyncio.create_task(admission.acquire(SMALL, timeout_s=5))
    await asyncio.sleep(0.01)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert admission.queue_depth == 0 and admission.running == 1
    admission.release(ticket)
    assert admission.running == 0


async def test_admission_paces_starts_in_waves() -> None:
    rolling = RecordingRollingStart(size=3, interval_s=0.2)
    admission = Admission(max_concurrent=100, rolling=rolling)

    async def attempt() -> None:
        admission.release(await admission.acquire(SMALL, timeout_s=10))

    await asyncio.gather(*(attempt() for _ in range(9)))
    assert len(rolling.granted) == 9
    assert max_in_window(rolling.granted, 0.2) <= 3


async def test_the_start_gate_holds_the_limit_in_arrival_order() -> None:
    rolling = RecordingRollingStart(size=2, interval_s=0.1)
    gate = StartGate(rolling)
    order: list[int] = []
    slots: list[float] = []

    async def start(index: int) -> None:
        slots.append(await gate.wait_turn())
        order.append(index)

    await asyncio.gather(*(start(i) for i in range(6)))
    assert order == list(range(6))
    assert max_in_window(rolling.granted, 0.1) <= 2
    # the slot times it hands back are the starts it granted: in order, and holding the limit
    assert slots == sorted(slots) and max_in_window(slots, 0.1 - 0.005) <= 2


def test_pinning_is_stable_and_spreads_groups() -> None:
    pinning = ImagePinning(["a", "b", "c", "d"])
    groups = [f"image-{i}" for i in range(400)]
    first = [pinning.node_for(g) for g in groups]
    assert first == [ImagePinning(["d", "c", "b", "a"]).node_for(g) for g in groups]  # order-independent
    counts = {node: first.count(node) for node in "abcd"}
    assert min(counts.values()) > 60  # roughly even
    placement = pinning.place("image-1")
    assert (placement.node_label, placement.image_group) == (first[1], "image-1")


def test_pinning_rejects_bad_labels() -> None:
    with pytest.raises(ValueError, match="at least one"):
        ImagePinning(["", ""])
    with pytest.raises(ValueError, match="unique"):
        ImagePinning(["a", "a"])


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=8, unique=True),
    st.text(min_size=1, max_size=6),
    st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=30),
)
def test_adding_a_node_moves_only_groups_that_land_on_it(
    nodes: list[str], new: str, groups: list[str]
) -> None:
    if new in nodes:
        return
    before, after = ImagePinning(nodes), ImagePinning([*nodes, new])
    for group in groups:
        assert after.node_for(group) in (before.node_for(group), new)
