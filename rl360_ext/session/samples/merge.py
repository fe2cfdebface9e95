"""Merging a session's turns into one sample per trajectory (pure functions, no I/O).

Owns the per-turn record (`TurnRecord`), the merged sample (`MergedSample`) and the merge
rules: tokens are every turn's appended input followed by its output; `loss_mask` is 1 only on
tokens the policy sampled (0 on prompts, tool output and template tokens); `rollout_log_probs`
is the sampler's logprob there and 0 elsewhere; routing rows cover every token but the last; a
turn that finished with `length` (or `abort`) is the last one kept, later turns are dropped and
the status says TRUNCATED (or ABORTED). When the history forked, the sample is the last segment
(the context the model saw last); earlier segments are counted in the metadata. `branches` gives
every segment's trainable turns instead (one sample per branch, Miles' v2 wire): an earlier
segment loses only a last turn that the fork retried (Miles' drop_retries rule). The per-token
policy versions (`token_version`, `kv_version`, `routing_source`, `routing_version`,
`turn_first_version`, `turn_output_start`, `turn_cached_tokens`) come from `policy_versions.py`.
It does not own producing turns (`core.py`) or their bytes on the wire (`wire.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rl360_ext.session.errors import SessionServerError
from rl360_ext.session.samples.policy_versions import TurnVersions, VersionArrays, version_arrays
from rl360_ext.sglang.versions import UNVERSIONED, RoutingSource

COMPLETED = "COMPLETED"
TRUNCATED = "TRUNCATED"
ABORTED = "ABORTED"
FAILED = "FAILED"
STATUSES = (COMPLETED, TRUNCATED, ABORTED, FAILED)
MERGE_KEY = "merge"  # metadata key of the merge's own facts
_STATUS_OF_FINISH = {"stop": COMPLETED, "length": TRUNCATED, "abort": ABORTED}


class MergeError(SessionServerError, ValueError):
    """The turns do not form one append-only sequence (a bug upstream of the merge): the session
    server answers the export with a 500, never a client's 4xx."""

    default_code = "merge_failed"


@dataclass
class TurnRecord:
    """What one chat turn sent to and got from the engine (one /generate call)."""

    index: int  # turn number within the session, across segments
    segment: int  # history segment (a new one starts at every fork)
    input_start: int  # position in the segment's tokens where this turn's appended input begins
    input_ids: np.ndarray  # int32: tokens this turn appended before generating
    output_ids: np.ndarray  # int32: tokens the policy sampled
    output_logprobs: np.ndarray  # float32, one per output token
    finish_reason: str  # "stop" | "length" | "abort"
    weight_version: str | None = None
    weight_versions: list[dict[str, Any]] = field(default_factory=list)  # spans {version, start, end}
    num_retractions: int = 0  # the engine's meta_info.num_retractions
    prompt_tokens: int = 0
    cached_tokens: int = 0
    routing: np.ndarray | None = None  # compact [rows, layers, top_k] for positions from routing_start
    routing_start: int = 0
    routing_source: np.ndarray | None = None  # uint8 [rows] RoutingSource as recorded (routing.row_sources)
    routing_wire_bytes: int = 0  # base64 characters the engine sent for this turn's routing
    finish_detail: dict[str, Any] = field(default_factory=dict)
    latency_s: float = 0.0
    routed_worker: str | None = None
    new_messages: int = 0
    output_top_ids: np.ndarray | None = None  # int32 [output tokens, k], top_logprobs_num asked
    output_top_logprobs: np.ndarray | None = None  # float32 [output tokens, k]

    @property
    def end(self) -> int:
        return self.input_start + len(self.input_ids) + len(self.output_ids)

    def versions(self) -> TurnVersions:
        """The facts `policy_versions` reads."""
        return TurnVersions(
            input_start=self.input_start,
            input_tokens=len(self.input_ids),
            output_tokens=len(self.output_ids),
            spans=self.weight_versions,
            weight_version=self.weight_version,
            cached_tokens=self.cached_tokens,
            num_retractions=self.num_retractions,
            routing_start=self.routing_start,
            routing_rows=None if self.routing is None else len(self.routing),
            routing_source=self.routing_source,
        )

    def summary(self) -> dict[str, Any]:
        """JSON-able facts of the turn (no token arrays)."""
        return {
            "index": self.index,
            "segment": self.segment,
            "input_start": self.input_start,
            "input_tokens": len(self.input_ids),
            "output_tokens": len(self.output_ids),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "finish_reason": self.finish_reason,
            "finish_detail": self.finish_detail,
            "weight_version": self.weight_version,
            "weight_versions": self.weight_versions,
            "num_retractions": self.num_retractions,
            "routing_rows": 0 if self.routing is None else len(self.routing),
            "routing_wire_bytes": self.routing_wire_bytes,
            "latency_s": self.latency_s,
            "routed_worker": self.routed_worker,
            "new_messages": self.new_messages,
        }


