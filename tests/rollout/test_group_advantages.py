"""Valid-only group baselines: infra samples never enter a baseline and never move another advantage."""

from __future__ import annotations

import math
import statistics
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.rollout.rewards import valid_group_advantages

from .duck_samples import DuckSample, infra, valid


def grpo_args(**overrides: Any) -> SimpleNamespace:
    base = {
        "advantage_estimator": "grpo",
        "rewards_normalization": True,
        "grpo_std_normalization": True,
        "reward_key": None,
    }
    return SimpleNamespace(**{**base, **overrides})


def reference(samples: list[DuckSample], std_normalize: bool) -> list[float]:
    """Brute force: per group, over valid samples only, Miles' epsilon and unbiased std."""
    out = []
    for sample in samples:
        if sample.metadata["attempt_class"] != "valid":
            out.append(0.0)
            continue
        peers = [
            s.reward
            for s in samples
            if s.group_index == sample.group_index and s.metadata["attempt_class"] == "valid"
        ]
        if len(peers) < 2:
            out.append(0.0)
            continue
        advantage = sample.reward - sum(peers) / len(peers)
        std = statistics.stdev(peers)
        if std_normalize and std > 0:
            advantage /= std + 1e-6
        out.append(advantage)
    return out


def test_baseline_is_the_valid_mean_and_infra_gets_zero() -> None:
    samples = [valid(0, 0, 1.0), valid(0, 1, 0.0), valid(0, 2, 1.0), infra(0, 3, reward=0.0)]
    raw, advantages = valid_group_advantages(grpo_args(grpo_std_normalization=False), samples)
    assert raw[:3] == [1.0, 0.0, 1.0] and math.isnan(raw[3])
    assert advantages == pytest.approx([1 / 3, -2 / 3, 1 / 3, 0.0])


def test_std_normalization_over_valid_samples() -> None:
    samples = [valid(0, 0, 1.0), valid(0, 1, 0.0), infra(0, 2), valid(1, 3, 0.5), valid(1, 4, 0.5)]
    _, advantages = valid_group_advantages(grpo_args(), samples)
    assert advantages == pytest.approx(reference(samples, std_normalize=True))
    assert advantages[0] == pytest.approx(0.5 / (statistics.stdev([1.0, 0.0]) + 1e-6))
    assert advantages[3:] == [0.0, 0.0]


def test_group_with_fewer_than_two_valid_contributes_zero() -> None:
    samples = [valid(0, 0, 1.0), infra(0, 1), infra(0, 2)]
    assert valid_group_advantages(grpo_args(), samples)[1] == [0.0, 0.0, 0.0]


def test_refuses_to_guess_groups() -> None:
    samples = [valid(0, 0, 1.0), valid(None, 1, 0.0)]
    with pytest.raises(ValueError, match="refuses to guess groups"):
        valid_group_advantages(grpo_args(), samples)


def test_explicit_group_sizes() -> None:
    samples = [valid(None, i, r) for i, r in enumerate([1.0, 0.0, 0.0, 1.0, 1.0])]
    _, advantages = valid_group_advantages(
        grpo_args(grpo_std_normalization=False), samples, prompt_group_sizes=[2, 3]
    )
    assert advantages == pytest.approx([0.5, -0.5, -2 / 3, 1 / 3, 1 / 3])
    with pytest.raises(ValueError, match="prompt_group_sizes"):
        valid_group_advantages(grpo_args(), samples, prompt_group_sizes=[2, 2])


def test_estimators() -> None:
    samples = [valid(0, 0, 1.0), valid(0, 1, 0.0), infra(0, 2)]
    _, rpp = valid_group_advantages(grpo_args(advantage_estimator="reinforce_plus_plus_baseline"), samples)
    assert rpp == pytest.approx([0.5, -0.5, 0.0])
    _, gspo = valid_group_advantages(grpo_args(advantage_estimator="gspo"), samples)
    assert gspo == pytest.approx(reference(samples, std_normalize=True))
    for estimator in ("ppo", "reinforce_plus_plus"):
        with pytest.raises(ValueError, match=estimator):
            valid_group_advantages(grpo_args(advantage_estimator=estimator), samples)


def test_rewards_normalization_off_passes_valid_rewards_through() -> None:
    samples = [valid(0, 0, 1.0), valid(0, 1, 0.25), infra(0, 2, reward=1.0)]
    raw, rewards = valid_group_advantages(grpo_args(rewards_normalization=False), samples)
    assert rewards == [1.0, 0.25, 0.0] and math.isnan(raw[2])


def test_compact_rollout_siblings_count_once() -> None:
    a1, a2, b = valid(0, 0, 1.0), valid(0, 1, 1.0), valid(0, 2, 0.0)
    a1.rollout_id = a2.rollout_id = 77
    _, advantages = valid_group_advantages(grpo_args(grpo_std_normalization=False), [a1, a2, b])
    assert advantages == pytest.approx([0.5, 0.5, -0.5])
    a2.reward = 0.0
    with pytest.raises(ValueError, match="different rewards"):
        valid_group_advantages(grpo_args(), [a1, a2, b])


def test_nested_input_is_rejected() -> None:
    with pytest.raises(TypeError, match="flat list"):
        valid_group_advantages(grpo_args(), [[valid(0, 0, 1.0)]])


groups_strategy = st.lists(
    st.lists(st.tuples(st.booleans(), st.sampled_from([0.0, 0.25, 1.0])), min_size=1, max_size=6),
    min_size=1,
    max_size=5,
)


def build(groups: list[list[tuple[bool, float]]]) -> list[DuckSample]:
    samples, index = [], 0
    for g, members in enumerate(groups):
        for is_valid_sample, reward in members:
            samples.append(valid(g, index, reward) if is_valid_sample else infra(g, index, reward=reward))
            index += 1
    return samples


@settings(max_examples=120)
@given(groups=groups_strategy, std_normalize=st.booleans())
def test_baselines_never_include_infra_samples(
    groups: list[list[tuple[bool, float]]], std_normalize: bool
) -> None:
    """Infra samples carry garbage rewards here; the result must equal a reference that ignores them."""
    samples = build(groups)
    _, advantages = valid_group_advantages(grpo_args(grpo_std_normalization=std_normalize), samples)
    assert advantages == pytest.approx(reference(samples, std_normalize))


@settings(max_examples=120)
@given(
    groups=groups_strategy,
    extra=st.lists(st.tuples(st.integers(0, 4), st.sampled_from([None, 0.0, 1.0])), max_size=8),
)
def test_adding_infra_samples_never_changes_another_advantage(
    groups: list[list[tuple[bool, float]]], extra: list[tuple[int, float | None]]
) -> None:
    samples = build(groups)
    _, before = valid_group_advantages(grpo_args(), samples)
    extras = [infra(g % len(groups), 1000 + i, reward=r) for i, (g, r) in enumerate(extra)]
    _, after = valid_group_advantages(grpo_args(), samples + extras)
    assert after[: len(samples)] == before
    assert after[len(samples) :] == [0.0] * len(extras)
