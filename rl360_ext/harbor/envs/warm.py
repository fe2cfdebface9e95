"""Warm sandboxes: sandboxes started ahead of the attempts that will use them.

Owns keeping, per event loop, a bounded number of started, never-entered sandboxes ("spares")
of the shapes recently asked for, handing one to a starting trial, and discarding what is not
taken (too old, evicted, or at close). It does not own what a sandbox is or how one starts:
the bwrap environment makes the spares (`rl360_ext.harbor.envs.bwrap`) and gives this module
only something it can `discard`.

A sandbox's start (its tmpfs, cgroup and holder: fresh namespaces of every kind) does not depend
on the trial that will use it, only on its shape (the environment's options, the workdir, the
reservation). Nothing runs in a spare but its holder, so a spare taken is the sandbox a cold
start would have made, started earlier: a trial's setup no longer waits for it, and spares are
made while the replica's slots are busy with agents or idle between steps. Spares are made one
at a time per loop, after a start asks for them, so they never add a burst of starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Protocol

_log = logging.getLogger(__name__)


class Spare(Protocol):
    """A started sandbox no trial has entered."""

    async def discard(self) -> None:
        """Kill and remove the sandbox (never raises for a sandbox that is already gone)."""


@dataclass
class _Kept:
    spare: Spare
    made_at: float


@dataclass
class WarmPool:
    """Up to `size` spares in all, of the shapes most recently asked for; spares older than
    `max_age_s` are discarded instead of handed out. Bound to the event loop it runs on (a
    spare's processes are that loop's subprocesses)."""

    size: int
    max_age_s: float
    _kept: OrderedDict[Hashable, deque[_Kept]] = field(default_factory=OrderedDict)  # LRU first
    _makers: dict[Hashable, Callable[[], Awaitable[Spare]]] = field(default_factory=dict)
    _filler: asyncio.Task[None] | None = None
    _discards: set[asyncio.Task[None]] = field(default_factory=set)
    _closed: bool = False
    taken: int = 0
    missed: int = 0

    def held(self) -> int:
        return sum(len(kept) for kept in self._kept.values())

    def take(self, shape: Hashable) -> Spare | None:
        """A spare of `shape` (the oldest that is young enough), or None; counted as taken or
        missed."""
        kept = self._kept.get(shape)
        now = time.monotonic()
        while kept:
            one = kept.popleft()
            if now - one.made_at <= self.max_age_s:
                self.taken += 1
                return one.spare
            self._discard(one.spare)
        self.missed += 1
        return None

    def refill(self, shape: Hashable, make: Callable[[], Awaitable[Spare]]) -> None:
        """Keep `size` spares of `shape` (the most recently asked-for shape; others' spares make
        room for it), made by `make` in the background, one at a time."""
        if self._closed or self.size <= 0:
            return
        self._kept.setdefault(shape, deque())
        self._kept.move_to_end(shape)
        self._makers[shape] = make
        if self._filler is None or self._filler.done():
            self._filler = asyncio.get_running_loop().create_task(self._fill())

    async def _fill(self) -> None:
        while not self._closed and self._kept:
            shape = next(reversed(self._kept))
            if len(self._kept[shape]) >= self.size:
                return
            if self.held() >= self.size:
                self._evict_one(but=shape)
            try:
                spare = await self._makers[shape]()
            except Exception:  # a cancellation (close) is not one: it ends the filler
                _log.warning("could not start a warm sandbox; trials start theirs", exc_info=True)
                return
            if self._closed or shape not in self._kept:
                await spare.discard()
                return
            self._kept[shape].append(_Kept(spare, time.monotonic()))

    def _evict_one(self, but: Hashable) -> None:
        for shape, kept in self._kept.items():
            if shape != but and kept:
                self._discard(kept.popleft().spare)
                if not kept:
                    del self._kept[shape]
                    self._makers.pop(shape, None)
                return

    def _discard(self, spare: Spare) -> None:
        task = asyncio.get_running_loop().create_task(spare.discard())
        self._discards.add(task)
        task.add_done_callback(self._discards.discard)

    async def close(self) -> None:
        """Stop making spares and discard every one (waits until they are gone)."""
        self._closed = True
        if self._filler is not None:
            self._filler.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._filler
        spares = [one.spare for kept in self._kept.values() for one in kept]
        self._kept.clear()
        self._makers.clear()
        await asyncio.gather(*(spare.discard() for spare in spares), *self._discards, return_exceptions=True)


_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, WarmPool] = weakref.WeakKeyDictionary()


def pool(size: int, max_age_s: float) -> WarmPool:
    """The running loop's pool (made on first use; a later call with other figures resizes it)."""
    loop = asyncio.get_running_loop()
    found = _pools.get(loop)
    if found is None or found._closed:
        found = _pools[loop] = WarmPool(size, max_age_s)
    found.size, found.max_age_s = size, max_age_s
    return found


def counts() -> dict[str, int] | None:
    """The running loop's pool's spares `held` now, and the starts that `taken` one or `missed`
    (none of their shape was ready); None without a pool."""
    found = _pools.get(asyncio.get_running_loop())
    if found is None:
        return None
    return {"held": found.held(), "taken": found.taken, "missed": found.missed}


async def close() -> None:
    """Discard the running loop's spares (a server's shutdown; a no-op without a pool)."""
    found = _pools.pop(asyncio.get_running_loop(), None)
    if found is not None:
        await found.close()