@dataclass
class MergedSample:
    """One trajectory as the trainer should see it. Arrays are numpy; see docs/session.md."""

    session_id: str
    status: str
    tokens: np.ndarray  # int32 [n]
    loss_mask: np.ndarray  # uint8 [n]
    rollout_log_probs: np.ndarray  # float32 [n], 0 where loss_mask is 0
    prompt_length: int  # tokens of the first prompt; the response is tokens[prompt_length:]
    routed_experts: np.ndarray | None  # uint8/uint16 [n - 1, layers, top_k], None without R3
    routing_source: np.ndarray | None  # uint8 [n - 1] RoutingSource of each row, None without R3
    weight_versions: list[str | None]  # one per kept turn
    turns: list[dict[str, Any]]  # TurnRecord.summary() of each kept turn
    metadata: dict[str, Any]
    # Per-token policy versions (rl360_ext.sglang.versions contract; policy_versions.py rules).
    # `merge` always sets them; None on a hand-built sample means "not recorded" (UNVERSIONED).
    token_version: np.ndarray | None = None  # int32 [n]
    kv_version: np.ndarray | None = None  # int32 [n]
    routing_version: np.ndarray | None = None  # int32 [n - 1], None without R3
    turn_first_version: np.ndarray | None = None  # int32 [kept turns]
    turn_output_start: np.ndarray | None = None  # int32 [kept turns]: first output token's index
    turn_cached_tokens: np.ndarray | None = None  # int32 [kept turns]: first forward's cache hit
    # SGLang's top-k log-probs (`rl360_ext.sglang.top_logprobs`): one row per generated token, the
    # positions where loss_mask is 1, in order (NO_TOKEN slots where the engine had fewer than k);
    # None when not asked.
    top_logprob_ids: np.ndarray | None = None  # int32 [loss_mask.sum(), k]
    top_logprobs: np.ndarray | None = None  # float32 [loss_mask.sum(), k]

    @property
    def response_length(self) -> int:
        return len(self.tokens) - self.prompt_length

    @property
    def r3_rows_from_prefill_fraction(self) -> float | None:
        """Of the rows of sampled tokens, the fraction that came from a later prefill (None without R3)."""
        return prefill_fraction(self.routing_source)

    def to_json(self) -> dict[str, Any]:
        """A dict orjson serializes (numpy arrays stay arrays; use OPT_SERIALIZE_NUMPY)."""
        return {
            "session_id": self.session_id,
            "status": self.status,
            "tokens": self.tokens,
            "loss_mask": self.loss_mask,
            "rollout_log_probs": self.rollout_log_probs,
            "prompt_length": self.prompt_length,
            "response_length": self.response_length,
            "routed_experts": self.routed_experts,
            "routing_source": self.routing_source,
            "weight_versions": self.weight_versions,
            "turns": self.turns,
            "metadata": self.metadata,
            "token_version": self.token_version,
            "kv_version": self.kv_version,
            "routing_version": self.routing_version,
            "turn_first_version": self.turn_first_version,
            "turn_output_start": self.turn_output_start,
            "turn_cached_tokens": self.turn_cached_tokens,
            "top_logprob_ids": self.top_logprob_ids,
            "top_logprobs": self.top_logprobs,
        }

    def _routing_source_or_prefill(self, rows: int) -> np.ndarray:
        """`routing_source`, else (a hand-built sample with routing but no sources) PREFILL rows."""
        if self.routing_source is not None:
            return np.asarray(self.routing_source, np.uint8)
        return np.full(rows, int(RoutingSource.PREFILL), np.uint8)

    def version_arrays(self) -> VersionArrays:
        """The version arrays, UNVERSIONED-filled where this sample recorded none."""
        n, rows = len(self.tokens), max(len(self.tokens) - 1, 0)
        r3 = self.routed_experts is not None

        def filled(array: np.ndarray | None, length: int) -> np.ndarray:
            return np.full(length, UNVERSIONED, np.int32) if array is None else np.asarray(array, np.int32)

        return VersionArrays(
            token_version=filled(self.token_version, n),
            kv_version=filled(self.kv_version, n),
            routing_source=None if not r3 else self._routing_source_or_prefill(rows),
            routing_version=filled(self.routing_version, rows) if r3 else None,
            turn_first_version=filled(self.turn_first_version, len(self.turns)),
            turn_output_start=self._per_turn(
                self.turn_output_start, lambda t: t["input_start"] + t["input_tokens"]
            ),
            turn_cached_tokens=self._per_turn(self.turn_cached_tokens, lambda t: t["cached_tokens"]),
        )

    def _per_turn(
        self, array: np.ndarray | None, of_summary: Callable[[dict[str, Any]], int]
    ) -> np.ndarray | None:
        """`array`, else (a hand-built or v1 sample) the per-turn fact read from the turn summaries
        when they hold it, else None (not recorded)."""
        if array is not None:
            return np.asarray(array, np.int32)
        try:
            return np.asarray([of_summary(turn) for turn in self.turns], np.int32)
        except KeyError:
            return None


