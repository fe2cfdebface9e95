"""Per-token policy versions: the session's bookkeeping against a step-by-step engine model.

`_simulate` plays one session through an SGLang-like engine (docs/engine.md, "In-flight
updates"): each step is a forward plus a sample; an in_place pause keeps the KV across an update
(its flush refused), a retract pause puts the KV in the prefix cache and re-prefills from it
(flushed or not); updates between turns may flush. It records what really wrote each position
and reports only what an engine reports (spans, cached_tokens, num_retractions, delta-R3 row
sources). `version_arrays` must recover the truth from the reports.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.session.samples.merge import TurnRecord, merge
from rl360_ext.session.samples.policy_versions import TurnVersions, turn_routing_source, version_arrays
from rl360_ext.session.samples.routing import row_sources
from rl360_ext.sglang.versions import UNVERSIONED, RoutingSource


@dataclass
class Scenario:
    inputs: list[int]  # tokens each turn appends
    outputs: list[int]  # tokens each turn samples
    updates: list[list[int]]  # per turn: output counts at which an update lands mid-turn
    between: list[bool | None]  # per turn: an update before it (True: it flushed), None: none
    mode: str  # in_place | retract
    flush: bool  # whether a retract's update flushed the cache


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    turns = draw(st.integers(1, 3))
    inputs = [draw(st.integers(2 if t == 0 else 1, 6)) for t in range(turns)]
    outputs = [draw(st.integers(1, 7)) for _ in range(turns)]
    updates = [
        sorted(draw(st.sets(st.integers(1, max(o - 1, 1)), max_size=3))) if o > 1 else [] for o in outputs
    ]
    between = [None] + [draw(st.sampled_from([None, True, False])) for _ in range(turns - 1)]
    return Scenario(
        inputs, outputs, updates, between, draw(st.sampled_from(["in_place", "retract"])), draw(st.booleans())
    )


PREFILL, DECODE, REPREFILL = (
    int(RoutingSource.PREFILL),
    int(RoutingSource.DECODE),
    int(RoutingSource.REPREFILL),
)


def _spans(versions: list[int]) -> list[dict[str, object]]:
    spans: list[dict[str, object]] = []
    for i, v in enumerate(versions):
        if spans and spans[-1]["version"] == str(v):
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": str(v), "start": i, "end": i + 1})
    return spans


def _simulate(s: Scenario) -> tuple[list[TurnVersions], dict[str, np.ndarray]]:
    total = sum(s.inputs) + sum(s.outputs)
    kv = np.full(total, UNVERSIONED, np.int32)
    sampled = np.zeros(total, bool)  # positions holding a token the policy sampled
    kind = np.full(total, PREFILL, np.int32)  # how the KV (and routing row) at a position was written
    routing_version = np.full(max(total - 1, 0), UNVERSIONED, np.int32)
    routing_source = np.full(max(total - 1, 0), PREFILL, np.int32)
    token_version = np.full(total, UNVERSIONED, np.int32)
    version, cache_len, end, rows = 0, 0, 0, 0
    reports: list[TurnVersions] = []
    firsts: list[int] = []
    output_starts: list[int] = []
    first_cached: list[int] = []
    last_output = range(0)

    def prefill(lo: int, hi: int) -> None:
        kv[lo:hi] = version
        kind[lo:hi] = np.where(sampled[lo:hi], REPREFILL, PREFILL)

    for t, (a, o) in enumerate(zip(s.inputs, s.outputs, strict=True)):
        if s.between[t] is not None:
            version += 1
            cache_len = 0 if s.between[t] else cache_len
        prompt = end + a
        cached = min(cache_len, prompt - 1)
        prefill(cached, prompt)
        versions = [version]  # the prefill samples the first output token
        firsts.append(version)
        output_starts.append(prompt)
        first_cached.append(cached)
        kv_len, cached_total, retractions = prompt, cached, 0
        sampled[prompt : prompt + o] = True
        for i in range(1, o):
            if i in s.updates[t]:
                if s.mode == "retract":
                    cache_len, retractions = kv_len, retractions + 1
                    version += 1
                    cache_len = 0 if s.flush else cache_len
                    match = min(cache_len, prompt + i - 1)
                    cached_total += match
                    prefill(match, prompt + i)
                    kv_len = prompt + i
                    versions.append(version)
                    continue
                version += 1  # in_place: the flush is refused, the cache keeps what it had
            kv[prompt + i - 1], kind[prompt + i - 1] = version, DECODE
            kv_len = prompt + i
            versions.append(version)
        cache_len = kv_len
        token_version[prompt : prompt + o] = versions
        turn_rows = prompt + o - 1 - rows
        sources = row_sources(rows, turn_rows, prompt, last_output)
        routing_version[rows : rows + turn_rows] = kv[rows : rows + turn_rows]
        routing_source[rows : rows + turn_rows] = kind[rows : rows + turn_rows]
        reports.append(
            TurnVersions(
                input_start=end,
                input_tokens=a,
                output_tokens=o,
                spans=_spans(versions),
                weight_version=str(version),
                cached_tokens=cached_total,
                num_retractions=retractions,
                routing_start=rows,
                routing_rows=turn_rows,
                routing_source=sources,
            )
        )
        rows += turn_rows
        end = prompt + o
        last_output = range(prompt, end)
    truth = {
        "token_version": token_version,
        "kv_version": kv,
        "routing_version": routing_version,
        "routing_source": routing_source,
        "turn_first_version": np.asarray(firsts, np.int32),
        "turn_output_start": np.asarray(output_starts, np.int32),
        "turn_cached_tokens": np.asarray(first_cached, np.int32),
    }
    return reports, truth


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_bookkeeping_recovers_what_wrote_each_position(s: Scenario) -> None:
    reports, truth = _simulate(s)
    n = sum(s.inputs) + sum(s.outputs)
    arrays = version_arrays(reports, n, r3=True)
    np.testing.assert_array_equal(arrays.token_version, truth["token_version"])
    np.testing.assert_array_equal(arrays.turn_first_version, truth["turn_first_version"])
    np.testing.assert_array_equal(arrays.kv_version, truth["kv_version"])
    np.testing.assert_array_equal(arrays.routing_version, truth["routing_version"])
    np.testing.assert_array_equal(arrays.routing_source, truth["routing_source"])
    # Each turn's own rows, relabelled (what the session's metrics count), tile the merged ones.
    per_turn = [turn_routing_source(r) for r in reports]
    np.testing.assert_array_equal(np.concatenate([np.zeros(0, np.uint8), *per_turn]), truth["routing_source"])
    np.testing.assert_array_equal(arrays.turn_output_start, truth["turn_output_start"])
    np.testing.assert_array_equal(arrays.turn_cached_tokens, truth["turn_cached_tokens"])
    assert arrays.kv_version[-1] == UNVERSIONED  # the last token was never forwarded


@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_merge_carries_the_arrays(s: Scenario) -> None:
    reports, truth = _simulate(s)
    rng = np.random.default_rng(0)
    turns = [
        TurnRecord(
            index=i,
            segment=0,
            input_start=r.input_start,
            input_ids=rng.integers(0, 50, r.input_tokens).astype(np.int32),
            output_ids=rng.integers(0, 50, r.output_tokens).astype(np.int32),
            output_logprobs=np.zeros(r.output_tokens, np.float32),
            finish_reason="stop",
            weight_version=r.weight_version,
            weight_versions=list(r.spans),  # type: ignore[arg-type]
            num_retractions=r.num_retractions,
            cached_tokens=r.cached_tokens,
            routing=np.zeros((r.routing_rows or 0, 1, 1), np.uint8),
            routing_start=r.routing_start,
            routing_source=r.routing_source,
        )
        for i, r in enumerate(reports)
    ]
    sample = merge(turns, "s")
    for name, expected in truth.items():
        np.testing.assert_array_equal(getattr(sample, name), expected, err_msg=name)
    assert sample.token_version is not None and sample.loss_mask is not None
    assert np.all((sample.token_version == UNVERSIONED) == (sample.loss_mask == 0))


def test_spans_that_do_not_tile_the_output_fall_back_to_the_turn_version() -> None:
    turn = TurnVersions(0, 2, 4, [{"version": "3", "start": 0, "end": 2}], "5", 0)
    assert version_arrays([turn], 6, r3=False).token_version.tolist() == [-1, -1, 5, 5, 5, 5]
    unnumbered = TurnVersions(0, 2, 2, [{"version": "default", "start": 0, "end": 2}], "default", 0)
    arrays = version_arrays([unnumbered], 4, r3=False)
    assert arrays.token_version.tolist() == [-1] * 4 and arrays.routing_source is None
