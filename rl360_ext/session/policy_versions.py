"""Per-token policy versions of a merged sample, from its turns' engine reports (pure functions).

Owns the bookkeeping behind `MergedSample.token_version`, `kv_version`, `routing_source`,
`routing_version`, `turn_first_version`, `turn_output_start` and `turn_cached_tokens` (the
contract in `rl360_ext.sglang.versions`). Inputs are what each turn's `/generate` reported:
`weight_versions` spans over its output tokens, `cached_tokens`, `num_retractions` and the
delta-R3 row sources (`routing.row_sources`). The rules follow SGLang's scheduler (docs/engine.md,
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
  the re-prefill after a retract) REPREFILL. `routing_version`: the KV version of the position
  when the turn whose response carried the row had finished (a row is recorded by the forward
  that writes the position's KV; the session keeps earlier turns' rows).

It does not own the merge (`merge.py`) or the wire (`wire.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rl360_ext.session.routing import SOURCE_DECODE, SOURCE_LATER_PREFILL, SOURCE_PROMPT
from rl360_ext.sglang.versions import (
    TURN_CACHED_TOKENS,
    TURN_OUTPUT_START,
    UNVERSIONED,
    RoutingSource,
    version_number,
)

_SOURCE_OF_ROW = {
    SOURCE_PROMPT: int(RoutingSource.PREFILL),
    SOURCE_DECODE: int(RoutingSource.DECODE),
    SOURCE_LATER_PREFILL: int(RoutingSource.REPREFILL),
}


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
    routing_sources: np.ndarray | None = None  # routing.SOURCE_* per row, None without R3

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


def routing_source_of(sources: np.ndarray) -> np.ndarray:
    """`RoutingSource` codes of delta-R3 row sources (`routing.SOURCE_*`), before any retract."""
    prefill = int(RoutingSource.PREFILL)
    return np.asarray([_SOURCE_OF_ROW.get(int(code), prefill) for code in sources], np.uint8)


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
        boundaries = _boundaries(turn, versions)
        retracted = boundaries[: turn.num_retractions]
        recomputed = bool(retracted) and turn.cached_tokens < prompt_end + retracted[0][0] - 1
        first_cached = turn.cached_tokens
        if retracted and not recomputed:  # each re-prefill found the request's own KV
            first_cached -= sum(prompt_end + start - 1 for start, _ in retracted)
        first_cached_tokens.append(min(max(first_cached, 0), prompt_end))
        kv[min(max(first_cached, 0), prompt_end) : prompt_end] = first
        if len(versions) > 1:
            kv[prompt_end : prompt_end + len(versions) - 1] = versions[1:]
        # (first, end) of the positions each retract's re-prefill forwarded: all of them after a
        # flush, else only the token sampled last before the pause (its KV was never written).
        reprefilled: list[tuple[int, int]] = []
        for start, version in retracted:
            end = prompt_end + start
            if recomputed:
                kv[:end] = version
            reprefilled.append((0 if recomputed else end - 1, end))
        if source is None or routing_version is None or turn.routing_rows is None:
            continue
        lo, hi = turn.routing_start, turn.routing_start + turn.routing_rows
        if turn.routing_sources is not None and len(turn.routing_sources) == hi - lo:
            source[lo:hi] = routing_source_of(turn.routing_sources)
        routing_version[lo:hi] = kv[lo:hi]
        for first, end in reprefilled:
            start, stop = max(first, lo), min(end, hi)
            if stop > start:
                span = source[start:stop]
                span[span == int(RoutingSource.DECODE)] = int(RoutingSource.REPREFILL)
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
