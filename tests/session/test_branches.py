"""`merge.branches`: every history segment a trainer can use, with Miles' drop_retries rule."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.session.samples.merge import TurnRecord, branches, merge, superseded


def _turns(segments: list[list[int]]) -> list[TurnRecord]:
    """Turns of segments given as each turn's new-message count; each appends 2 tokens, samples 1."""
    turns: list[TurnRecord] = []
    for segment, counts in enumerate(segments):
        start = 0
        for new in counts:
            turns.append(
                TurnRecord(
                    index=len(turns),
                    segment=segment,
                    input_start=start,
                    input_ids=np.array([1, 2], np.int32),
                    output_ids=np.array([3], np.int32),
                    output_logprobs=np.array([-0.5], np.float32),
                    finish_reason="stop",
                    new_messages=new,
                )
            )
            start += 3
    return turns


def _reply_indices(counts: list[int]) -> list[int]:
    out: list[int] = []
    for new in counts:
        out.append(new if not out else out[-1] + 1 + new)
    return out


@st.composite
def forked_sessions(draw: st.DrawFn) -> tuple[list[list[int]], list[dict[str, Any]]]:
    segments = draw(st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=4), min_size=1, max_size=4))
    forks = []
    for segment, counts in enumerate(segments[:-1]):
        held = _reply_indices(counts)[-1] + 1
        index = draw(st.one_of(st.none(), st.integers(0, held)))
        forks.append({"turn": 0, "segment": segment + 1, "message_index": index, "reason": "x"})
    return segments, forks


@settings(max_examples=200, deadline=None)
@given(forked_sessions())
def test_branches_keep_every_segment_but_a_retried_last_turn(
    case: tuple[list[list[int]], list[dict[str, Any]]],
) -> None:
    segments, forks = case
    turns = _turns(segments)
    out = branches(turns, forks)
    by_segment = {b[0].segment: b for b in out}
    assert [b[0].segment for b in out] == sorted(by_segment)  # commit order
    assert by_segment[len(segments) - 1] == [t for t in turns if t.segment == len(segments) - 1]
    for segment, counts in enumerate(segments[:-1]):
        own = [t for t in turns if t.segment == segment]
        replies = _reply_indices(counts)
        index = forks[segment]["message_index"]
        retried = index is not None and len(counts) > 1 and replies[-2] < index <= replies[-1]
        assert superseded(own, index) is retried
        expected = own[:-1] if retried else own
        assert by_segment.get(segment, []) == expected
        if segment in by_segment:
            merged = merge(by_segment[segment])
            assert int(merged.loss_mask.sum()) == len(expected)  # each kept reply trained once


def test_a_rewritten_history_supersedes_nothing_and_a_retry_only_the_last_turn() -> None:
    turns = _turns([[1, 1, 1], [1]])  # replies at messages 1, 3, 5
    compacted = {"segment": 1, "message_index": 0}
    assert branches(turns, [compacted])[0] == turns[:3]
    retry = {"segment": 1, "message_index": 4}  # keeps the reply at 3, not the one at 5
    assert branches(turns, [retry])[0] == turns[:2]
    rewind = {"segment": 1, "message_index": 2}  # goes back two turns: Miles keeps the old leaf
    assert branches(turns, [rewind])[0] == turns[:3]
    tools_changed = {"segment": 1, "message_index": None}
    assert branches(turns, [tools_changed])[0] == turns[:3]
