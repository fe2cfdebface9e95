"""Which Harbor /run replica an attempt goes to: its image group's replica, else the least loaded.

Owns the client-side routing over a pool of Harbor /run servers (`rl360_ext.harbor.pool`):
- pinning: an image group maps to one replica by rendezvous hashing over the replica URLs, so
  the same image's sandboxes start where its layers are cached, and adding or losing a replica
  moves only the groups that hashed to it;
- spill-over: when the pinned replica has `spill_over` more attempts in flight (from this client)
  than the least-loaded live one, the attempt goes to the least-loaded one instead;
- a replica whose connection failed is skipped for `down_s` seconds (the next attempts go
  elsewhere while the pool replaces it); `attempt(..., exclude=)` skips replicas an attempt already
  tried (a refused connection started nothing, so the agent function moves the attempt on);
- a replaced replica: `replace_url(old, new)` swaps a URL in every router of this process (the
  pool's `on_replace` callback), and the swapped-in URL is live at once; a replacement on its
  predecessor's URL (`old == new`) clears that URL's down mark.
It does not send requests or classify failures (`rl360_ext.rollout.agent`).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterator, Sequence

DEFAULT_SPILL_OVER = 4
DEFAULT_DOWN_S = 30.0


_routers: weakref.WeakSet[HarborRouter] = weakref.WeakSet()
_routers_lock = threading.Lock()


def replace_url(old: str, new: str) -> int:
    """Swap replica URL `old` for `new` in every router of this process (the same URL: mark it live
    again); returns how many had it."""
    with _routers_lock:
        routers = list(_routers)
    swapped = 0
    for router in routers:
        if router.swap(old, new):
            swapped += 1
    return swapped


def _score(url: str, image_group: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{url}\0{image_group}".encode(), digest_size=8).digest(), "big")


class HarborRouter:
    """Routes attempts over replica URLs; counts this client's in-flight attempts per replica."""

    def __init__(
        self,
        urls: Sequence[str],
        spill_over: int = DEFAULT_SPILL_OVER,
        down_s: float = DEFAULT_DOWN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if spill_over < 0:
            raise ValueError(f"spill_over must be >= 0, got {spill_over}")
        self.spill_over = spill_over
        self.down_s = down_s
        self._clock = clock
        self.in_flight: dict[str, int] = {}
        self._down_until: dict[str, float] = {}
        self.update(urls)
        with _routers_lock:
            _routers.add(self)

    def update(self, urls: Sequence[str]) -> None:
        """Replace the replica list (a pool replaced a replica); counts of kept URLs stay."""
        cleaned = [url.rstrip("/") for url in urls if url.strip()]
        if not cleaned:
            raise ValueError("a Harbor router needs at least one replica URL")
        if len(set(cleaned)) != len(cleaned):
            raise ValueError(f"replica URLs must be distinct, got {cleaned}")
        self.urls = cleaned
        self.in_flight = {url: self.in_flight.get(url, 0) for url in cleaned}
        self._down_until = {url: t for url, t in self._down_until.items() if url in self.in_flight}

    def swap(self, old: str, new: str) -> bool:
        """Replace replica `old` by `new` (same position; `new` is live); False if `old` is not here."""
        old, new = old.rstrip("/"), new.rstrip("/")
        if old == new and old in self.in_flight:  # replaced on the same URL: live again now
            self._down_until.pop(old, None)
            return True
        if old not in self.in_flight or new in self.in_flight:
            return False
        self.update([new if url == old else url for url in self.urls])
        return True

    def _live(self, exclude: Collection[str] = ()) -> list[str]:
        now = self._clock()
        untried = [url for url in self.urls if url not in exclude]
        live = [url for url in untried if self._down_until.get(url, 0.0) <= now]
        return live or untried

    def pinned(self, image_group: str) -> str:
        """The replica `image_group` hashes to among all replicas (live or not)."""
        return max(self.urls, key=lambda url: _score(url, image_group))

    def choose(self, image_group: str, exclude: Collection[str] = ()) -> str | None:
        """The replica for an attempt of `image_group`, never one in `exclude` (None: all are)."""
        live = self._live(exclude)
        if not live:
            return None
        pinned = max(live, key=lambda url: _score(url, image_group))
        least = min(live, key=lambda url: (self.in_flight[url], url != pinned))
        if self.in_flight[pinned] - self.in_flight[least] > self.spill_over:
            return least
        return pinned

    def mark_down(self, url: str) -> None:
        """The replica at `url` failed to answer: route around it for `down_s` seconds."""
        if url in self.in_flight:
            self._down_until[url] = self._clock() + self.down_s

    @contextlib.contextmanager
    def attempt(self, image_group: str, exclude: Collection[str] = ()) -> Iterator[str | None]:
        """Choose a replica (not one in `exclude`) and count the attempt in flight there until the
        block exits; yields None when every replica is excluded."""
        url = self.choose(image_group, exclude)
        if url is None:
            yield None
            return
        self.in_flight[url] += 1
        try:
            yield url
        finally:
            if url in self.in_flight:
                self.in_flight[url] -= 1
