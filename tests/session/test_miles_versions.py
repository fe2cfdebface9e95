"""Versions in the Miles sample: every span in `weight_versions`, the arrays in metadata, cut like tokens."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.session.samples.merge import TurnRecord, merge
from rl360_ext.session.samples.miles_sample import to_miles_sample
from rl360_ext.sglang.versions import TURN_CACHED_TOKENS, TURN_OUTPUT_START, UNVERSIONED, VERSIONS_KEY
from rl360_ext.train.staleness import parse_versions


@st.composite
def turn_lists(draw: st.DrawFn) -> tuple[list[TurnRecord], bool]:
    r3 = draw(st.booleans())
    turns: list[TurnRecord] = []
    position, version = 0, draw(st.integers(0, 3))
    for index in range(draw(st.integers(1, 3))):
        appended = draw(st.integers(1, 5))
        out = draw(st.integers(1, 6))
        cuts = sorted(draw(st.sets(st.integers(1, out - 1), max_size=2))) if out > 1 else []
        spans, start = [], 0
        for end in [*cuts, out]:
            spans.append({"version": str(version), "start": start, "end": end})
            start, version = end, version + draw(st.integers(1, 2))
        version -= 1
        rows = appended + out - (1 if index == 0 else 0)
        turns.append(
            TurnRecord(
                index=index,
                segment=0,
                input_start=position,
                input_ids=np.full(appended, 7, np.int32),
                output_ids=np.full(out, 9, np.int32),
                output_logprobs=np.zeros(out, np.float32),
                finish_reason="stop",
                weight_version=spans[-1]["version"],
                weight_versions=spans,
                prompt_tokens=position + appended,
                cached_tokens=draw(st.integers(0, position)),
                routing=np.zeros((rows, 1, 1), np.uint8) if r3 else None,
                routing_start=max(position - 1, 0),
                routing_source=np.zeros(rows, np.uint8) if r3 else None,
            )
        )
        position += appended + out
    return turns, r3


@settings(max_examples=200, deadline=None)
@given(turn_lists(), st.one_of(st.none(), st.integers(1, 40)))
def test_all_spans_and_arrays_cut_like_tokens(
    case: tuple[list[TurnRecord], bool], max_seq_len: int | None
) -> None:
    turns, r3 = case
    merged = merge(turns, "s")
    miles = to_miles_sample(merged, lambda ids: "x" * len(ids), max_seq_len)
    if miles is None:
        return
    n = len(miles.tokens)
    arrays = miles.metadata[VERSIONS_KEY]
    assert len(arrays["token_version"]) == len(arrays["kv_version"]) == n
    assert arrays["token_version"] == merged.token_version[:n].tolist()
    if r3:
        assert len(arrays["routing_source"]) == len(arrays["routing_version"]) == n - 1
    else:
        assert arrays["routing_source"] is None and arrays["routing_version"] is None
    kept = miles.metadata["merge"]["turns"]
    assert len(arrays["turn_first_version"]) == len(kept)
    assert arrays[TURN_OUTPUT_START] == [t["input_start"] + t["input_tokens"] for t in kept]
    assert arrays[TURN_CACHED_TOKENS] == [t["cached_tokens"] for t in kept]  # no retracts here
    parse_versions(arrays, n)  # the training-side reader accepts what the producer emits
    # Miles' figures become token-true: oldest version and "mixed" from weight_versions alone
    sampled = [v for v in arrays["token_version"] if v != UNVERSIONED]
    assert min(int(v) for v in miles.weight_versions) == min(sampled)
    assert (len(set(miles.weight_versions)) > 1) == (len(set(sampled)) > 1)
    expected = [
        s["version"]
        for t in kept
        for s in t["weight_versions"]
        if s["start"] < min(t["output_tokens"], n - t["input_start"] - t["input_tokens"]) or s["start"] == 0
    ]
    assert miles.weight_versions == expected
