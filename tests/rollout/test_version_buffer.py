"""The version-aware fully-async data buffer: group verdicts, token masking, records and metrics."""

from __future__ import annotations

import asyncio
from argparse import ArgumentParser, Namespace
from types import SimpleNamespace

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.rollout.version_buffer import (
    DROP,
    METRIC_PREFIX,
    REQUEUE,
    STALE_GROUP_KIND,
    TOKEN_AGE_EXCEEDED,
    VersionAwareDataBuffer,
    VersionBufferConfig,
    add_arguments,
    judge_group,
    mask_stale_tokens,
    oldest_token_version,
)
from rl360_ext.sglang.versions import UNVERSIONED, VERSIONS_KEY
from rl360_ext.train.reducers import valid_sample_mean

U = UNVERSIONED
PROMPT = 2


def _sample(output_versions, loss_mask=None, index=0, group_index=0, with_versions=True):
    n = PROMPT + len(output_versions)
    metadata = {}
    if with_versions:
        metadata[VERSIONS_KEY] = {
            "token_version": [U] * PROMPT + list(output_versions),
            "kv_version": [U] * n,
            "turn_first_version": [U],
        }
    return SimpleNamespace(
        index=index,
        group_index=group_index,
        tokens=list(range(n)),
        response_length=len(output_versions),
        loss_mask=loss_mask,
        remove_sample=False,
        metadata=metadata,
    )


