"""The radix prefix cache: matching, splitting, LRU eviction by token capacity, routing kept with KV."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.reference.engine.cache import RadixKVCache
from rl360_ext.reference.engine.model import KVState

LAYERS, HEADS, HEAD_DIM, TOP_K = 2, 1, 2, 2


def _kv_for(tokens: list[int]) -> tuple[KVState, np.ndarray]:
    """KV and routing whose values encode (position, token), so a match can be checked exactly."""
    n = len(tokens)
    keys = np.zeros((LAYERS, HEADS, n, HEAD_DIM))
    keys[:, :, :, 0] = np.arange(n)
    keys[:, :, :, 1] = tokens
    kv = KVState.from_prefix(keys, -keys, spare=1)
    routing = np.stack([np.array(tokens, np.int32)] * (LAYERS * TOP_K), axis=1).reshape(n, LAYERS, TOP_K)
    return kv, routing


def _insert(cache: RadixKVCache, tokens: list[int]) -> int:
    kv, routing = _kv_for(tokens)
    return cache.insert(np.array(tokens), kv, routing)


def test_match_returns_kv_and_routing_of_the_prefix() -> None:
    cache = RadixKVCache(100)
    _insert(cache, [1, 2, 3, 4, 5])
    match = cache.match(np.array([1, 2, 3, 9, 9]), limit=4)
    assert match.length == 3
    assert match.keys is not None and match.routing is not None
    assert match.keys[0, 0, :, 1].tolist() == [1, 2, 3]
    assert match.routing[:, 0, 0].tolist() == [1, 2, 3]
    assert cache.match(np.array([7, 1]), limit=2).length == 0


def test_limit_caps_the_match() -> None:
    cache = RadixKVCache(100)
    _insert(cache, [1, 2, 3, 4, 5])
    assert cache.match(np.array([1, 2, 3, 4, 5]), limit=4).length == 4


def test_branching_insert_splits_and_keeps_existing_entries() -> None:
    cache = RadixKVCache(100)
    assert _insert(cache, [1, 2, 3, 4]) == 4
    assert _insert(cache, [1, 2, 7, 8, 9]) == 3
    assert cache.size_tokens == 7
    assert cache.match(np.array([1, 2, 3, 4]), 4).length == 4
    assert cache.match(np.array([1, 2, 7, 8, 9]), 5).length == 5
    assert _insert(cache, [1, 2, 3]) == 0  # already cached


def test_lru_eviction_trims_least_recent_leaf_first() -> None:
    cache = RadixKVCache(8)
    _insert(cache, [1, 2, 3, 4])
    _insert(cache, [5, 6, 7, 8])
    cache.match(np.array([1, 2, 3, 4]), 4)  # touch the first sequence
    _insert(cache, [9, 10])
    assert cache.size_tokens == 8
    assert cache.match(np.array([1, 2, 3, 4]), 4).length == 4
    assert cache.match(np.array([5, 6, 7, 8]), 4).length == 2  # its tail was evicted
    assert cache.stats.evicted_tokens == 2


def test_zero_capacity_disables_cache_and_flush_empties_it() -> None:
    disabled = RadixKVCache(0)
    assert _insert(disabled, [1, 2, 3]) == 0
    assert disabled.match(np.array([1, 2, 3]), 3).length == 0
    cache = RadixKVCache(10)
    _insert(cache, [1, 2, 3])
    cache.flush()
    assert cache.size_tokens == 0 and cache.match(np.array([1, 2, 3]), 3).length == 0
    with pytest.raises(ValueError):
        RadixKVCache(-1)


@settings(max_examples=60)
@given(
    sequences=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=8),
    capacity=st.integers(1, 40),
    query=st.lists(st.integers(0, 3), min_size=1, max_size=12),
)
def test_cache_never_exceeds_capacity_and_matches_are_true_prefixes(
    sequences: list[list[int]], capacity: int, query: list[int]
) -> None:
    cache = RadixKVCache(capacity)
    for tokens in sequences:
        _insert(cache, tokens)
        assert cache.size_tokens <= capacity
    match = cache.match(np.array(query), len(query))
    if match.length:
        assert match.keys is not None and match.routing is not None
        # every matched position carries the KV/routing written for that same (position, token)
        assert match.keys[0, 0, :, 0].tolist() == list(range(match.length))
        assert match.keys[0, 0, :, 1].tolist() == query[: match.length]
        assert match.routing[:, 0, 0].tolist() == query[: match.length]
        assert any(seq[: match.length] == query[: match.length] for seq in sequences)