def prefill_fraction(sources: np.ndarray | None) -> float | None:
    """Of the `RoutingSource` rows of sampled tokens (DECODE or REPREFILL), the REPREFILL share."""
    if sources is None:
        return None
    later = int(np.count_nonzero(sources == RoutingSource.REPREFILL))
    sampled = later + int(np.count_nonzero(sources == RoutingSource.DECODE))
    return later / sampled if sampled else 0.0


def kept_turns(turns: Sequence[TurnRecord]) -> list[TurnRecord]:
    """The last segment's turns up to and including the first that finished with length or abort."""
    if not turns:
        return []
    segment = turns[-1].segment
    kept: list[TurnRecord] = []
    for turn in turns:
        if turn.segment != segment:
            continue
        kept.append(turn)
        if turn.finish_reason in ("length", "abort"):
            break
    return kept


def merge(
    turns: Sequence[TurnRecord],
    session_id: str = "",
    metadata: dict[str, Any] | None = None,
    routing_tail_shape: tuple[int, int] | None = None,
    routing_dtype: np.dtype | None = None,
) -> MergedSample:
    """Merge a session's turns (in order) into one sample; see the module docstring for the rules.

    `routing_tail_shape` (layers, top_k) and `routing_dtype` shape an empty routing array when
    the session ran with R3 but has no rows (a one-token sample).
    """
    kept = kept_turns(turns)
    facts = _merge_facts(turns, kept)
    meta = {**(metadata or {}), MERGE_KEY: facts}
    if not kept:
        facts["failure"] = "the session has no turns"
        return _empty(session_id, meta, routing_tail_shape, routing_dtype)
    position = 0
    for turn in kept:
        if turn.input_start != position:
            raise MergeError(f"turn {turn.index} starts at position {turn.input_start}, expected {position}")
        if len(turn.output_logprobs) != len(turn.output_ids):
            raise MergeError(
                f"turn {turn.index} has {len(turn.output_logprobs)} logprobs "
                f"for {len(turn.output_ids)} tokens"
            )
        position = turn.end
    pieces = [a for t in kept for a in (t.input_ids, t.output_ids)]
    tokens = np.concatenate(pieces).astype(np.int32, copy=False)
    loss_mask = np.concatenate([np.full(len(a), i % 2, dtype=np.uint8) for i, a in enumerate(pieces)])
    logprobs = np.concatenate(
        [
            a
            for t in kept
            for a in (np.zeros(len(t.input_ids), np.float32), t.output_logprobs.astype(np.float32))
        ]
    )
    routed = _merge_routing(kept, len(tokens), routing_tail_shape, routing_dtype)
    top_ids, top_values = _merge_top_logprobs(kept)
    versions = version_arrays([t.versions() for t in kept], len(tokens), routed is not None)
    facts["r3_rows_from_prefill_fraction"] = prefill_fraction(versions.routing_source)
    facts["routing_bytes_in_sample"] = 0 if routed is None else int(routed.nbytes)
    status = _STATUS_OF_FINISH.get(kept[-1].finish_reason, FAILED)
    return MergedSample(
        session_id=session_id,
        status=status,
        tokens=tokens,
        loss_mask=loss_mask,
        rollout_log_probs=logprobs,
        prompt_length=len(kept[0].input_ids),
        routed_experts=routed,
        routing_source=versions.routing_source,
        weight_versions=[t.weight_version for t in kept],
        turns=[t.summary() for t in kept],
        metadata=meta,
        token_version=versions.token_version,
        kv_version=versions.kv_version,
        routing_version=versions.routing_version,
        turn_first_version=versions.turn_first_version,
        turn_output_start=versions.turn_output_start,
        turn_cached_tokens=versions.turn_cached_tokens,
        top_logprob_ids=top_ids,
        top_logprobs=top_values,
    )