class FifoBuffer:
    """A stand-in for Miles' DefaultDataBuffer: FIFO, no filters."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.versions_seen: list = []

    async def put(self, input) -> None:
        await self.queue.put(input)

    async def get(self, current_version=None, **_):
        self.versions_seen.append(current_version)
        return await self.queue.get()

    def get_metrics(self) -> dict[str, float]:
        return {"rollout/fully_async/queue_size": float(self.queue.qsize())}


def _buffer(**flags):
    args = Namespace(**{f"rl360_{k}": v for k, v in flags.items()})
    unused: list = []
    inner = FifoBuffer()
    buffer = VersionAwareDataBuffer(SimpleNamespace(args=args, unused_handler_fn=unused.append), inner=inner)
    return buffer, inner, unused


def _entry(*samples, prompt_group="prompts"):
    return SimpleNamespace(prompt_group=prompt_group, group=list(samples))


async def test_a_group_beyond_k_is_requeued_logged_and_counted():
    buffer, inner, unused = _buffer()
    await buffer.put(_entry(_sample([3, 4]), _sample([1, 2]), prompt_group="stale"))  # oldest 1: age 5
    await buffer.put(_entry(_sample([2, 3]), _sample([6, 6]), prompt_group="fresh"))  # oldest 2: age 4
    entry = await buffer.get(current_version=6)
    assert entry.prompt_group == "fresh"
    assert unused == ["stale"]
    assert inner.versions_seen == [6, 6]
    [record] = buffer.recent_records
    assert record["kind"] == STALE_GROUP_KIND and record["reason"] == TOKEN_AGE_EXCEEDED
    assert (record["oldest_token_version"], record["token_age"], record["max_token_age"]) == (1, 5, 4)
    assert record["action"] == REQUEUE
    metrics = buffer.get_metrics()
    assert metrics[f"{METRIC_PREFIX}groups_stale_requeued"] == 1
    assert metrics[f"{METRIC_PREFIX}groups_consumed"] == 1
    assert metrics["rollout/fully_async/queue_size"] == 0  # Miles' own metrics are kept
    assert metrics["staleness/token_age_max"] == 4  # of the handed-out group, at version 6
    assert metrics["staleness/group_version_spread_max"] == 4
    again = buffer.get_metrics()  # the window resets
    assert again[f"{METRIC_PREFIX}groups_stale_requeued"] == 0 and "staleness/token_age_max" not in again


async def test_drop_discards_without_the_unused_handler_and_writes_the_jsonl(tmp_path):
    path = tmp_path / "metrics.jsonl"
    buffer, _, unused = _buffer(max_token_age=1, stale_group_action=DROP, metrics_path=str(path))
    await buffer.put(_entry(_sample([0, 0])))
    await buffer.put(_entry(_sample([2])))
    await buffer.get(current_version=2)
    assert unused == []
    assert buffer.get_metrics()[f"{METRIC_PREFIX}groups_stale_dropped"] == 1
    [line] = path.read_bytes().splitlines()
    assert orjson.loads(line)["action"] == DROP


async def test_groups_without_versions_or_a_version_pass_unjudged():
    buffer, _, unused = _buffer(max_token_age=0)
    await buffer.put(_entry(_sample([0], with_versions=False)))
    await buffer.put(_entry(_sample([0])))
    await buffer.get(current_version=9)
    await buffer.get()  # no current version: nothing to age against
    metrics = buffer.get_metrics()
    assert unused == []
    assert metrics[f"{METRIC_PREFIX}groups_consumed"] == 2
    assert metrics[f"{METRIC_PREFIX}groups_unversioned"] == 1
    assert "staleness/token_age_max" not in metrics


async def test_masking_keeps_the_group_and_masks_only_old_tokens():
    buffer, _, _ = _buffer(max_token_age=4, mask_token_age=1)
    old = _sample([2, 3, U, 4], loss_mask=[1, 1, 0, 1])
    gone = _sample([2, 2])
    await buffer.put(_entry(old, gone))
    await buffer.get(current_version=4)
    assert old.loss_mask == [0, 1, 0, 1]
    assert gone.loss_mask == [0, 0]
    metrics = buffer.get_metrics()
    assert metrics[f"{METRIC_PREFIX}tokens_masked"] == 3
    assert metrics[f"{METRIC_PREFIX}samples_fully_masked"] == 1
    assert metrics["staleness/token_age_max"] == 1  # ages of what still trains


def test_oldest_version_counts_only_trained_output_tokens():
    masked_old = _sample([0, 5], loss_mask=[0, 1])
    nested = [[masked_old], [_sample([U, 6])]]
    assert oldest_token_version(nested) == 5
    assert oldest_token_version([_sample([U, U])]) is None


def test_config_from_flags_and_environment():
    parser = ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--rl360-max-token-age", "2", "--rl360-stale-group-action", "drop"])
    config = VersionBufferConfig.from_args(args, environ={"RL360_MASK_TOKEN_AGE": "1"})
    assert config == VersionBufferConfig(max_token_age=2, stale_group_action=DROP, mask_token_age=1)
    assert VersionBufferConfig.from_args(Namespace(), environ={}) == VersionBufferConfig()
    with pytest.raises(ValueError, match="--rl360-max-token-age"):
        VersionBufferConfig(max_token_age=-1)
    with pytest.raises(ValueError, match="--rl360-stale-group-action"):
        VersionBufferConfig.from_args(Namespace(), environ={"RL360_STALE_GROUP_ACTION": "keep"})
    with pytest.raises(ValueError, match=r"\$RL360_MAX_TOKEN_AGE must be an integer"):
        VersionBufferConfig.from_args(Namespace(), environ={"RL360_MAX_TOKEN_AGE": "four"})


def test_without_miles_the_default_inner_buffer_says_so():
    with pytest.raises(RuntimeError, match="DefaultDataBuffer"):
        VersionAwareDataBuffer(SimpleNamespace(args=Namespace(), unused_handler_fn=print))


# ---- properties ------------------------------------------------------------------------------------

versions = st.lists(st.one_of(st.just(U), st.integers(0, 9)), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(st.lists(versions, min_size=1, max_size=4), st.integers(0, 12), st.integers(0, 6))
def test_judge_group_keeps_iff_the_oldest_trained_token_is_within_k(outputs, current, k):
    group = [_sample(v) for v in outputs]
    known = [x for v in outputs for x in v if x != U]
    verdict = judge_group(group, current, VersionBufferConfig(max_token_age=k))
    if not known:
        assert verdict.keep and verdict.token_age is None
    else:
        assert verdict.oldest_token_version == min(known)
        assert verdict.keep == (current - min(known) <= k)


@settings(max_examples=150, deadline=None)
@given(versions, st.integers(0, 12), st.integers(0, 6), st.data())
def test_masking_removes_exactly_the_old_tokens_from_numerator_and_denominator(output, current, k, data):
    mask = data.draw(st.lists(st.sampled_from([0, 1]), min_size=len(output), max_size=len(output)))
    x = np.array(data.draw(st.lists(st.floats(-5, 5), min_size=len(output), max_size=len(output))))
    sample = _sample(output, loss_mask=list(mask))
    masked = mask_stale_tokens(sample, current, k)
    fresh = [m and not (v != U and current - v > k) for v, m in zip(output, mask, strict=True)]
    assert sample.loss_mask == [int(f) for f in fresh]
    assert masked == sum(mask) - sum(fresh)
    assert mask_stale_tokens(sample, current, k) == 0  # idempotent
    # rl360's reducer, then Miles' division by the sample count: the mean over what still trains,
    # next to an untouched one-token sample; a fully masked sample leaves the valid count too
    other = np.array([1.0])
    reduce = valid_sample_mean(None, [len(output), 1], [np.array(sample.loss_mask, float), other])
    value = reduce(np.concatenate([x, [2.0]])) / 2
    means = [2.0] + ([float(x[np.array(fresh, bool)].mean())] if any(fresh) else [])
    assert value == pytest.approx(sum(means) / len(means))
