"""The warm pool's bookkeeping, on fake spares: how many it keeps and of which shape, what it
hands out, and that every spare it made is either taken or discarded exactly once."""

from __future__ import annotations

import asyncio
import itertools
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.harbor.envs.warm import WarmPool

_numbers = itertools.count()


class FakeSpare:
    def __init__(self, shape: str) -> None:
        self.shape = shape
        self.number = next(_numbers)
        self.discarded = 0

    async def discard(self) -> None:
        self.discarded += 1


class Maker:
    """Makes fake spares of one shape, recording them; `fail` makes the next start raise."""

    def __init__(self, shape: str, made: list[FakeSpare], delay_s: float = 0.0) -> None:
        self.shape, self.made, self.delay_s = shape, made, delay_s
        self.fail = False
        self.running = 0
        self.most_running = 0

    async def __call__(self) -> FakeSpare:
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await asyncio.sleep(self.delay_s)
            if self.fail:
                raise RuntimeError("bwrap failed")
            spare = FakeSpare(self.shape)
            self.made.append(spare)
            return spare
        finally:
            self.running -= 1


async def _settle(pool: WarmPool) -> None:
    for _ in range(200):
        await asyncio.sleep(0)
        if pool._filler is None or pool._filler.done():
            return
    raise AssertionError("the filler did not finish")


async def test_a_refill_keeps_size_spares_made_one_at_a_time_and_take_hands_them_out() -> None:
    made: list[FakeSpare] = []
    pool = WarmPool(size=3, max_age_s=60)
    maker = Maker("a", made)
    assert pool.take("a") is None and pool.missed == 1
    pool.refill("a", maker)
    await _settle(pool)
    assert pool.held() == 3 and maker.most_running == 1
    first = pool.take("a")
    assert first is made[0] and pool.taken == 1 and pool.held() == 2  # oldest first
    assert pool.take("b") is None and pool.missed == 2  # another shape is never handed out
    pool.refill("a", maker)
    await _settle(pool)
    assert pool.held() == 3 and len(made) == 4
    await pool.close()
    assert [spare.discarded for spare in made] == [0, 1, 1, 1]


async def test_a_new_shape_makes_room_by_evicting_the_least_recently_asked() -> None:
    made: list[FakeSpare] = []
    pool = WarmPool(size=2, max_age_s=60)
    pool.refill("a", Maker("a", made))
    await _settle(pool)
    pool.refill("b", Maker("b", made))
    await _settle(pool)
    assert pool.held() == 2
    assert [spare.shape for spare in made if not spare.discarded] == ["b", "b"]
    assert pool.take("a") is None
    await pool.close()
    assert all(spare.discarded == 1 for spare in made)


async def test_spares_past_their_age_are_discarded_instead_of_taken() -> None:
    made: list[FakeSpare] = []
    pool = WarmPool(size=2, max_age_s=0.01)
    pool.refill("a", Maker("a", made))
    await _settle(pool)
    await asyncio.sleep(0.03)
    assert pool.take("a") is None and pool.missed == 1
    await pool.close()
    assert [spare.discarded for spare in made] == [1, 1]


async def test_a_failing_start_stops_the_refill_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    made: list[FakeSpare] = []
    pool = WarmPool(size=2, max_age_s=60)
    maker = Maker("a", made)
    maker.fail = True
    with caplog.at_level(logging.WARNING):
        pool.refill("a", maker)
        await _settle(pool)
    assert pool.held() == 0 and "could not start a warm sandbox" in caplog.text
    maker.fail = False
    pool.refill("a", maker)  # the next start asks again
    await _settle(pool)
    assert pool.held() == 2
    await pool.close()


async def test_close_cancels_a_start_in_progress_and_refuses_later_refills() -> None:
    made: list[FakeSpare] = []
    pool = WarmPool(size=2, max_age_s=60)
    maker = Maker("a", made, delay_s=10)
    pool.refill("a", maker)
    await asyncio.sleep(0.01)
    assert maker.running == 1
    await asyncio.wait_for(pool.close(), timeout=2)
    assert maker.running == 0 and not made
    pool.refill("a", maker)
    assert pool._filler is None or pool._filler.done()


async def test_a_size_of_zero_keeps_nothing() -> None:
    pool = WarmPool(size=0, max_age_s=60)
    pool.refill("a", Maker("a", []))
    assert pool._filler is None and pool.held() == 0


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(1, 4),
    steps=st.lists(st.tuples(st.sampled_from(["take", "refill"]), st.sampled_from("abc")), max_size=30),
)
def test_every_spare_is_taken_or_discarded_exactly_once_and_never_more_than_size_are_held(
    size: int, steps: list[tuple[str, str]]
) -> None:
    async def run() -> None:
        made: list[FakeSpare] = []
        makers = {shape: Maker(shape, made) for shape in "abc"}
        pool = WarmPool(size=size, max_age_s=60)
        taken: list[FakeSpare] = []
        for action, shape in steps:
            if action == "take":
                spare = pool.take(shape)
                if spare is not None:
                    assert isinstance(spare, FakeSpare) and spare.shape == shape
                    taken.append(spare)
            else:
                pool.refill(shape, makers[shape])
            await _settle(pool)
            assert pool.held() <= size
        await pool.close()
        assert all(spare.discarded == (0 if spare in taken else 1) for spare in made)
        assert len({id(spare) for spare in taken}) == len(taken)

    asyncio.run(run())
