"""Fidelity to Miles 31f1ca96: rollout-id mask sums and normalizer, global batches, dual clip,
eps_clip_high's default, a sound reducer probe, effective weights, the BLAS thread scope."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.reference.engine.threads import blas_threads
from rl360_ext.reference.trainer.data import global_batches, rollout_mask_sums, train_data
from rl360_ext.reference.trainer.loss import compute_policy_loss, micro_batch_loss, reducer_coefficients
from rl360_ext.reference.trainer.trainer import Trainer, TrainerConfig
from rl360_ext.train.reducers import valid_sample_mean
from tests.reference.trainer.helpers import SMALL, sample, small_weights

UPSTREAM = {"pg_loss_reducer_path": None, "tis_function_path": None}
REWARDS = [1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.25, -0.25]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.lists(st.integers(0, 1), max_size=6)), max_size=12))
def test_rollout_mask_sums_total_each_rollout(rows: list[tuple[int, list[int]]]) -> None:
    ids = [rollout for rollout, _ in rows]
    masks = [np.asarray(mask, np.float64) for _, mask in rows]
    sums = rollout_mask_sums(ids, masks)
    for position, rollout in enumerate(ids):
        assert sums[position] == sum(float(m.sum()) for r, m in zip(ids, masks, strict=True) if r == rollout)


@settings(max_examples=200, deadline=None)
@given(
    ids=st.lists(st.integers(0, 9), max_size=30),
    steps=st.integers(1, 4),
    size=st.none() | st.integers(1, 5),
    dynamic=st.booleans(),
)
def test_global_batches_keep_rollouts_whole(
    ids: list[int], steps: int, size: int | None, dynamic: bool
) -> None:
    rollouts = list(dict.fromkeys(ids))
    if size is not None and not dynamic and 0 < len(rollouts) < size:
        with pytest.raises(ValueError, match="global_batch_size"):
            global_batches(ids, steps, size, dynamic)
        return
    batches, dropped = global_batches(ids, steps, size, dynamic)
    seen = sorted([p for b in batches for p in b.positions] + dropped)
    assert seen == list(range(len(ids)))
    for batch in batches:
        held = {ids[p] for p in batch.positions}
        assert batch.num_rollouts == len(held)
        assert all(ids[p] not in held for p in dropped)
        if dynamic:
            assert len(batches) == 1
        elif size is not None:
            assert batch.num_rollouts == size
    if size is not None and not dynamic:
        assert len({ids[p] for p in dropped}) < size
        assert {ids[p] for p in dropped} == set(rollouts[len(batches) * size :])
    elif rollouts:
        assert not dropped and len(batches) == (1 if dynamic else min(steps, len(rollouts)))


def test_siblings_of_one_rollout_train_as_the_whole_sample() -> None:
    """Miles: siblings sharing a rollout id carry its whole mask sum and count once in the
    normalizer, so splitting a sample's trained tokens over two siblings changes no gradient."""
    weights = small_weights()
    whole = [sample(weights, i, group_index=i // 2) for i in range(4)]
    first, second = copy.deepcopy(whole[0]), copy.deepcopy(whole[0])
    mask = np.asarray(whole[0].loss_mask)
    cut = np.flatnonzero(mask)[2]
    first.loss_mask = np.where(np.arange(len(mask)) < cut, mask, 0).tolist()
    second.loss_mask = np.where(np.arange(len(mask)) >= cut, mask, 0).tolist()
    for sibling in (first, second):
        sibling.rollout_id = 0
    split = [first, second, *whole[1:]]
    data = train_data(split, [REWARDS[0], *REWARDS[:4]])
    assert data.rollout_mask_sums[:2] == [float(mask.sum())] * 2
    config = TrainerConfig(clip_grad=0.0, **UPSTREAM)
    reference = Trainer(SMALL, weights, config)
    reference.train_step(whole, REWARDS[:4])
    siblings = Trainer(SMALL, weights, config)
    siblings.train_step(split, [REWARDS[0], *REWARDS[:4]])
    for name in reference.weights:
        np.testing.assert_allclose(
            siblings.optimizer.m[name], reference.optimizer.m[name], rtol=1e-9, atol=1e-15
        )


def test_global_batch_size_drops_trailing_rollouts_and_dynamic_takes_one_step() -> None:
    samples = [sample(small_weights(), i, group_index=i // 4) for i in range(5)]
    metrics = Trainer(SMALL, small_weights(), TrainerConfig(global_batch_size=2)).train_step(
        samples, REWARDS[:5]
    )
    assert metrics["train/optimizer_steps"] == 2 and metrics["train/dropped_samples"] == 1
    dynamic = TrainerConfig(use_dynamic_global_batch_size=True)
    metrics = Trainer(SMALL, small_weights(), dynamic).train_step(samples, REWARDS[:5])
    assert metrics["train/optimizer_steps"] == 1 and metrics["train/dropped_samples"] == 0
    with pytest.raises(ValueError, match="steps_per_rollout"):
        TrainerConfig(use_dynamic_global_batch_size=True, steps_per_rollout=2)
    with pytest.raises(ValueError, match="not both"):
        TrainerConfig(global_batch_size=2, steps_per_rollout=2)


def test_dual_clip_bounds_negative_advantages() -> None:
    ratios = np.array([5.0, 2.0, 5.0, 0.5])
    adv = np.array([-1.0, -1.0, 1.0, -1.0])
    pg, clipfrac, grad = compute_policy_loss(-np.log(ratios), adv, 0.2, 0.2, eps_clip_c=3.0)
    np.testing.assert_allclose(pg, [3.0, 2.0, -1.2, 0.8])
    np.testing.assert_allclose(grad, [0.0, 2.0, 0.0, 0.0])
    np.testing.assert_array_equal(clipfrac, [0, 0, 1, 1])  # the first clip only, as Miles counts
    plain, _, _ = compute_policy_loss(-np.log(ratios), adv, 0.2, 0.2)
    np.testing.assert_allclose(plain, [5.0, 2.0, -1.2, 0.8])
    with pytest.raises(ValueError, match="eps_clip_c"):
        compute_policy_loss(np.zeros(1), np.ones(1), 0.2, 0.2, eps_clip_c=1.0)
    with pytest.raises(ValueError, match="eps_clip_c"):
        TrainerConfig(eps_clip_c=0.5)


def test_eps_clip_high_defaults_to_eps_clip_as_miles_resolves_it() -> None:
    assert TrainerConfig(eps_clip=0.15).miles_args().eps_clip_high == 0.15
    assert TrainerConfig(eps_clip_high=0.28).miles_args().eps_clip_high == 0.28
    assert TrainerConfig(eps_clip_c=3.0).miles_args().eps_clip_c == 3.0


def _position_weighted(total_lengths, response_lengths, loss_masks, per_token):
    """A linear reducer that weights each token by its position in the response (1, 2, 3, ...)."""

    def reduce(x):
        total, start = 0.0, 0
        for length, mask in zip(response_lengths, loss_masks, strict=True):
            total += (x[start : start + length] * mask * np.arange(1, length + 1)).sum() / max(mask.sum(), 1)
            start += length
        return total

    return reduce


def _max_per_sample(total_lengths, response_lengths, loss_masks, per_token):
    """Not linear, but equal to a per-sample mean on per-sample indicators and on inputs constant
    within each sample (an on-policy batch without TIS): what fooled the per-sample probe alone."""

    def reduce(x):
        total, start = 0.0, 0
        for length, mask in zip(response_lengths, loss_masks, strict=True):
            piece = x[start : start + length][mask > 0]
            total += piece.max() if len(piece) else 0.0
            start += length
        return total

    return reduce


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.floats(-3, 3), min_size=1, max_size=6), min_size=1, max_size=5))
def test_reducer_coefficients_recover_any_linear_reducer(weights: list[list[float]]) -> None:
    lengths = [len(w) for w in weights]
    flat = np.concatenate([np.asarray(w) for w in weights])
    masks = [np.ones(n) for n in lengths]
    np.testing.assert_allclose(
        reducer_coefficients(lambda x: (flat * x).sum(), lengths, masks), flat, atol=1e-12
    )


def _on_policy_batch(reducer_factory):
    """micro_batch_loss on an on-policy batch (new == old), no TIS: constant pg loss per sample."""
    samples = [sample(small_weights(), i) for i in range(3)]
    data = train_data(samples, [1.0, -1.0, 0.5])
    args = TrainerConfig(use_tis=False).miles_args()
    return data, micro_batch_loss(
        args=args,
        new_log_probs=data.rollout_log_probs,
        old_log_probs=data.rollout_log_probs,
        trainer_scored_log_probs=data.rollout_log_probs,
        rollout_log_probs=data.rollout_log_probs,
        advantages=data.advantages(),
        loss_masks=data.loss_masks,
        response_lengths=data.response_lengths,
        total_lengths=data.total_lengths,
        denominators=data.rollout_mask_sums,
        normalizer=3.0,
        tis_function=None,
        reducer_factory=reducer_factory,
    )


def test_a_position_weighting_reducer_gets_its_own_gradient() -> None:
    data, result = _on_policy_batch(_position_weighted)
    for i, dlogprobs in enumerate(result.dlogprobs):
        mask = data.loss_masks[i]
        positions = np.arange(1, len(mask) + 1)
        expected = -data.rewards[i] * positions * mask / mask.sum() / 3.0  # d(-r A)/d log p = -A at r = 1
        np.testing.assert_allclose(dlogprobs, expected, rtol=1e-12)


def test_a_reducer_linear_only_on_per_sample_probes_is_refused() -> None:
    with pytest.raises(ValueError, match="not linear"):
        _on_policy_batch(_max_per_sample)


def test_effective_weights_show_micro_batch_reweighting() -> None:
    """valid_sample_mean per micro-batch: a micro-batch with a masked sample weighs its valid ones
    more, and the loss scale can still read 1.0; the effective weights say so."""
    weights = small_weights()
    samples = [sample(weights, i, group_index=i // 4, remove=i in (0, 1, 2)) for i in range(8)]
    split = Trainer(SMALL, weights, TrainerConfig(micro_batch_size=4)).train_step(samples, REWARDS)
    # micro-batch 1 holds 1 valid of 4 (scale 4), micro-batch 2 holds 4 of 4; / 8 rollouts: sample 3
    # weighs 4/8, samples 4-7 1/8 each, against 1/5 each for a mean over the 5 valid samples
    assert split["train/loss_scale"] == pytest.approx(1.0)
    assert split["train/effective_weight_max"] == pytest.approx(0.5 / 0.2)
    assert split["train/effective_weight_min"] == pytest.approx(0.125 / 0.2)
    whole = Trainer(SMALL, weights, TrainerConfig()).train_step(samples, REWARDS)
    assert whole["train/effective_weight_min"] == pytest.approx(1.0)
    assert whole["train/effective_weight_max"] == pytest.approx(1.0)


def test_the_train_step_scopes_blas_to_one_thread() -> None:
    seen: list[list[int]] = []

    def recording(total_lengths, response_lengths, loss_masks, per_token):
        seen.append(blas_threads())
        return valid_sample_mean(total_lengths, response_lengths, loss_masks, per_token)

    before = blas_threads()
    trainer = Trainer(SMALL, small_weights(), TrainerConfig())
    assert blas_threads() == before  # constructing a trainer changes nothing
    trainer.reducer_factory = recording
    trainer.train_step([sample(small_weights(), i) for i in range(2)], REWARDS[:2])
    assert blas_threads() == before
    assert seen and all(threads == [1] * len(before) for threads in seen)