def _merge_top_logprobs(kept: list[TurnRecord]) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The generated tokens' top-k rows, turn after turn (a later merge only appends rows), or
    (None, None) when no turn has them; turns that disagree (some with, some without, or different
    k) are a MergeError."""
    have = [t.output_top_ids is not None for t in kept]
    if not any(have):
        return None, None
    widths = {t.output_top_ids.shape[1] for t in kept if t.output_top_ids is not None}
    if not all(have) or len(widths) != 1:
        raise MergeError("turns disagree on top-k log-probs (some have none, or different k)")
    (k,) = widths
    ids, values = [], []
    for turn in kept:
        assert turn.output_top_ids is not None and turn.output_top_logprobs is not None
        if turn.output_top_ids.shape != (len(turn.output_ids), k) or turn.output_top_logprobs.shape != (
            len(turn.output_ids),
            k,
        ):
            raise MergeError(f"turn {turn.index}'s top-k log-probs do not have one row per output token")
        ids.append(turn.output_top_ids.astype(np.int32, copy=False))
        values.append(turn.output_top_logprobs.astype(np.float32, copy=False))
    return np.concatenate(ids), np.concatenate(values)


def _merge_routing(
    kept: list[TurnRecord],
    n_tokens: int,
    tail_shape: tuple[int, int] | None,
    dtype: np.dtype | None,
) -> np.ndarray | None:
    with_rows = [t.routing is not None for t in kept]
    if not any(with_rows):
        return None
    if not all(with_rows):
        missing = [t.index for t in kept if t.routing is None]
        raise MergeError(f"turns {missing} have no routing rows while other turns do")
    rows_so_far = 0
    for turn in kept:
        if turn.routing_start != rows_so_far:
            raise MergeError(
                f"turn {turn.index} routing starts at row {turn.routing_start}, expected {rows_so_far}"
            )
        rows = len(turn.routing)  # type: ignore[arg-type]
        sources = None if turn.routing_source is None else len(turn.routing_source)
        if sources != rows:
            raise MergeError(f"turn {turn.index} has {sources} routing sources for {rows} routing rows")
        rows_so_far += rows
    if rows_so_far != n_tokens - 1:
        raise MergeError(f"merged routing has {rows_so_far} rows for {n_tokens} tokens (expected tokens - 1)")
    widest = np.result_type(*[t.routing.dtype for t in kept])  # type: ignore[union-attr]
    if dtype is not None:
        widest = np.result_type(widest, dtype)
    routed = np.concatenate([t.routing.astype(widest, copy=False) for t in kept])  # type: ignore[union-attr]
    if tail_shape is not None and routed.shape[1:] != tail_shape:
        raise MergeError(f"routing rows have shape {routed.shape[1:]}, expected {tail_shape}")
    return routed


def _merge_facts(turns: Sequence[TurnRecord], kept: list[TurnRecord]) -> dict[str, Any]:
    last_segment = turns[-1].segment if turns else 0
    in_last = sum(1 for t in turns if t.segment == last_segment)
    return {
        "turns_total": len(turns),
        "turns_kept": len(kept),
        "turns_dropped_after_truncation": in_last - len(kept),
        "segments": last_segment + 1,
        "turns_in_earlier_segments": len(turns) - in_last,
        "cached_tokens_total": int(sum(t.cached_tokens for t in turns)),
        "prompt_tokens_total": int(sum(t.prompt_tokens for t in turns)),
        "routing_wire_bytes_moved": int(sum(t.routing_wire_bytes for t in turns)),
        "routing_bytes_stored": int(sum(0 if t.routing is None else t.routing.nbytes for t in turns)),
    }


def _empty(
    session_id: str,
    meta: dict[str, Any],
    tail_shape: tuple[int, int] | None,
    dtype: np.dtype | None,
) -> MergedSample:
    routed = None if tail_shape is None else np.zeros((0, *tail_shape), dtype=dtype or np.uint8)
    meta[MERGE_KEY]["r3_rows_from_prefill_fraction"] = None if routed is None else 0.0
    meta[MERGE_KEY]["routing_bytes_in_sample"] = 0
    return MergedSample(
        session_id=session_id,
        status=FAILED,
        tokens=np.zeros(0, np.int32),
        loss_mask=np.zeros(0, np.uint8),
        rollout_log_probs=np.zeros(0, np.float32),
        prompt_length=0,
        routed_experts=routed,
        routing_source=None if routed is None else np.zeros(0, np.uint8),
        weight_versions=[],
        turns=[],
        metadata=meta,
        token_version=np.zeros(0, np.int32),
        kv_version=np.zeros(0, np.int32),
        routing_version=None if routed is None else np.zeros(0, np.int32),
        turn_first_version=np.zeros(0, np.int32),
        turn_output_start=np.zeros(0, np.int32),
        turn_cached_tokens=np.zeros(0, np.int32),
    )


def _reply_indices(segment_turns: Sequence[TurnRecord]) -> list[int]:
    """The message index of each turn's reply in its segment's history (turns in order)."""
    indices: list[int] = []
    for turn in segment_turns:
        indices.append(turn.new_messages if not indices else indices[-1] + 1 + turn.new_messages)
    return indices


def superseded(segment_turns: Sequence[TurnRecord], fork_message_index: int | None) -> bool:
    """Did the fork that ended this segment retry its last turn (Miles' drop_retries rule)?

    It did when the new history keeps the reply of the turn before the last (so it branched right
    there) but not the last turn's reply: that reply was abandoned for the retry. A fork that keeps
    no earlier reply (a rewritten or compacted history) or differs only in tools supersedes nothing.
    """
    if fork_message_index is None or len(segment_turns) < 2:
        return False
    replies = _reply_indices(segment_turns)
    return replies[-2] < fork_message_index <= replies[-1]


def branches(turns: Sequence[TurnRecord], forks: Sequence[dict[str, Any]]) -> list[list[TurnRecord]]:
    """Each history segment's trainable turns, in commit order; a segment left with none is omitted.

    `forks` are the session's fork records (`segment`: the segment the fork started, `message_index`:
    where the history departed). The last segment is whole; an earlier one loses its last turn when
    the fork that ended it retried that turn (`superseded`). Merging a branch's turns with `merge`
    applies the length/abort cut as for any sample.
    """
    by_segment: dict[int, list[TurnRecord]] = {}
    for turn in turns:
        by_segment.setdefault(turn.segment, []).append(turn)
    departed = {fork["segment"]: fork.get("message_index") for fork in forks}
    last = max(by_segment, default=0)
    out: list[list[TurnRecord]] = []
    for segment, segment_turns in sorted(by_segment.items()):
        keep = list(segment_turns)
        if segment != last and superseded(keep, departed.get(segment + 1)):
            keep.pop()
        if keep:
            out.append(keep)
    return out
