"""Merged-sample wire v3: the per-token version arrays and row sources round trip; v3 reads v2 and
v1 (whose row sources are legacy codes, converted both ways); other versions and codes refused."""

from __future__ import annotations

import struct
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rl360_ext.session.samples.merge import MergedSample
from rl360_ext.session.samples.wire import ALIGN, HEADER_SIZE, VERSION, WireFormatError, decode, encode
from rl360_ext.sglang.versions import UNVERSIONED, RoutingSource

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


def _assert_same(decoded: MergedSample, sample: MergedSample, names: tuple[str, ...]) -> None:
    expected = sample.version_arrays()  # a sample without arrays is written UNVERSIONED-filled
    for name in names:
        before, after = getattr(expected, name), getattr(decoded, name)
        if before is None:
            assert after is None, name
        else:
            assert after.dtype == before.dtype and np.array_equal(after, before), name


@settings(max_examples=200, deadline=None)
@given(versioned_samples())
def test_v3_round_trip(sample: MergedSample) -> None:
    decoded = decode(encode(sample))
    _assert_same(decoded, sample, VERSION_FIELDS)
    assert np.array_equal(decoded.tokens, sample.tokens)
    if sample.token_version is None:
        assert (decoded.token_version == UNVERSIONED).all()
    if sample.routed_experts is not None and sample.routing_source is None:
        assert (decoded.routing_source == RoutingSource.PREFILL).all()  # a hand-built sample's rows


@settings(max_examples=100, deadline=None)
@given(versioned_samples())
def test_v3_reads_v2(sample: MergedSample) -> None:
    buffer = encode(sample, version=2)
    assert struct.unpack_from("<H", buffer, 4)[0] == 2
    _assert_same(decode(buffer), sample, VERSION_FIELDS)


@settings(max_examples=100, deadline=None)
@given(versioned_samples())
def test_v3_reads_v1(sample: MergedSample) -> None:
    buffer = encode(sample, version=1)
    assert struct.unpack_from("<H", buffer, 4)[0] == 1
    decoded = decode(buffer)
    for name in VERSION_FIELDS:
        if name != "routing_source":
            assert getattr(decoded, name) is None, name  # v1 carries none: "not recorded"
    # v1's row sources are legacy codes: the conversions there and back agree on every row.
    _assert_same(decoded, sample, ("routing_source",))
    filled = decoded.version_arrays()
    assert (filled.token_version == UNVERSIONED).all() and len(filled.token_version) == len(sample.tokens)
    assert (filled.routing_version is None) == (sample.routed_experts is None)
    unversioned = replace(sample, **dict.fromkeys(set(VERSION_FIELDS) - {"routing_source"}))
    assert encode(unversioned, version=1) == buffer  # v1 bytes never depended on the version arrays


def _r3_sample(sources: list[int]) -> MergedSample:
    n = len(sources) + 1
    return MergedSample(
        session_id="s",
        status="COMPLETED",
        tokens=np.arange(n, dtype=np.int32),
        loss_mask=np.ones(n, np.uint8),
        rollout_log_probs=np.zeros(n, np.float32),
        prompt_length=1,
        routed_experts=np.zeros((n - 1, 1, 1), np.uint8),
        routing_source=np.asarray(sources, np.uint8),
        weight_versions=[],
        turns=[],
        metadata={},
    )


# The sections of a 4-token sample with 3 one-byte routing rows: tokens at 64, log probs at 128,
# loss mask at 192, routed_experts at 256, then the row sources at 320 (v1, v2 legacy, and v3).
ROW_SOURCES_AT = HEADER_SIZE + 4 * ALIGN


@pytest.mark.parametrize("version", [1, 2])
def test_legacy_row_source_codes_are_the_ones_versions_1_and_2_wrote(version: int) -> None:
    sources = [RoutingSource.DECODE, RoutingSource.PREFILL, RoutingSource.REPREFILL]
    buffer = encode(_r3_sample(sources), version=version)
    # docs/session.md: 0 the prefill of a prompt token, 1 the decode step, 2 a later prefill.
    assert list(buffer[ROW_SOURCES_AT : ROW_SOURCES_AT + 3]) == [1, 0, 2]
    assert decode(buffer).routing_source.tolist() == sources


def test_v2_reads_its_routing_source_section_not_the_legacy_one() -> None:
    sources = [RoutingSource.DECODE, RoutingSource.REPREFILL, RoutingSource.DECODE]
    buffer = bytearray(encode(_r3_sample(sources), version=2))
    buffer[ROW_SOURCES_AT : ROW_SOURCES_AT + 3] = bytes([1, 1, 1])  # an older writer's unrelabelled rows
    assert decode(bytes(buffer)).routing_source.tolist() == sources


def test_v3_writes_routing_source_beside_the_routing() -> None:
    buffer = encode(_r3_sample([RoutingSource.REPREFILL, RoutingSource.DECODE, RoutingSource.PREFILL]))
    assert list(buffer[ROW_SOURCES_AT : ROW_SOURCES_AT + 3]) == [2, 0, 1]


def test_row_source_codes_outside_the_vocabulary_are_refused() -> None:
    with pytest.raises(WireFormatError, match=r"routing_source holds code 3, outside \[0, 3\)"):
        encode(_r3_sample([0, 3, 1]))
    for version, name in ((3, "routing_source"), (1, "version-1 routing_sources")):
        buffer = bytearray(encode(_r3_sample([0, 1, 2]), version=version))
        buffer[ROW_SOURCES_AT + 1] = 7
        with pytest.raises(WireFormatError, match=f"{name} holds code 7"):
            decode(bytes(buffer))


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
    assert struct.unpack_from("<H", buffer, 4)[0] == VERSION == 4
    struct.pack_into("<H", buffer, 4, 5)
    with pytest.raises(WireFormatError, match=r"format version 5 is not supported .*reads 1, 2, 3 and 4"):
        decode(bytes(buffer))
    with pytest.raises(WireFormatError, match="cannot write merged-sample format version 7"):
        encode(sample, version=7)
