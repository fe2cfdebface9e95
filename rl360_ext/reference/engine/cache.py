"""The tiny engine's prefix KV cache: a radix tree over token ids with a token capacity and LRU eviction.

Each tree node holds a run of tokens, the KV computed for those positions, and the routing rows
(top-k expert ids per layer) that the same forward pass produced. Matching a prefix returns both,
so the routing reported for a cached position always comes from the forward that wrote its KV;
once a position is evicted, the next request re-prefills it and re-routes it. Eviction trims
least-recently-used leaves (whole leaves, or the tail of the last one) until the cache fits.
It does not run the model or decide what to insert (`engine.py` does).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from rl360_ext.reference.engine.model import KVState


@dataclass(eq=False)
class _Node:
    tokens: np.ndarray  # [n] int64
    keys: np.ndarray  # [layers, heads, n, head_dim]
    values: np.ndarray
    routing: np.ndarray  # [n, layers, top_k] int32
    parent: _Node | None
    children: dict[int, _Node] = field(default_factory=dict)
    last_access: int = 0

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def split(self, at: int) -> _Node:
        """Cut this node after `at` tokens; the head becomes a new node between parent and self."""
        head = _Node(
            self.tokens[:at],
            self.keys[:, :, :at],
            self.values[:, :, :at],
            self.routing[:at],
            self.parent,
            {int(self.tokens[at]): self},
            self.last_access,
        )
        assert self.parent is not None
        self.parent.children[int(self.tokens[0])] = head
        self.tokens = self.tokens[at:]
        self.keys = self.keys[:, :, at:]
        self.values = self.values[:, :, at:]
        self.routing = self.routing[at:]
        self.parent = head
        return head


@dataclass
class PrefixMatch:
    """A cached prefix: its length and, per tree node on the path, views of its KV and routing."""

    length: int
    segments: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)

    @property
    def keys(self) -> np.ndarray | None:
        return np.concatenate([k for k, _, _ in self.segments], axis=2) if self.segments else None

    @property
    def values(self) -> np.ndarray | None:
        return np.concatenate([v for _, v, _ in self.segments], axis=2) if self.segments else None

    @property
    def routing(self) -> np.ndarray | None:
        """[length, layers, top_k] routing rows written together with the matched KV."""
        return np.concatenate([r for _, _, r in self.segments], axis=0) if self.segments else None

    def kv_state(self, spare: int) -> KVState | None:
        """A request-owned copy of the prefix KV with room for `spare` more positions."""
        if not self.segments:
            return None
        layers, heads, _, head_dim = self.segments[0][0].shape
        shape = (layers, heads, self.length + max(spare, 1), head_dim)
        state = KVState(
            np.empty(shape, self.segments[0][0].dtype), np.empty(shape, self.segments[0][0].dtype)
        )
        pos = 0
        for keys, values, _ in self.segments:
            n = keys.shape[2]
            state.keys[:, :, pos : pos + n] = keys
            state.values[:, :, pos : pos + n] = values
            pos += n
        state.length = pos
        return state


@dataclass
class CacheStats:
    lookups: int = 0
    lookup_tokens: int = 0
    hit_tokens: int = 0
    inserted_tokens: int = 0
    evicted_tokens: int = 0
    flushes: int = 0


class RadixKVCache:
    """Prefix cache keyed by token ids; `capacity_tokens` = 0 disables it. Callers serialize access."""

    def __init__(self, capacity_tokens: int) -> None:
        if capacity_tokens < 0:
            raise ValueError(f"kv capacity must be >= 0, got {capacity_tokens}")
        self.capacity_tokens = capacity_tokens
        self.stats = CacheStats()
        self._clock = itertools.count(1)
        self._root = self._new_root()
        self._size = 0

    @staticmethod
    def _new_root() -> _Node:
        empty = np.zeros(0, np.int64)
        return _Node(
            empty, np.zeros((0, 0, 0, 0)), np.zeros((0, 0, 0, 0)), np.zeros((0, 0, 0), np.int32), None
        )

    @property
    def size_tokens(self) -> int:
        return self._size

    def flush(self) -> None:
        """Drop everything (weights changed, or an explicit /flush_cache)."""
        self._root = self._new_root()
        self._size = 0
        self.stats.flushes += 1

    def match(self, tokens: np.ndarray, limit: int) -> PrefixMatch:
        """The longest cached prefix of tokens[:limit]; touches the nodes it used."""
        self.stats.lookups += 1
        self.stats.lookup_tokens += max(limit, 0)
        tick = next(self._clock)
        path = list(self._path(tokens, limit, tick))
        if not path:
            return PrefixMatch(0)
        pos = sum(common for _, common in path)
        self.stats.hit_tokens += pos
        segments = [(p.keys[:, :, :c], p.values[:, :, :c], p.routing[:c]) for p, c in path]
        return PrefixMatch(pos, segments)

    def _path(self, tokens: np.ndarray, limit: int, tick: int) -> Iterator[tuple[_Node, int]]:
        """The cached path of tokens[:limit] from the root: each node on it with how many of its
        tokens match (all of them but in the last node, which may match a head only); touches
        each node it yields."""
        node, pos = self._root, 0
        while pos < limit:
            child = node.children.get(int(tokens[pos]))
            if child is None:
                return
            common = _common_prefix(child.tokens, tokens[pos:limit])
            child.last_access = tick
            partial = common < len(child)
            yield child, common
            if partial:
                return
            pos += common
            node = child

    def insert(self, tokens: np.ndarray, kv: KVState, routing: np.ndarray) -> int:
        """Cache positions [0, len(tokens)) from `kv` and `routing`, keeping what is already cached.

        Returns how many tokens were newly stored."""
        n = min(len(tokens), kv.length, routing.shape[0])
        if self.capacity_tokens == 0 or n == 0:
            return 0
        tick = next(self._clock)
        node, pos = self._root, 0
        for child, common in list(self._path(tokens, n, tick)):
            node = child.split(common) if common < len(child) else child
            pos += common
        added = n - pos
        if added > 0:
            keys, values = kv.slice(pos, n)
            leaf = _Node(
                np.array(tokens[pos:n], np.int64), keys, values, routing[pos:n].copy(), node, last_access=tick
            )
            node.children[int(tokens[pos])] = leaf
            self._size += added
            self.stats.inserted_tokens += added
        self._evict(self._size - self.capacity_tokens)
        return added

    def _evict(self, excess: int) -> None:
        if excess <= 0:
            return
        heap = [(leaf.last_access, id(leaf), leaf) for leaf in self._leaves()]
        heapq.heapify(heap)
        while excess > 0 and heap:
            _, _, leaf = heapq.heappop(heap)
            if len(leaf) > excess:
                keep = len(leaf) - excess
                leaf.tokens, leaf.routing = leaf.tokens[:keep], leaf.routing[:keep]
                leaf.keys, leaf.values = leaf.keys[:, :, :keep].copy(), leaf.values[:, :, :keep].copy()
                self._size -= excess
                self.stats.evicted_tokens += excess
                return
            parent = leaf.parent
            assert parent is not None
            del parent.children[int(leaf.tokens[0])]
            self._size -= len(leaf)
            self.stats.evicted_tokens += len(leaf)
            excess -= len(leaf)
            if parent is not self._root and not parent.children:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))

    def _leaves(self) -> list[_Node]:
        leaves, stack = [], list(self._root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                leaves.append(node)
        return leaves


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.nonzero(a[:n] != b[:n])[0]
    return int(diff[0]) if diff.size else n
