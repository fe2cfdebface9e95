"""The merged-sample wire format: round trip, zero-copy decode, refusal of foreign buffers."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rl360_ext.session.samples.merge import MergedSample
from rl360_ext.session.samples.wire import ALIGN, HEADER_SIZE, WireFormatError, decode, encode


@st.composite
def samples(draw: st.DrawFn) -> MergedSample:
    n = draw(st.integers(0, 40))
    routing = draw(st.sampled_from([None, np.uint8, np.dtype("<u2")]))
    layers, top_k = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    rows = max(n - 1, 0)
    routed = sources = None
    if routing is not None:
        routed = draw(hnp.arrays(routing, (rows, layers, top_k)))
        sources = draw(hnp.arrays(np.uint8, rows, elements=st.integers(0, 2)))
    text = st.text(max_size=8)
    return MergedSample(
        session_id=draw(text),
        status=draw(st.sampled_from(["COMPLETED", "TRUNCATED", "ABORTED", "FAILED"])),
        tokens=draw(hnp.arrays(np.int32, n)),
        loss_mask=draw(hnp.arrays(np.uint8, n, elements=st.integers(0, 1))),
        rollout_log_probs=draw(hnp.arrays(np.float32, n, elements=st.floats(-50, 0, width=32))),
        prompt_length=draw(st.integers(0, n)),
        routed_experts=routed,
        routing_source=sources,
        weight_versions=draw(st.lists(st.one_of(st.none(), text), max_size=4)),
        turns=draw(
            st.lists(st.fixed_dictionaries({"index": st.integers(0, 9), "finish_reason": text}), max_size=3)
        ),
        metadata=draw(st.dictionaries(text, st.one_of(st.integers(-5, 5), text, st.none()), max_size=4)),
    )


@settings(max_examples=150, deadline=None)
@given(samples())
def test_round_trip(sample: MergedSample) -> None:
    decoded = decode(encode(sample))
    for name in ("tokens", "loss_mask", "rollout_log_probs", "routed_experts", "routing_source"):
        before, after = getattr(sample, name), getattr(decoded, name)
        if before is None:
            assert after is None
        else:
            assert after.dtype == before.dtype and np.array_equal(after, before)
    for name in ("session_id", "status", "prompt_length", "weight_versions", "turns", "metadata"):
        assert getattr(decoded, name) == getattr(sample, name)


def _sample(n: int = 6) -> MergedSample:
    return MergedSample(
        session_id="s",
        status="COMPLETED",
        tokens=np.arange(n, dtype=np.int32),
        loss_mask=np.ones(n, np.uint8),
        rollout_log_probs=np.zeros(n, np.float32),
        prompt_length=2,
        routed_experts=np.arange((n - 1) * 8, dtype=np.uint8).reshape(n - 1, 4, 2),
        routing_source=np.zeros(n - 1, np.uint8),
        weight_versions=["v"],
        turns=[],
        metadata={},
    )


def test_decode_is_zero_copy_and_aligned() -> None:
    buffer = encode(_sample())
    decoded = decode(buffer)
    views = (decoded.tokens, decoded.rollout_log_probs, decoded.loss_mask, decoded.routed_experts)
    for array in (*views, decoded.routing_source, decoded.token_version):
        assert not array.flags.owndata and not array.flags.writeable  # a view on the immutable buffer
        assert np.shares_memory(array, np.frombuffer(buffer, np.uint8))
    assert decoded.tokens.ctypes.data % 4 == 0
    address = np.frombuffer(buffer, np.uint8).ctypes.data
    assert (decoded.routed_experts.ctypes.data - address) % ALIGN == 0


def test_header_is_little_endian_and_documented() -> None:
    buffer = encode(_sample(6))
    magic, version, flags, n, rows, layers, top_k, code = struct.unpack_from("<4sHHQQHHB", buffer)
    assert (magic, version, flags, n, rows, layers, top_k, code) == (b"RL3S", 4, 3, 6, 5, 4, 2, 1)
    assert np.frombuffer(buffer, "<i4", 6, HEADER_SIZE).tolist() == list(range(6))


def test_foreign_or_damaged_buffers_are_refused() -> None:
    buffer = encode(_sample())
    with pytest.raises(WireFormatError, match="magic"):
        decode(b"JSON" + buffer[4:])
    with pytest.raises(WireFormatError, match="version 9"):
        decode(buffer[:4] + struct.pack("<H", 9) + buffer[6:])
    with pytest.raises(WireFormatError):
        decode(buffer[:-3])
    with pytest.raises(WireFormatError, match="shorter than"):
        decode(buffer[:10])


def test_routing_rows_must_be_tokens_minus_one() -> None:
    sample = _sample()
    sample.routed_experts = sample.routed_experts[:-1]
    with pytest.raises(WireFormatError, match="expected \\[5, layers, top_k\\]"):
        encode(sample)
    sample = _sample()
    sample.routed_experts = sample.routed_experts.astype(np.int32)
    with pytest.raises(WireFormatError, match="not uint8 or uint16"):
        encode(sample)
