"""Per-token policy versions of a merged sample, from its turns' engine reports (pure functions).

Owns the bookkeeping behind `MergedSample.token_version`, `kv_version`, `routing_source`,
`routing_version`, `turn_first_version`, `turn_output_start` and `turn_cached_tokens` (the
contract in `rl360_ext.sglang.versions`). Inputs are what each turn's `/generate` reported:
`weight_versions` spans over its output tokens, `cached_tokens`, `num_retractions` and the
delta-R3 row sources as recorded (`routing.row_sources`). The rules follow SGLang's scheduler (docs/engine.md,
"In-flight updates"):

- `token_version`: an output token gets its span's version number; input tokens UNVERSIONED. A
  turn without usable spans (an engine that reports none) uses its `weight_version` for all.
- `turn_first_version`: the version of the turn's first forward, the prefill that sampled its
  first output token (the first span's; with no output, the version at the end).
- `turn_output_start`: the turn's prompt end (input_start + input_tokens), the index of its first
  output token; `turn_cached_tokens`: the prefix-cache hit of the turn's first forward (the
  engine's `cached_tokens`, less what retract re-prefills found of the request's own KV).
- `kv_version` (best effort) is the KV the final context held, latest writer wins over the kept
  turns: a turn's prefill writes positions [cached_tokens, prompt) at its first version (a cached
  prefix keeps what wrote it; cached positions outside this session's own earlier writes are
  UNVERSIONED, the engine does not say who wrote them); output token i's KV is written by the step
  that sampled token i + 1 (so an `in_place` pause keeps the old KV across an update and the token
  held at the pause gets the new version); a turn's last output token has none until the next
  turn's prefill. A turn with `num_retractions` r > 0 was retracted at its first r version
  changes; when its re-prefills did not find their own KV in the cache (`cached_tokens` <
  prompt + first change - 1: the update flushed it) each recomputed the whole context at the new
  span's version (positions before that span's start get it); when they did (`cached_tokens`
  then also counts each re-prefill's own prefix, subtracted to get the first prefill's) the KV
  was kept, as under in_place.
- `routing_source` (`RoutingSource`): rows of prompt positions PREFILL, of sampled tokens fed by
  the decode DECODE, of sampled tokens whose row came from a later prefill (the next turn's, or
  the re-prefill after a retract) REPREFILL. The session records each turn's rows by position
  (`routing.row_sources`); `turn_routing_source` then relabels REPREFILL the DECODE rows a
  retract's re-prefill recomputed (the session's metrics count the same relabelled rows).
  `routing_version`: the KV version of the position when the turn whose response carried the
  row had finished (a row is recorded by the forward that writes the position's KV; the session
  keeps earlier turns' rows).

It does not own the merge (`merge.py`) or the wire (`wire.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rl360_ext.sglang.versions import (
    TURN_CACHED_TOKENS,
    TURN_OUTPUT_START,
    UNVERSIONED,
    RoutingSource,
    version_number,
)


@dataclass(frozen=True)
class TurnVersions:
    """What one turn reported, in the session's positions (a `TurnRecord`'s version facts)."""

    input_start: int
    input_tokens: int
    output_tokens: int
    spans: Sequence[dict[str, Any]]  # the engine's weight_versions: {version, start, end}
    weight_version: str | None
    cached_tokens: int
    num_retractions: int = 0
    routing_start: int = 0
    routing_rows: int | None = None  # rows this turn's response carried; None without R3
    routing_source: np.ndarray | None = None  # uint8 RoutingSource per row as recorded, None without R3

    @property
    def prompt_end(self) -> int:
        return self.input_start + self.input_tokens


@dataclass
class VersionArrays:
    token_version: np.ndarray  # int32 [n]
    kv_version: np.ndarray  # int32 [n]
    routing_source: np.ndarray | None  # uint8 [n - 1] RoutingSource, None without R3
    routing_version: np.ndarray | None  # int32 [n - 1], None without R3
    turn_first_version: np.ndarray  # int32 [turns]
    turn_output_start: np.ndarray | None  # int32 [turns]: index of each turn's first output token
    turn_cached_tokens: np.ndarray | None  # int32 [turns]: cached_tokens of its first forward


def output_versions(turn: TurnVersions) -> np.ndarray:
    """int32 version number of each output token from the turn's spans (see the module rules)."""
    n = turn.output_tokens
    fallback = version_number(turn.weight_version)
    out = np.full(n, fallback, np.int32)
    covered = np.zeros(n, bool)
    for span in turn.spans:
        start, end = max(int(span["start"]), 0), min(int(span["end"]), n)
        if end > start:
            out[start:end] = version_number(str(span["version"]))
            covered[start:end] = True
    if n and not covered.all():  # spans that do not tile the output: trust none of them
        out[:] = fallback
    return out


def first_version(turn: TurnVersions) -> int:
    """The version of the turn's first forward: its first span's (the last one when no output)."""
    if turn.spans:
        span = turn.spans[0] if turn.output_tokens else turn.spans[-1]
        return version_number(str(span["version"]))
    return version_number(turn.weight_version)


def _boundaries(turn: TurnVersions, versions: np.ndarray) -> list[tuple[int, int]]:
    """(output index where a new version starts, that version) for each change within the turn."""
    changes = np.flatnonzero(versions[1:] != versions[:-1]) + 1
    return [(int(i), int(versions[i])) for i in changes]


