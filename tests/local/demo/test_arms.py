"""The fault A/B's arms: rl360's reward hook against upstream Miles' defaults differ exactly where
the upstream rules apply (hypothesis over batches with infra samples and partial groups)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.local.demo.arms import upstream_advantages, upstream_groups
from rl360_ext.rollout.rewards import valid_group_advantages
from tests.rollout.duck_samples import infra, valid


def _args(**overrides: Any) -> SimpleNamespace:
    base = {
        "advantage_estimator": "grpo",
        "rewards_normalization": True,
        "grpo_std_normalization": True,
        "reward_key": None,
        "n_samples_per_prompt": 4,
        "rollout_batch_size": 8,
    }
    return SimpleNamespace(**{**base, **overrides})


@st.composite
def batches(draw: st.DrawFn) -> list[Any]:
    samples = []
    for group in range(draw(st.integers(1, 4))):
        for _ in range(draw(st.integers(1, 4))):  # partial groups: 1 to 4 attempts
            index = len(samples)
            if draw(st.booleans()) and draw(st.booleans()):
                samples.append(infra(group, index))
            else:
                samples.append(valid(group, index, float(draw(st.integers(0, 1)))))
    return samples


@settings(max_examples=200)
@given(batches(), st.booleans())
def test_arms_differ_exactly_in_groups_with_a_failure(samples: list[Any], std: bool) -> None:
    args = _args(grpo_std_normalization=std)
    _, ours = valid_group_advantages(args, samples)
    raw, theirs = upstream_advantages(args, samples)
    assert all(r == 0.0 for r, s in zip(raw, samples, strict=True) if s.remove_sample), "failures scored 0"
    for positions in upstream_groups(args, samples):
        failures = [p for p in positions if samples[p].remove_sample]
        if not failures:
            assert [theirs[p] for p in positions] == pytest.approx([ours[p] for p in positions], abs=1e-12)
            continue
        assert all(ours[p] == 0.0 for p in failures)
        rewards = [raw[p] for p in positions]
        mean = sum(rewards) / len(rewards)
        if not std:
            assert [theirs[p] for p in positions] == pytest.approx([r - mean for r in rewards], abs=1e-12)


def test_a_failure_shifts_the_valid_siblings_advantages_upstream() -> None:
    samples = [valid(0, 0, 1.0), valid(0, 1, 0.0), infra(0, 2), infra(0, 3)]
    _, ours = valid_group_advantages(_args(grpo_std_normalization=False), samples)
    _, theirs = upstream_advantages(_args(grpo_std_normalization=False), samples)
    assert ours == [0.5, -0.5, 0.0, 0.0]
    assert theirs == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_without_group_index_a_partial_batch_is_one_whole_batch_group_upstream() -> None:
    samples = [valid(None, i, float(i % 2)) for i in range(6)]
    assert upstream_groups(_args(), samples) == [list(range(6))]
    full = [valid(None, i, float(i % 2)) for i in range(8)]
    assert upstream_groups(_args(n_samples_per_prompt=4, rollout_batch_size=2), full) == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
    ]
    with pytest.raises(ValueError, match="refuses to guess"):
        valid_group_advantages(_args(), samples)
