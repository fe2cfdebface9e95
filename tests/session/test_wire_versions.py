"""Merged-sample wire v2: the per-token version arrays round trip; v2 reads v1; other versions refused."""

from __future__ import annotations

import struct
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rl360_ext.session.merge import MergedSample
from rl360_ext.session.wire import VERSION, WireFormatError, decode, encode
from rl360_ext.sglang.versions import UNVERSIONED

VERSION_FIELDS = (
    "token_version",
    "kv_version",
    "routing_source",
    "routing_version",
    "turn_first_version",
    "turn_output_start",
    "turn_cached_tokens",
)


@st.composite
def versioned_samples(draw: st.DrawFn) -> MergedSample:
    n = draw(st.integers(0, 30))
    rows = max(n - 1, 0)
    r3 = draw(st.booleans())
    turns = draw(st.integers(0, 3))
    version = st.integers(-1, 2**31 - 1)
    routed = draw(hnp.arrays(np.uint8, (rows, 2, 1))) if r3 else None
    recorded = draw(st.booleans())  # False: a hand-built sample without version arrays

    def arr(dtype: type, length: int, elements: st.SearchStrategy[int]) -> np.ndarray | None:
        return draw(hnp.arrays(dtype, length, elements=elements)) if recorded else None

    return MergedSample(
        session_id="s",
        status="COMPLETED",
        tokens=draw(hnp.arrays(np.int32, n)),
        loss_mask=draw(hnp.arrays(np.uint8, n, elements=st.integers(0, 1))),
        rollout_log_probs=np.zeros(n, np.float32),
        prompt_length=0,
        routed_experts=routed,
        routing_sources=draw(hnp.arrays(np.uint8, rows, elements=st.integers(0, 2))) if r3 else None,
        weight_versions=[],
        turns=[{"index": i} for i in range(turns)],
        metadata={},
        token_version=arr(np.int32, n, version),
        kv_version=arr(np.int32, n, version),
        routing_source=arr(np.uint8, rows, st.integers(0, 2)) if r3 else None,
        routing_version=arr(np.int32, rows, version) if r3 else None,
        turn_first_version=arr(np.int32, turns, version),
        turn_output_start=arr(np.int32, turns, st.integers(0, n)),
        turn_cached_tokens=arr(np.int32, turns, st.integers(0, n)),
    )


@settings(max_examples=200, deadline=None)
@given(versioned_samples())
def test_v2_round_trip(sample: MergedSample) -> None:
    decoded = decode(encode(sample))
    expected = sample.version_arrays()  # a sample without arrays is written UNVERSIONED-filled
    for name in VERSION_FIELDS:
        before, after = getattr(expected, name), getattr(decoded, name)
        if before is None:
            assert after is None, name
        else:
            assert after.dtype == before.dtype and np.array_equal(after, before), name
    assert np.array_equal(decoded.tokens, sample.tokens)
    if sample.token_version is None:
        assert (decoded.token_version == UNVERSIONED).all()


@settings(max_examples=100, deadline=None)
@given(versioned_samples())
def test_v2_reads_v1(sample: MergedSample) -> None:
    buffer = encode(sample, version=1)
    assert struct.unpack_from("<H", buffer, 4)[0] == 1
    decoded = decode(buffer)
    for name in VERSION_FIELDS:
        assert getattr(decoded, name) is None, name  # v1 carries none: "not recorded"
    filled = decoded.version_arrays()
    assert (filled.token_version == UNVERSIONED).all() and len(filled.token_version) == len(sample.tokens)
    assert (filled.routing_version is None) == (sample.routed_experts is None)
    unversioned = replace(sample, **dict.fromkeys(VERSION_FIELDS))
    assert encode(unversioned, version=1) == buffer  # v1 bytes never depended on the arrays


def test_other_versions_are_refused_naming_them() -> None:
    sample = MergedSample(
        "s",
        "COMPLETED",
        np.arange(3, dtype=np.int32),
        np.ones(3, np.uint8),
        np.zeros(3, np.float32),
        1,
        None,
        None,
        [],
        [],
        {},
    )
    buffer = bytearray(encode(sample))
    assert struct.unpack_from("<H", buffer, 4)[0] == VERSION == 2
    struct.pack_into("<H", buffer, 4, 3)
    with pytest.raises(WireFormatError, match=r"format version 3 is not supported .*reads 1 and 2"):
        decode(bytes(buffer))
    with pytest.raises(WireFormatError, match="cannot write merged-sample format version 7"):
        encode(sample, version=7)