@dataclass(frozen=True)
class _Retracts:
    """A turn's retracts: (output index where the new version starts, that version) of each, and
    whether their re-prefills recomputed the whole context (the update flushed the request's KV)."""

    changes: list[tuple[int, int]]
    recomputed: bool

    def reprefilled(self, prompt_end: int) -> list[tuple[int, int]]:
        """(first, end) of the positions each re-prefill forwarded: all of them after a flush, else
        only the token sampled last before the pause (its KV was never written)."""
        return [
            (0 if self.recomputed else prompt_end + start - 1, prompt_end + start)
            for start, _ in self.changes
        ]


def _retracts(turn: TurnVersions, versions: np.ndarray) -> _Retracts:
    changes = _boundaries(turn, versions)[: turn.num_retractions]
    recomputed = bool(changes) and turn.cached_tokens < turn.prompt_end + changes[0][0] - 1
    return _Retracts(changes, recomputed)


def _relabelled(turn: TurnVersions, retracts: _Retracts) -> np.ndarray | None:
    if turn.routing_rows is None:
        return None
    lo, hi = turn.routing_start, turn.routing_start + turn.routing_rows
    recorded = turn.routing_source
    if recorded is not None and len(recorded) == hi - lo:
        source = np.array(recorded, np.uint8)
    else:  # a turn recorded without row sources: a prefill recorded them, as far as anyone knows
        source = np.full(hi - lo, int(RoutingSource.PREFILL), np.uint8)
    for first, end in retracts.reprefilled(turn.prompt_end):
        start, stop = max(first, lo) - lo, min(end, hi) - lo
        if stop > start:
            span = source[start:stop]
            span[span == int(RoutingSource.DECODE)] = int(RoutingSource.REPREFILL)
    return source


def turn_routing_source(turn: TurnVersions) -> np.ndarray | None:
    """uint8 `RoutingSource` of each routing row the turn's response carried (positions from
    `routing_start`): the rows as recorded, with the DECODE rows a retract's re-prefill recomputed
    relabelled REPREFILL; None for a turn without R3 rows."""
    return _relabelled(turn, _retracts(turn, output_versions(turn)))


def version_arrays(turns: Sequence[TurnVersions], n_tokens: int, r3: bool) -> VersionArrays:
    """The per-token version arrays of a merged sample whose kept turns are `turns` (in order)."""
    token_version = np.full(n_tokens, UNVERSIONED, np.int32)
    kv = np.full(n_tokens, UNVERSIONED, np.int32)
    rows = max(n_tokens - 1, 0)
    source = np.full(rows, int(RoutingSource.PREFILL), np.uint8) if r3 else None
    routing_version = np.full(rows, UNVERSIONED, np.int32) if r3 else None
    firsts: list[int] = []
    first_cached_tokens: list[int] = []
    for turn in turns:
        prompt_end = turn.prompt_end
        versions = output_versions(turn)
        first = first_version(turn)
        firsts.append(first)
        token_version[prompt_end : prompt_end + len(versions)] = versions
        retracts = _retracts(turn, versions)
        first_cached = turn.cached_tokens
        if retracts.changes and not retracts.recomputed:  # each re-prefill found the request's own KV
            first_cached -= sum(prompt_end + start - 1 for start, _ in retracts.changes)
        first_cached_tokens.append(min(max(first_cached, 0), prompt_end))
        kv[min(max(first_cached, 0), prompt_end) : prompt_end] = first
        if len(versions) > 1:
            kv[prompt_end : prompt_end + len(versions) - 1] = versions[1:]
        if retracts.recomputed:
            for start, version in retracts.changes:
                kv[: prompt_end + start] = version
        turn_source = _relabelled(turn, retracts)
        if source is None or routing_version is None or turn_source is None:
            continue
        lo, hi = turn.routing_start, turn.routing_start + len(turn_source)
        source[lo:hi] = turn_source
        routing_version[lo:hi] = kv[lo:hi]
    return VersionArrays(
        token_version=token_version,
        kv_version=kv,
        routing_source=source,
        routing_version=routing_version,
        turn_first_version=np.asarray(firsts, np.int32),
        turn_output_start=np.asarray([turn.prompt_end for turn in turns], np.int32),
        turn_cached_tokens=np.asarray(first_cached_tokens, np.int32),
    )


def _cut(array: np.ndarray | None, length: int) -> list[int] | None:
    return None if array is None else array[:length].tolist()


def to_lists(arrays: VersionArrays, n: int, turns: int) -> dict[str, Any]:
    """The contract's plain-list dict cut to the first `n` tokens and `turns` turns
    (`VERSIONS_KEY` metadata: routing arrays None without R3, per-turn positions None when not
    recorded)."""
    rows = max(n - 1, 0)
    return {
        "token_version": arrays.token_version[:n].tolist(),
        "kv_version": arrays.kv_version[:n].tolist(),
        "routing_source": None if arrays.routing_source is None else arrays.routing_source[:rows].tolist(),
        "routing_version": None if arrays.routing_version is None else arrays.routing_version[:rows].tolist(),
        "turn_first_version": arrays.turn_first_version[:turns].tolist(),
        TURN_OUTPUT_START: _cut(arrays.turn_output_start, turns),
        TURN_CACHED_TOKENS: _cut(arrays.turn_cached_tokens, turns),
    }
