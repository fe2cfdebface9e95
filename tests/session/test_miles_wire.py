"""Miles' samples wire (`rl360_ext.session.samples.miles_wire`), decoded with safetensors and json only."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import safetensors.numpy
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.session.chat_api import RequestError
from rl360_ext.session.samples import miles_wire
from rl360_ext.session.samples.merge import MergedSample, TurnRecord, merge

LAYERS, TOP_K = 2, 3
SESSION_FACTS = {"id": "s-1", "r3": True, "forks": []}


def decode_text(ids: Sequence[int]) -> str:
    """A decoder whose piecewise output concatenates to the whole range's output."""
    return "".join(f"<{i}>" for i in ids)


def _turn(
    index: int,
    start: int,
    n_in: int,
    n_out: int,
    finish: str = "stop",
    r3: bool = True,
    version: str | None = "v1",
) -> TurnRecord:
    end = start + n_in + n_out
    rows = end - 1 - max(start - 1, 0)
    return TurnRecord(
        index=index,
        segment=0,
        input_start=start,
        input_ids=np.arange(start, start + n_in, dtype=np.int32) + 1000,
        output_ids=np.arange(start + n_in, end, dtype=np.int32) + 2000,
        output_logprobs=-np.linspace(0.1, 1.0, n_out, dtype=np.float32),
        finish_reason=finish,
        weight_version=version,
        prompt_tokens=start + n_in,
        cached_tokens=start,
        routing=(np.arange(rows * LAYERS * TOP_K) % 250).astype(np.uint8).reshape(rows, LAYERS, TOP_K)
        if r3
        else None,
        routing_start=max(start - 1, 0),
        routing_source=np.zeros(rows, np.uint8) if r3 else None,
    )


def _session(shape: Sequence[tuple[int, int]], r3: bool = True, last_finish: str = "stop") -> MergedSample:
    turns, start = [], 0
    for i, (n_in, n_out) in enumerate(shape):
        finish = last_finish if i == len(shape) - 1 else "stop"
        turns.append(_turn(i, start, n_in, n_out, finish, r3, version=f"v{i // 2}"))
        start += n_in + n_out
    return merge(
        turns,
        session_id="s-1",
        metadata={"task": "t1", "session": SESSION_FACTS},
        routing_tail_shape=(LAYERS, TOP_K) if r3 else None,
    )


def _decode(payload: bytes) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    tensors = safetensors.numpy.load(payload)
    meta = tensors.pop(miles_wire.SAMPLES_META_KEY)
    assert meta.dtype == np.uint8 and meta.ndim == 1
    return tensors, json.loads(meta.tobytes().decode("utf-8"))


def test_a_whole_session_is_the_merged_sample_seen_from_the_first_prompt() -> None:
    sample = _session([(5, 3), (4, 2), (3, 4)])
    tensors, meta = _decode(miles_wire.encode(sample, decode_text, metadata={"agent": "x"}))
    p, n = sample.prompt_length, len(sample.tokens)
    assert sorted(tensors) == ["loss_mask.0", "rollout_log_probs.0", "rollout_routed_experts.0", "tokens.0"]
    assert tensors["tokens.0"].dtype == np.int64 and tensors["tokens.0"].tolist() == sample.tokens.tolist()
    assert tensors["loss_mask.0"].dtype == np.uint8
    assert tensors["loss_mask.0"].tolist() == sample.loss_mask[p:].tolist()
    assert tensors["rollout_log_probs.0"].dtype == np.float64
    assert np.array_equal(tensors["rollout_log_probs.0"], sample.rollout_log_probs[p:].astype(np.float64))
    routed = tensors["rollout_routed_experts.0"]
    assert routed.dtype == np.int32 and routed.shape == (n - 1, LAYERS, TOP_K)
    assert np.array_equal(routed, sample.routed_experts.astype(np.int32))
    (one,) = meta["samples"]
    assert one["response_length"] == n - p == len(tensors["loss_mask.0"])
    assert one["response"] == decode_text(sample.tokens[p:].tolist())
    assert one["status"] == "completed"
    assert one["weight_versions"] == ["v0", "v0", "v1"]
    assert one["prefix_cache_info"] == {
        "cached_tokens": sum(t["cached_tokens"] for t in sample.turns),
        "total_prompt_tokens": sum(t["prompt_tokens"] for t in sample.turns),
    }
    assert one["nulls"] == ["rollout_indexer_topk"]
    assert one["metadata"]["task"] == "t1" and one["metadata"]["agent"] == "x"
    assert "session" not in one["metadata"]
    assert one["metadata"]["merge"]["turns"] == sample.turns
    assert one["metadata"]["merge"]["turns_kept"] == 3
    assert meta["session_metadata"] == {"session": SESSION_FACTS}
    assert meta["empty_reason"] is None


