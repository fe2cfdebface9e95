"""Top-k log-probs (SGLang's top_logprobs_num): parsing, the session's opt-in merge, wire version 4."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rl360_ext.session.samples import wire
from rl360_ext.session.samples.merge import MergedSample, MergeError, TurnRecord, merge
from rl360_ext.session.samples.miles_sample import to_miles_sample
from rl360_ext.session.samples.wire import WireFormatError, decode, encode
from rl360_ext.sglang.top_logprobs import (
    NO_TOKEN,
    TOP_LOGPROBS_KEY,
    TopLogprobsError,
    parse_output_top_logprobs,
)

SYSTEM = {"role": "system", "content": "You are a helpful coding agent."}
USER = {"role": "user", "content": "Run the tests and fix the bug."}


def test_parse_reads_sglang_entries_and_names_a_bad_one() -> None:
    entries = [[[-0.1, 7, None], [-2.5, 3, "x"]], None, [[-0.7, 1, None]]]
    ids, values = parse_output_top_logprobs(entries, 3, 2)
    assert ids.tolist() == [[7, 3], [NO_TOKEN, NO_TOKEN], [1, NO_TOKEN]]
    np.testing.assert_allclose(values, [[-0.1, -2.5], [0, 0], [-0.7, 0]], rtol=1e-6)
    with pytest.raises(TopLogprobsError, match="2 entries for 3 output tokens"):
        parse_output_top_logprobs(entries[:2], 3, 2)
    with pytest.raises(TopLogprobsError, match=r"output_top_logprobs\[0\]\[1\] has token -3"):
        parse_output_top_logprobs([[[-0.1, 7, None], [-0.2, -3, None]]], 1, 2)
    with pytest.raises(TopLogprobsError, match=r"output_top_logprobs\[0\] must be a list of at most 1"):
        parse_output_top_logprobs([[[-0.1, 7, None], [-0.2, 3, None]]], 1, 1)
    with pytest.raises(TopLogprobsError, match=r"\[0\]\[0\] must be \[logprob, token_id, text\]"):
        parse_output_top_logprobs([[["a"]]], 1, 1)


def _turn(index: int, start: int, inputs: int, outputs: int, k: int | None) -> TurnRecord:
    top = None if k is None else np.arange(outputs * k, dtype=np.int32).reshape(outputs, k)
    return TurnRecord(
        index=index,
        segment=0,
        input_start=start,
        input_ids=np.arange(inputs, dtype=np.int32),
        output_ids=np.arange(outputs, dtype=np.int32),
        output_logprobs=np.full(outputs, -0.5, np.float32),
        finish_reason="stop",
        output_top_ids=top,
        output_top_logprobs=None if k is None else -np.ones((outputs, k), np.float32),
    )


def test_merge_keeps_one_top_k_row_per_generated_token() -> None:
    first = merge([_turn(0, 0, 3, 2, 2)])
    sample = merge([_turn(0, 0, 3, 2, 2), _turn(1, 5, 2, 3, 2)])
    assert sample.top_logprob_ids is not None and sample.top_logprob_ids.shape == (5, 2) == (
        int(sample.loss_mask.sum()),
        2,
    )
    assert sample.top_logprob_ids.tolist() == [[0, 1], [2, 3], [0, 1], [2, 3], [4, 5]]
    assert first.top_logprob_ids is not None
    assert np.array_equal(sample.top_logprob_ids[: len(first.top_logprob_ids)], first.top_logprob_ids)
    assert merge([_turn(0, 0, 3, 2, None)]).top_logprob_ids is None  # opt-in: none asked, none kept
    with pytest.raises(MergeError, match="disagree on top-k"):
        merge([_turn(0, 0, 3, 2, 2), _turn(1, 5, 2, 3, None)])


@st.composite
def topk_samples(draw: st.DrawFn) -> MergedSample:
    n, k = draw(st.integers(0, 30)), draw(st.integers(1, 6))
    mask = draw(hnp.arrays(np.uint8, n, elements=st.integers(0, 1)))
    rows = int(mask.sum())
    return MergedSample(
        "s",
        "COMPLETED",
        draw(hnp.arrays(np.int32, n)),
        mask,
        draw(hnp.arrays(np.float32, n, elements=st.floats(-20, 0, width=32))),
        0,
        None,
        None,
        [],
        [],
        {},
        top_logprob_ids=draw(hnp.arrays(np.int32, (rows, k), elements=st.integers(-1, 1000))),
        top_logprobs=draw(hnp.arrays(np.float32, (rows, k), elements=st.floats(-30, 0, width=32))),
    )


@settings(max_examples=100, deadline=None)
@given(topk_samples())
def test_wire_v4_round_trips_top_k(sample: MergedSample) -> None:
    decoded = decode(encode(sample))
    assert decoded.top_logprob_ids is not None and decoded.top_logprobs is not None
    assert np.array_equal(decoded.top_logprob_ids, sample.top_logprob_ids)
    assert np.array_equal(decoded.top_logprobs, sample.top_logprobs)
    assert np.array_equal(decoded.tokens, sample.tokens)


def test_older_formats_and_readers_refuse_top_k_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    sample = merge([_turn(0, 0, 3, 2, 2)])
    with pytest.raises(WireFormatError, match="top-k log-probs need merged-sample format version 4, not 3"):
        encode(sample, version=3)
    buffer = encode(sample)
    assert struct.unpack_from("<HH", buffer, 4) == (4, wire.FLAG_VERSIONS | wire.FLAG_TOP_LOGPROBS)
    assert struct.unpack_from("<H", buffer, 30)[0] == 2
    monkeypatch.setattr(wire, "READS", (1, 2, 3))  # the version-3 codec, as deployed before
    with pytest.raises(
        WireFormatError, match=r"format version 4 is not supported \(this codec reads 1, 2 and 3\)"
    ):
        decode(buffer)
    monkeypatch.undo()
    plain = merge([_turn(0, 0, 3, 2, None)])
    assert decode(encode(plain, version=3)).top_logprob_ids is None  # a v3 buffer reads as before
    damaged = bytearray(buffer)
    struct.pack_into("<H", damaged, 30, 0)
    with pytest.raises(WireFormatError, match="flags say top-k log-probs present, header k is 0"):
        decode(bytes(damaged))


def test_miles_sample_carries_the_response_rows() -> None:
    sample = merge([_turn(0, 0, 3, 2, 2), _turn(1, 5, 2, 3, 2)])
    miles = to_miles_sample(sample, lambda ids: "")
    assert miles is not None
    rows = miles.metadata[TOP_LOGPROBS_KEY]
    assert len(rows["ids"]) == miles.response_length == 7
    assert rows["ids"][0] == [0, 1] and rows["ids"][2] == [NO_TOKEN, NO_TOKEN]
    plain = to_miles_sample(merge([_turn(0, 0, 3, 2, None)]), lambda ids: "")
    assert plain is not None and TOP_LOGPROBS_KEY not in plain.metadata


async def test_session_asks_and_keeps_top_k_only_when_configured(make_core) -> None:
    for k in (0, 3):
        core, backend = make_core(top_logprobs_num=k)
        sid = core.create({}).id
        await core.chat(sid, {"messages": [SYSTEM, USER]})
        sample = await core.merged(sid)
        assert backend.calls[-1].get("top_logprobs_num", 0) == k
        if not k:
            assert sample.top_logprob_ids is None
            continue
        generated = sample.loss_mask.astype(bool)
        assert sample.top_logprob_ids.shape == (int(generated.sum()), k)
        assert np.array_equal(sample.top_logprob_ids[:, 0], sample.tokens[generated])


def test_miles_sample_cut_by_max_seq_len_keeps_the_rows_it_keeps() -> None:
    sample = merge([_turn(0, 0, 3, 2, 2), _turn(1, 5, 2, 3, 2)])
    miles = to_miles_sample(sample, lambda ids: "", max_seq_len=8)  # the second turn's output cut to 1
    assert miles is not None
    assert miles.metadata[TOP_LOGPROBS_KEY]["ids"] == [[0, 1], [2, 3], [NO_TOKEN] * 2, [NO_TOKEN] * 2, [0, 1]]
    bad = MergedSample(
        **{
            **vars(sample),
            "top_logprob_ids": sample.top_logprob_ids[:2],
            "top_logprobs": sample.top_logprobs[:2],
        }
    )
    with pytest.raises(ValueError, match="2 rows for 5 generated tokens"):
        to_miles_sample(bad, lambda ids: "")
    with pytest.raises(WireFormatError, match=r"must both be \[5 generated tokens, k\]"):
        encode(bad)
