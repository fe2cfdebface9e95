"""The dynamic filter keeps a group only for >= 2 valid attempts with differing rewards."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.rollout.filters import (
    INSUFFICIENT_VALID_REWARDS,
    ZERO_STD_VALID,
    DynamicFilterOutput,
    check_valid_reward_nonzero_std,
)
from rl360_ext.rollout.metrics import REGISTRY

from .duck_samples import infra, valid

ARGS = SimpleNamespace(reward_key=None)


@pytest.fixture(autouse=True)
def empty_registry() -> Iterator[None]:
    REGISTRY.drain()
    yield
    REGISTRY.drain()


def test_keeps_differing_valid_rewards_despite_infra() -> None:
    group = [valid(1, 0, 1.0), valid(1, 1, 0.0), infra(1, 2), infra(1, 3, reward=0.0)]
    output = check_valid_reward_nonzero_std(ARGS, group)
    assert isinstance(output, DynamicFilterOutput)
    assert output.keep is True and output.reason is None


def test_one_valid_attempt_is_not_enough() -> None:
    output = check_valid_reward_nonzero_std(ARGS, [valid(1, 0, 1.0), infra(1, 1, reward=0.0), infra(1, 2)])
    assert (output.keep, output.reason) == (False, INSUFFICIENT_VALID_REWARDS)


def test_infra_zeros_do_not_make_an_all_pass_group_look_informative() -> None:
    group = [valid(1, 0, 1.0), valid(1, 1, 1.0), infra(1, 2, reward=0.0)]
    output = check_valid_reward_nonzero_std(ARGS, group)
    assert (output.keep, output.reason) == (False, ZERO_STD_VALID)


def test_nested_groups_and_dict_rewards() -> None:
    args = SimpleNamespace(reward_key="score")
    a, b = valid(4, 0, 0.0), valid(4, 1, 0.0)
    a.reward, b.reward = {"score": 0.25}, {"score": 0.75}
    assert check_valid_reward_nonzero_std(args, [[a], [b, infra(4, 2)]]).keep


def test_every_judged_group_is_recorded_for_the_metrics_hook() -> None:
    check_valid_reward_nonzero_std(ARGS, [valid(1, 0, 1.0), valid(1, 1, 0.0)])
    check_valid_reward_nonzero_std(ARGS, [valid(2, 2, 1.0), infra(2, 3)])
    groups, overflowed = REGISTRY.drain()
    assert overflowed == 0
    assert [(g.group_index, g.keep, g.reason) for g in groups] == [
        (1, True, None),
        (2, False, INSUFFICIENT_VALID_REWARDS),
    ]
    assert [a["attempt_class"] for a in groups[1].attempts] == ["valid", "infra:sandbox_lost"]


def test_a_valid_sample_without_a_reward_is_an_error_not_a_zero() -> None:
    broken = valid(1, 0, 1.0)
    broken.reward = None
    with pytest.raises(ValueError, match="no numeric reward"):
        check_valid_reward_nonzero_std(ARGS, [broken, valid(1, 1, 0.0)])


@settings(max_examples=150)
@given(
    rewards=st.lists(st.sampled_from([0.0, 0.5, 1.0]), max_size=6),
    infra_rewards=st.lists(st.one_of(st.none(), st.sampled_from([0.0, 1.0, -5.0])), max_size=6),
)
def test_decision_depends_only_on_valid_rewards(
    rewards: list[float], infra_rewards: list[float | None]
) -> None:
    valid_only = [valid(9, i, r) for i, r in enumerate(rewards)]
    mixed = valid_only + [infra(9, 100 + i, reward=r) for i, r in enumerate(infra_rewards)]
    plain = check_valid_reward_nonzero_std(ARGS, valid_only)
    with_infra = check_valid_reward_nonzero_std(ARGS, mixed)
    assert (plain.keep, plain.reason) == (with_infra.keep, with_infra.reason)
    assert plain.keep == (len(rewards) >= 2 and len(set(rewards)) > 1)
    REGISTRY.drain()