def test_without_r3_the_routing_is_a_null() -> None:
    sample = _session([(5, 3), (4, 2)], r3=False)
    tensors, meta = _decode(miles_wire.encode(sample, decode_text))
    assert "rollout_routed_experts.0" not in tensors
    assert meta["samples"][0]["nulls"] == ["rollout_routed_experts", "rollout_indexer_topk"]


@pytest.mark.parametrize(("last_finish", "status"), [("length", "truncated"), ("abort", "aborted")])
def test_the_status_is_miles_value_of_the_last_turns_finish(last_finish: str, status: str) -> None:
    _, meta = _decode(miles_wire.encode(_session([(5, 3), (4, 2)], last_finish=last_finish), decode_text))
    assert meta["samples"][0]["status"] == status


def test_max_seq_len_cuts_the_overflowing_turns_output_and_drops_later_turns() -> None:
    sample = _session([(5, 3), (4, 2), (3, 4)])  # turns end at 8, 14, 21
    tensors, meta = _decode(miles_wire.encode(sample, decode_text, max_seq_len=13))
    (one,) = meta["samples"]
    assert tensors["tokens.0"].tolist() == sample.tokens[:13].tolist()
    assert (
        one["response_length"] == 13 - 5 == len(tensors["loss_mask.0"]) == len(tensors["rollout_log_probs.0"])
    )
    assert tensors["loss_mask.0"].tolist() == sample.loss_mask[5:13].tolist()
    assert np.array_equal(tensors["rollout_routed_experts.0"], sample.routed_experts[:12].astype(np.int32))
    assert one["response"] == decode_text(sample.tokens[5:13].tolist())
    assert one["status"] == "truncated"
    assert one["weight_versions"] == ["v0", "v0"]
    assert one["prefix_cache_info"] == {"cached_tokens": 8, "total_prompt_tokens": 5 + 12}
    facts = one["metadata"]["merge"]
    assert facts["turns_dropped_by_max_seq_len"] == 1 and facts["tokens_cut_by_max_seq_len"] == 21 - 13
    assert facts["max_seq_len"] == 13 and facts["rl360_status"] == "COMPLETED"
    assert [t["index"] for t in facts["turns"]] == [0, 1]


def test_a_turn_left_without_output_is_dropped_and_the_sample_keeps_its_status() -> None:
    sample = _session([(5, 3), (4, 2), (3, 4)])
    tensors, meta = _decode(miles_wire.encode(sample, decode_text, max_seq_len=12))  # turn 1: 0 of 2 fit
    (one,) = meta["samples"]
    assert tensors["tokens.0"].tolist() == sample.tokens[:8].tolist()
    assert one["status"] == "completed" and one["response_length"] == 3
    assert one["weight_versions"] == ["v0"]
    assert one["metadata"]["merge"]["turns_dropped_by_max_seq_len"] == 2


def test_a_max_seq_len_the_first_output_does_not_fit_answers_all_truncated() -> None:
    sample = _session([(5, 3), (4, 2)])
    tensors, meta = _decode(miles_wire.encode(sample, decode_text, max_seq_len=5))
    assert tensors == {} and meta["samples"] == [] and meta["empty_reason"] == "all_truncated"
    assert meta["session_metadata"] == {"session": SESSION_FACTS}
    tensors, meta = _decode(miles_wire.encode(sample, decode_text, max_seq_len=6))
    assert meta["samples"][0]["response_length"] == 1 and meta["samples"][0]["status"] == "truncated"


@pytest.mark.parametrize("r3", [True, False])
def test_a_session_without_turns_answers_no_samples(r3: bool) -> None:
    sample = merge(
        [],
        session_id="s-1",
        metadata={"session": SESSION_FACTS},
        routing_tail_shape=(LAYERS, TOP_K) if r3 else None,
    )
    tensors, meta = _decode(miles_wire.encode(sample, decode_text, max_seq_len=100))
    assert tensors == {}
    assert meta == {
        "samples": [],
        "session_metadata": {"session": SESSION_FACTS},
        "empty_reason": "no_records",
    }


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ([], "body"),
        ({"max_seq_len": 0}, "max_seq_len"),
        ({"max_seq_len": "8"}, "max_seq_len"),
        ({"max_seq_len": True}, "max_seq_len"),
        ({"metadata": [1]}, "metadata"),
        ({"fields": []}, "fields"),
    ],
)
def test_a_bad_samples_body_names_the_field(body: Any, param: str) -> None:
    with pytest.raises(RequestError) as caught:
        miles_wire.parse_samples_request(body)
    assert caught.value.status == 400 and caught.value.param == param


