"""Client-side routing over Harbor replicas: image-group pinning, spill-over, routing around failures."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.rollout.harbor_routing import HarborRouter

URLS = [f"http://10.0.0.{i}:8000" for i in range(1, 5)]
GROUPS = [f"image-{i}" for i in range(200)]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_image_group_always_goes_to_its_replica() -> None:
    router = HarborRouter(URLS)
    for group in GROUPS[:20]:
        assert {router.choose(group) for _ in range(5)} == {router.pinned(group)}


def test_groups_spread_over_replicas() -> None:
    router = HarborRouter(URLS)
    counts = {url: 0 for url in URLS}
    for group in GROUPS:
        counts[router.pinned(group)] += 1
    assert min(counts.values()) >= 25  # 50 expected per replica


@settings(max_examples=50, deadline=None)
@given(removed=st.sampled_from(URLS))
def test_losing_a_replica_moves_only_its_groups(removed: str) -> None:
    before = HarborRouter(URLS)
    after = HarborRouter([url for url in URLS if url != removed])
    for group in GROUPS:
        if before.pinned(group) != removed:
            assert after.pinned(group) == before.pinned(group)


def test_spill_over_to_the_least_loaded_replica() -> None:
    router = HarborRouter(URLS[:2], spill_over=2)
    group = GROUPS[0]
    pinned = router.pinned(group)
    other = next(url for url in URLS[:2] if url != pinned)
    held = [router.attempt(group) for _ in range(3)]
    assert [h.__enter__() for h in held] == [pinned] * 3
    assert router.choose(group) == other  # 3 in flight at the pinned one, 0 at the other: > 2
    for h in held:
        h.__exit__(None, None, None)
    assert router.in_flight == {pinned: 0, other: 0}
    assert router.choose(group) == pinned


def test_a_failed_replica_is_skipped_until_its_cool_down_ends() -> None:
    clock = Clock()
    router = HarborRouter(URLS[:2], down_s=30.0, clock=clock)
    group = GROUPS[1]
    pinned = router.pinned(group)
    router.mark_down(pinned)
    assert router.choose(group) != pinned
    clock.now += 31.0
    assert router.choose(group) == pinned


def test_all_replicas_down_still_routes_somewhere() -> None:
    router = HarborRouter(URLS[:2])
    for url in URLS[:2]:
        router.mark_down(url)
    assert router.choose(GROUPS[2]) in URLS[:2]


@settings(max_examples=50, deadline=None)
@given(st.sets(st.sampled_from(URLS)), st.sets(st.sampled_from(URLS)), st.sampled_from(GROUPS))
def test_an_attempt_never_returns_to_a_replica_it_tried(tried: set[str], down: set[str], group: str) -> None:
    """Untried replicas are chosen before any tried one, live ones first; none left: None."""
    router = HarborRouter(URLS)
    for url in down:
        router.mark_down(url)
    chosen = router.choose(group, exclude=tried)
    untried = set(URLS) - tried
    if not untried:
        assert chosen is None
        with router.attempt(group, exclude=tried) as replica:
            assert replica is None
        return
    assert chosen in untried
    assert chosen not in down or untried <= down
    with router.attempt(group, exclude=tried) as replica:
        assert replica == chosen and router.in_flight[chosen] == 1
    assert router.in_flight[chosen] == 0


def test_update_keeps_counts_of_kept_replicas() -> None:
    router = HarborRouter(URLS[:2])
    with router.attempt(GROUPS[3]) as url:
        router.update([url, URLS[3]])
        assert router.in_flight == {url: 1, URLS[3]: 0}
    assert router.in_flight[url] == 0


@pytest.mark.parametrize("urls", [[], ["  "], [URLS[0], URLS[0] + "/"]])
def test_bad_replica_lists_are_refused(urls: list[str]) -> None:
    with pytest.raises(ValueError, match="replica"):
        HarborRouter(urls)
