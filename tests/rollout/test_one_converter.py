"""One trajectory, one Miles sample: the generate hook and the `/samples` wire agree field by field.

The wire path is decoded the way Miles' `decode_samples_and_merge_input_sample`
(miles/rollout/session/samples/codec.py) overlays it on the input sample: tensor-list fields as
Python lists, routing as an int32 array, status through `Sample.Status`, metadata merged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import safetensors.numpy
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.rollout.sample import Sample
from rl360_ext.rollout.sample_fill import fill_from_merged
from rl360_ext.session.samples import miles_wire
from rl360_ext.session.samples.merge import MergedSample, TurnRecord, merge

LAYERS, TOP_K = 2, 3
TENSOR_LISTS = ("tokens", "loss_mask", "rollout_log_probs")


def decode(ids: Sequence[int]) -> str:
    return "".join(f"<{i}>" for i in ids)


def wire_sample(merged: MergedSample, max_seq_len: int | None) -> Sample | None:
    """The sample Miles' stock generate gets from `/samples`, or None when the reply has none."""
    tensors = safetensors.numpy.load(miles_wire.encode(merged, decode, max_seq_len))
    meta = json.loads(tensors.pop(miles_wire.SAMPLES_META_KEY).tobytes())
    if not meta["samples"]:
        return None
    (one,) = meta["samples"]
    sample = Sample()
    for name in TENSOR_LISTS:
        setattr(sample, name, tensors[f"{name}.0"].tolist())
    routed = "rollout_routed_experts"
    sample.rollout_routed_experts = None if routed in one["nulls"] else tensors[f"{routed}.0"]
    sample.response, sample.response_length = one["response"], one["response_length"]
    sample.status = Sample.Status(one["status"])
    sample.weight_versions = list(one["weight_versions"])
    sample.prefix_cache_info = Sample.PrefixCacheInfo.from_dict(one["prefix_cache_info"])
    sample.metadata.update(one["metadata"])
    return sample


@st.composite
def trajectories(draw: st.DrawFn) -> tuple[MergedSample, int | None]:
    r3 = draw(st.booleans())
    turns: list[TurnRecord] = []
    position = 0
    for index in range(draw(st.integers(0, 5))):
        n_in, n_out = draw(st.integers(1, 6)), draw(st.integers(0, 5))
        finish = draw(st.sampled_from(["stop", "stop", "length", "abort"]))
        end = position + n_in + n_out
        rows_from = max(position - 1, 0)
        turns.append(
            TurnRecord(
                index=index,
                segment=0,
                input_start=position,
                input_ids=np.arange(position, position + n_in, dtype=np.int32) + 1000,
                output_ids=np.arange(position + n_in, end, dtype=np.int32) + 2000,
                output_logprobs=-np.linspace(0.1, 1.0, n_out, dtype=np.float32),
                finish_reason=finish,
                weight_version=draw(st.sampled_from([None, "v0", "v1"])),
                prompt_tokens=position + n_in,
                cached_tokens=position,
                routing=(np.arange((end - 1 - rows_from) * LAYERS * TOP_K) % 250)
                .astype(np.uint8)
                .reshape(-1, LAYERS, TOP_K)
                if r3
                else None,
                routing_start=rows_from,
                routing_source=np.zeros(end - 1 - rows_from, np.uint8) if r3 else None,
            )
        )
        position = end
        if finish != "stop":
            break
    merged = merge(
        turns,
        "sid",
        {"task": "t", "session": {"routing_key": "sid"}},
        routing_tail_shape=(LAYERS, TOP_K) if r3 else None,
    )
    max_seq_len = draw(st.none() | st.integers(1, max(position, 1) + 3))
    return merged, max_seq_len


@settings(max_examples=300, deadline=None)
@given(trajectories())
def test_the_generate_hook_and_the_samples_wire_give_the_same_sample(
    case: tuple[MergedSample, int | None],
) -> None:
    merged, max_seq_len = case
    hook = Sample()
    filled, unusable = fill_from_merged(hook, merged, decode, max_seq_len)
    wire = wire_sample(merged, max_seq_len) if len(merged.tokens) else None
    if wire is None or wire.response_length == 0:
        assert filled is None and unusable is not None
        return
    assert filled is not None
    for name in (*TENSOR_LISTS, "response", "response_length", "status", "weight_versions"):
        assert getattr(hook, name) == getattr(wire, name), name
    assert hook.prefix_cache_info.to_dict() == wire.prefix_cache_info.to_dict()
    if wire.rollout_routed_experts is None:
        assert hook.rollout_routed_experts is None
    else:
        assert hook.rollout_routed_experts.dtype == wire.rollout_routed_experts.dtype == np.int32
        assert np.array_equal(hook.rollout_routed_experts, wire.rollout_routed_experts)
    assert json.loads(json.dumps(filled.metadata["merge"])) == wire.metadata["merge"]
    assert max_seq_len is None or len(hook.tokens) <= max_seq_len
    hook.validate()
