"""Merge rules as properties: mask alignment, the truncation rule, routing rows = tokens - 1."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.session.samples.merge import MergeError, TurnRecord, kept_turns, merge
from rl360_ext.session.samples.routing import row_sources

LAYERS, TOP_K = 2, 3


def _rows(positions: np.ndarray) -> np.ndarray:
    return ((positions[:, None, None] * 5 + np.arange(LAYERS)[:, None] + np.arange(TOP_K)) % 251).astype(
        np.uint8
    )


@st.composite
def sessions(draw: st.DrawFn) -> tuple[list[TurnRecord], bool]:
    """Turns as the core records them: contiguous per segment, forks start a new segment."""
    with_routing = draw(st.booleans())
    turns: list[TurnRecord] = []
    segment, position, rows, last_output = -1, 0, 0, range(0)
    for index in range(draw(st.integers(1, 8))):
        if segment < 0 or draw(st.integers(0, 5)) == 0:
            segment, position, rows, last_output = segment + 1, 0, 0, range(0)
        n_in, n_out = draw(st.integers(1, 6)), draw(st.integers(0, 6))
        finish = draw(st.sampled_from(["stop", "stop", "stop", "length", "abort"]))
        inputs = np.arange(position, position + n_in, dtype=np.int32) + 1000
        outputs = np.arange(position + n_in, position + n_in + n_out, dtype=np.int32) + 1000
        end = position + n_in + n_out
        routing = sources = None
        if with_routing:
            routing = _rows(np.arange(rows, end - 1))
            sources = row_sources(rows, len(routing), position + n_in, last_output)
        turns.append(
            TurnRecord(
                index=index,
                segment=segment,
                input_start=position,
                input_ids=inputs,
                output_ids=outputs,
                output_logprobs=-(outputs.astype(np.float32) / 1e4),
                finish_reason=finish,
                weight_version=f"v{index}",
                routing=routing,
                routing_start=rows,
                routing_source=sources,
            )
        )
        position, rows, last_output = end, end - 1, range(position + n_in, end)
    return turns, with_routing


@settings(max_examples=150, deadline=None)
@given(sessions())
def test_merge_properties(case: tuple[list[TurnRecord], bool]) -> None:
    turns, with_routing = case
    sample = merge(turns, session_id="s")
    kept = kept_turns(turns)
    last_segment = turns[-1].segment
    # Truncation rule: the last segment's turns up to the first length/abort turn, nothing after it.
    expected = []
    for turn in (t for t in turns if t.segment == last_segment):
        expected.append(turn.index)
        if turn.finish_reason != "stop":
            break
    assert [t["index"] for t in sample.turns] == expected == [t.index for t in kept]
    status = {"stop": "COMPLETED", "length": "TRUNCATED", "abort": "ABORTED"}[kept[-1].finish_reason]
    assert sample.status == status
    # Mask alignment: 1 exactly on sampled tokens; logprobs only there.
    n = len(sample.tokens)
    assert len(sample.loss_mask) == len(sample.rollout_log_probs) == n
    sampled = np.concatenate([t.output_ids for t in kept])
    assert np.array_equal(sample.tokens[sample.loss_mask == 1], sampled)
    assert np.array_equal(sample.tokens, np.arange(n, dtype=np.int32) + 1000)
    assert np.all(sample.rollout_log_probs[sample.loss_mask == 0] == 0)
    assert np.array_equal(
        sample.rollout_log_probs[sample.loss_mask == 1], -(sampled.astype(np.float32) / 1e4)
    )
    assert sample.prompt_length == len(kept[0].input_ids)
    assert sample.weight_versions == [f"v{t.index}" for t in kept]
    if with_routing:
        assert sample.routed_experts.shape == (n - 1, LAYERS, TOP_K)
        assert len(sample.routing_source) == n - 1
        # No retracts here: the merged sources are the turns' recorded ones, row for row.
        assert np.array_equal(sample.routing_source, np.concatenate([t.routing_source for t in kept]))
        assert np.array_equal(sample.routed_experts, _rows(np.arange(n - 1)))
    else:
        assert sample.routed_experts is None and sample.routing_source is None


def _turn(
    index: int, start: int, n_in: int, n_out: int, routing_start: int = 0, rows: int | None = None
) -> TurnRecord:
    end = start + n_in + n_out
    rows = end - 1 - routing_start if rows is None else rows
    return TurnRecord(
        index=index,
        segment=0,
        input_start=start,
        input_ids=np.zeros(n_in, np.int32),
        output_ids=np.ones(n_out, np.int32),
        output_logprobs=np.zeros(n_out, np.float32),
        finish_reason="stop",
        routing=np.zeros((rows, LAYERS, TOP_K), np.uint8),
        routing_start=routing_start,
        routing_source=np.zeros(rows, np.uint8),
    )


def test_a_gap_between_turns_is_an_error() -> None:
    with pytest.raises(MergeError, match="starts at position 9, expected 7"):
        merge([_turn(0, 0, 4, 3), _turn(1, 9, 2, 2, routing_start=6)])


def test_routing_that_does_not_cover_tokens_minus_one_is_an_error() -> None:
    with pytest.raises(MergeError, match="routing starts at row 5, expected 6"):
        merge([_turn(0, 0, 4, 3), _turn(1, 7, 2, 2, routing_start=5)])
    with pytest.raises(MergeError, match="rows for 7 tokens"):
        merge([_turn(0, 0, 4, 3, rows=7)])


@pytest.mark.parametrize("sources", [None, np.zeros(2, np.uint8)])
def test_a_turn_whose_row_sources_do_not_match_its_rows_is_an_error(sources: np.ndarray | None) -> None:
    turn = _turn(0, 0, 2, 2)
    turn.routing_source = sources
    with pytest.raises(
        MergeError, match=f"turn 0 has {None if sources is None else 2} routing sources for 3"
    ):
        merge([turn])