def test_a_samples_body_miles_sends_parses() -> None:
    assert miles_wire.parse_samples_request({"max_seq_len": None}) == (None, None)
    assert miles_wire.parse_samples_request({"max_seq_len": 64, "metadata": {"a": 1}}) == (64, {"a": 1})


@st.composite
def sessions(draw: st.DrawFn) -> tuple[list[tuple[int, int]], bool, str, int | None]:
    shape = draw(st.lists(st.tuples(st.integers(1, 6), st.integers(0, 5)), min_size=1, max_size=5))
    total = sum(a + b for a, b in shape)
    max_seq_len = draw(st.none() | st.integers(1, total + 3))
    return shape, draw(st.booleans()), draw(st.sampled_from(["stop", "length", "abort"])), max_seq_len


@settings(max_examples=60, deadline=None)
@given(sessions())
def test_the_wire_is_a_prefix_of_the_merged_sample(
    case: tuple[list[tuple[int, int]], bool, str, int | None],
) -> None:
    shape, r3, last_finish, max_seq_len = case
    sample = _session(shape, r3=r3, last_finish=last_finish)
    tensors, meta = _decode(miles_wire.encode(sample, decode_text, max_seq_len=max_seq_len))
    if not meta["samples"]:
        assert meta["empty_reason"] == "all_truncated" and max_seq_len is not None
        assert max_seq_len - sample.prompt_length < shape[0][1] or shape[0][1] == 0
        return
    (one,) = meta["samples"]
    n = len(tensors["tokens.0"])
    p = sample.prompt_length
    assert max_seq_len is None or n <= max_seq_len
    assert tensors["tokens.0"].tolist() == sample.tokens[:n].tolist()
    assert one["response_length"] == n - p == len(tensors["loss_mask.0"])
    assert tensors["loss_mask.0"].tolist() == sample.loss_mask[p:n].tolist()
    assert np.array_equal(tensors["rollout_log_probs.0"], sample.rollout_log_probs[p:n].astype(np.float64))
    assert one["response"] == decode_text(sample.tokens[p:n].tolist())
    if r3:
        assert np.array_equal(
            tensors["rollout_routed_experts.0"], sample.routed_experts[: n - 1].astype(np.int32)
        )
    else:
        assert "rollout_routed_experts" in one["nulls"]
    assert one["status"] in ("completed", "truncated", "aborted")
    if max_seq_len is None or max_seq_len >= len(sample.tokens):
        assert one["status"] == sample.status.lower() and n == len(sample.tokens)


@st.composite
def branch_sets(draw: st.DrawFn) -> tuple[list[MergedSample], int | None, dict[str, Any] | None]:
    shapes = st.lists(st.tuples(st.integers(1, 6), st.integers(1, 5)), min_size=1, max_size=3)
    branches = [_session(draw(shapes), r3=draw(st.booleans())) for _ in range(draw(st.integers(0, 3)))]
    max_seq_len = draw(st.one_of(st.none(), st.integers(1, 30)))
    agent = draw(st.one_of(st.none(), st.fixed_dictionaries({"reward": st.floats(-1, 1), "note": st.text()})))
    return branches, max_seq_len, agent


@settings(max_examples=60, deadline=None)
@given(branch_sets())
def test_v2_answers_each_branch_that_keeps_a_turn_with_the_agents_reward(
    case: tuple[list[MergedSample], int | None, dict[str, Any] | None],
) -> None:
    branches, max_seq_len, agent = case
    nodes = [{"id": i} for i in range(len(branches))]
    session_metadata = {"session": SESSION_FACTS, "tree": {"nodes": nodes, "leaves": []}}
    tensors, meta = _decode(miles_wire.encode_v2(branches, session_metadata, decode_text, max_seq_len, agent))
    alone = [_decode(miles_wire.encode(b, decode_text, max_seq_len, agent)) for b in branches]
    kept = [(t, m["samples"][0]) for t, m in alone if m["samples"]]  # each branch cut like a v1 sample
    assert len(meta["samples"]) == len(kept)
    for i, (one_tensors, one) in enumerate(kept):
        got = meta["samples"][i]
        assert got["reward"] == (None if agent is None else agent["reward"])
        assert {k: v for k, v in got.items() if k != "reward"} == one
        for name, value in one_tensors.items():
            assert np.array_equal(tensors[name.replace(".0", f".{i}")], value)
    assert len(tensors) == sum(len(t) for t, _ in kept)
    expected_empty = None if kept else ("no_records" if not nodes else "all_truncated")
    assert meta["empty_reason"] == expected_empty
    assert meta["session_metadata"].get("agent") == agent
