"""Staleness, stale-KV and R3-provenance metrics from the per-token version arrays."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.sglang.versions import UNVERSIONED, VERSIONS_KEY, RoutingSource
from rl360_ext.train.staleness import (
    TURN_CACHED_TOKENS,
    TURN_OUTPUT_START,
    TrainedSample,
    parse_versions,
    sample_staleness_metrics,
    staleness_metrics,
)

U = UNVERSIONED
DECODE, PREFILL, REPREFILL = SOURCES = [int(s) for s in RoutingSource]


def _sample(tokens, response_length, versions, loss_mask=None, group_index=None, remove=False):
    return SimpleNamespace(
        tokens=list(range(tokens)),
        response_length=response_length,
        loss_mask=loss_mask,
        remove_sample=remove,
        group_index=group_index,
        metadata={VERSIONS_KEY: versions},
    )


def _two_turns() -> dict:
    # prompt 0-2 | turn 0 output 3-5 (v1, v1, v2) | tool 6-7 | turn 1 output 8-9 (v3)
    return {
        "token_version": [U, U, U, 1, 1, 2, U, U, 3, 3],
        "kv_version": [1, 1, 1, 1, 1, 2, 3, 3, 3, U],
        "routing_source": [PREFILL, PREFILL, DECODE, DECODE, REPREFILL, REPREFILL, PREFILL, DECODE, DECODE],
        "routing_version": [1, 1, 1, 1, 3, 3, 3, 3, 3],
        "turn_first_version": [1, 3],
        TURN_OUTPUT_START: [3, 8],
        TURN_CACHED_TOKENS: [0, 5],
    }


def test_two_turn_sample_by_hand():
    mask = [1, 1, 1, 0, 0, 1, 1]  # response = positions 3..9; tool tokens 6, 7 masked out
    metrics = sample_staleness_metrics([_sample(10, 7, _two_turns(), mask)], trainer_version=4)
    # trained token versions 1, 1, 2, 3, 3 -> ages 3, 3, 2, 1, 1
    assert metrics["staleness/aged_tokens"] == 5
    assert metrics["staleness/token_age_mean"] == pytest.approx(2.0)
    assert metrics["staleness/token_age_max"] == 3
    assert metrics["staleness/token_age_p90"] == 3
    hist = {k: metrics[f"staleness/token_age_hist/{k}"] for k in ("0", "1", "2", "3", "4+")}
    assert hist == pytest.approx({"0": 0.0, "1": 0.4, "2": 0.2, "3": 0.4, "4+": 0.0})
    assert metrics["staleness/unversioned_tokens"] == 0
    assert metrics["staleness/group_version_spread_max"] == 2
    assert metrics["staleness/mixed_version_frac"] == 1.0
    # turn 0 (v1): context 0-2 all v1 -> 0 stale of 3; turn 1 (v3): context 0-7, 0-4 (v1) and 5 (v2) stale
    assert metrics["kv/context_tokens"] == 11
    assert metrics["kv/stale_prefix_tokens_frac"] == pytest.approx(6 / 11)
    # rows of trained tokens 3, 4, 5, 8 (9 is last: no row): DECODE, REPREFILL, REPREFILL, DECODE
    assert metrics["r3/rows"] == 4
    assert metrics["r3/rows_from_later_prefill_frac"] == pytest.approx(0.5)
    # next turn cached 5 tokens: 3, 4 were cache hits, 5 a miss; 8 has no later turn
    assert metrics["r3/rows_from_later_prefill_frac/cache_hit"] == pytest.approx(0.5)
    assert metrics["r3/rows_from_later_prefill_frac/cache_miss"] == pytest.approx(1.0)


def test_unversioned_and_future_tokens_are_counted_apart():
    versions = {"token_version": [U, U, 5, U], "kv_version": [U] * 4, "turn_first_version": [U]}
    metrics = sample_staleness_metrics([_sample(4, 3, versions)], trainer_version=4)
    assert metrics["staleness/unversioned_tokens"] == 2
    assert metrics["staleness/future_tokens"] == 1
    assert metrics["staleness/aged_tokens"] == 0
    assert "staleness/token_age_mean" not in metrics
    assert "kv/stale_prefix_tokens_frac" not in metrics  # no turn_output_start, no known kv
    assert "r3/rows" not in metrics  # no R3


def test_samples_without_arrays_or_trained_tokens_log_nothing():
    versions = {"token_version": [U, 1], "kv_version": [1, 1], "turn_first_version": [1]}
    plain = SimpleNamespace(tokens=[1, 2], response_length=1, loss_mask=[1], metadata={})
    removed = _sample(2, 1, versions, remove=True)
    zero = _sample(2, 1, versions, loss_mask=[0])
    assert sample_staleness_metrics([plain, removed, zero], trainer_version=3) == {}
    assert sample_staleness_metrics([_sample(2, 1, versions)], 3, is_valid=lambda s: False) == {}


def test_groups_and_mixed_share():
    one = {"token_version": [U, 2, 2], "kv_version": [2, 2, 2], "turn_first_version": [2]}
    two = {"token_version": [U, 0, 1], "kv_version": [0, 0, 1], "turn_first_version": [0]}
    samples = [_sample(3, 2, one, group_index=7), _sample(3, 2, two, group_index=7), _sample(3, 2, one)]
    metrics = sample_staleness_metrics(samples, trainer_version=2)
    assert metrics["staleness/group_version_spread_max"] == 2  # group 7 spans versions 0..2
    assert metrics["staleness/mixed_version_frac"] == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("token_version", [0, 1], "'token_version'] has 2 entries, expected 3"),
        ("kv_version", None, "'kv_version'] is missing"),
        ("routing_source", [0, 1, 2], "'routing_source'] has 3 entries, expected 2"),
        ("routing_source", [0, 7], "not a RoutingSource"),
        ("token_version", ["a", 1, 2], "'token_version'] must be a list of integers"),
        (TURN_OUTPUT_START, [1, 2], "expected 1 (one per kept turn)"),
        (TURN_OUTPUT_START, [4], "outside [0, 3]"),
    ],
)
def test_parse_versions_names_the_bad_field(key, value, message):
    raw = {"token_version": [U, 1, 1], "kv_version": [1, 1, 1], "turn_first_version": [1], key: value}
    with pytest.raises(ValueError) as error:
        parse_versions(raw, 3)
    assert message in str(error.value)
    assert VERSIONS_KEY in str(error.value)


def test_turn_starts_must_be_in_order():
    raw = {"token_version": [U, 1, 1], "kv_version": [1, 1, 1], "turn_first_version": [1, 1]}
    with pytest.raises(ValueError, match="'turn_output_start'] must not decrease"):
        parse_versions({**raw, TURN_OUTPUT_START: [2, 1]}, 3)


def test_parse_versions_rejects_a_non_mapping():
    with pytest.raises(ValueError, match="must be a mapping"):
        sample_staleness_metrics([_sample(2, 1, [1, 2])], trainer_version=1)


# ---- properties against a per-token oracle -------------------------------------------------------


@st.composite
def samples_strategy(draw):
    n = draw(st.integers(2, 24))
    response = draw(st.integers(1, n - 1))
    version = st.one_of(st.just(U), st.integers(0, 8))
    turns = draw(st.integers(1, 4))
    starts = sorted(draw(st.lists(st.integers(0, n), min_size=turns, max_size=turns)))
    arrays = {
        "token_version": draw(st.lists(version, min_size=n, max_size=n)),
        "kv_version": draw(st.lists(version, min_size=n, max_size=n)),
        "routing_source": draw(st.lists(st.sampled_from(SOURCES), min_size=n - 1, max_size=n - 1)),
        "routing_version": draw(st.lists(version, min_size=n - 1, max_size=n - 1)),
        "turn_first_version": draw(st.lists(version, min_size=turns, max_size=turns)),
        TURN_OUTPUT_START: starts,
        TURN_CACHED_TOKENS: draw(st.lists(st.integers(0, n), min_size=turns, max_size=turns)),
    }
    mask = draw(st.lists(st.sampled_from([0, 1]), min_size=response, max_size=response))
    return n, response, arrays, mask, draw(st.sampled_from([None, 0, 1]))


def _oracle(items, trainer):
    ages, unversioned, per_group, per_sample = [], 0, {}, []
    kv_stale = kv_known = rows = later = 0
    split = {True: [0, 0], False: [0, 0]}
    for number, (n, response, arrays, mask, group) in enumerate(items):
        if not any(mask):
            continue
        own = []
        tv = arrays["token_version"]
        for j, m in enumerate(mask):
            if not m:
                continue
            p = n - response + j
            if tv[p] == U:
                unversioned += 1
            else:
                own.append(tv[p])
                if trainer - tv[p] >= 0:
                    ages.append(trainer - tv[p])
            if p < n - 1:
                rows += 1
                is_later = arrays["routing_source"][p] == REPREFILL
                later += is_later
                starts = arrays[TURN_OUTPUT_START]
                turn = max((t for t, s in enumerate(starts) if s <= p), default=None)
                if turn is not None and turn + 1 < len(starts):
                    hit = arrays[TURN_CACHED_TOKENS][turn + 1] > p
                    split[hit][0] += 1
                    split[hit][1] += is_later
        if own:
            per_group.setdefault(("s", number) if group is None else group, []).extend(own)
            per_sample.append(len(set(own)) > 1)
        for first, start in zip(arrays["turn_first_version"], arrays[TURN_OUTPUT_START], strict=True):
            if first == U:
                continue
            for p in range(start):
                if arrays["kv_version"][p] != U:
                    kv_known += 1
                    kv_stale += arrays["kv_version"][p] < first
    return ages, unversioned, per_group, per_sample, (kv_stale, kv_known), (rows, later), split


@settings(max_examples=150, deadline=None)
@given(st.lists(samples_strategy(), min_size=1, max_size=5), st.integers(0, 10))
def test_metrics_match_a_per_token_oracle(items, trainer):
    samples = [_sample(n, r, a, m, g) for n, r, a, m, g in items]
    metrics = sample_staleness_metrics(samples, trainer)
    ages, unversioned, groups, mixed, (stale, known), (rows, later), split = _oracle(items, trainer)
    if not any(any(m) for *_, m, _g in items):
        assert metrics == {}
        return
    assert metrics["staleness/unversioned_tokens"] == unversioned
    assert metrics["staleness/aged_tokens"] == len(ages)
    if ages:
        assert metrics["staleness/token_age_mean"] == pytest.approx(sum(ages) / len(ages))
        assert metrics["staleness/token_age_max"] == max(ages)
        ranked = sorted(ages)
        assert metrics["staleness/token_age_p90"] == ranked[math.ceil(0.9 * len(ranked)) - 1]
        hist = [metrics[f"staleness/token_age_hist/{k}"] for k in ("0", "1", "2", "3", "4+")]
        assert sum(hist) == pytest.approx(1.0)
        assert hist[4] == pytest.approx(sum(a >= 4 for a in ages) / len(ages))
        assert hist[1] == pytest.approx(ages.count(1) / len(ages))
    else:
        assert "staleness/token_age_mean" not in metrics
    if groups:
        assert metrics["staleness/group_version_spread_max"] == max(max(v) - min(v) for v in groups.values())
        assert metrics["staleness/mixed_version_frac"] == pytest.approx(sum(mixed) / len(mixed))
    if known:
        assert metrics["kv/stale_prefix_tokens_frac"] == pytest.approx(stale / known)
    else:
        assert "kv/stale_prefix_tokens_frac" not in metrics
    if rows:
        assert metrics["r3/rows_from_later_prefill_frac"] == pytest.approx(later / rows)
    for hit, name in ((True, "cache_hit"), (False, "cache_miss")):
        total, reprefilled = split[hit]
        key = f"r3/rows_from_later_prefill_frac/{name}"
        assert metrics.get(key) == (pytest.approx(reprefilled / total) if total else None)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=30), st.integers(0, 3))
def test_aging_every_token_by_one_step_shifts_the_ages(versions, shift):
    n = len(versions) + 1
    raw = {"token_version": [U, *versions], "kv_version": [U] * n, "turn_first_version": [U]}
    arrays = parse_versions(raw, n)
    sample = TrainedSample(arrays, 1, np.ones(len(versions)))
    before = staleness_metrics([sample], 6)
    after = staleness_metrics([sample], 6 + shift)
    assert after["staleness/token_age_mean"] == pytest.approx(before["staleness/token_age_mean"] + shift)
    assert after["staleness/token_age_max"] == before["staleness/token_age_max"] + shift
    assert after["staleness/group_version_spread_max"] == before["staleness/group_version_spread_max"]
