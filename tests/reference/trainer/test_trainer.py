"""The train step: Miles' data rules, loss scaling and hooks, one update lowering the loss, R3 replay."""

from __future__ import annotations

import numpy as np
import pytest

from rl360_ext.reference.engine.engine import EngineConfig, TinyEngine
from rl360_ext.reference.engine.protocol import decode_routed_experts, parse_generate_request
from rl360_ext.reference.trainer.backward import TrainModel
from rl360_ext.reference.trainer.data import train_data
from rl360_ext.reference.trainer.loss import compute_policy_loss, micro_batch_loss, sum_of_sample_mean
from rl360_ext.reference.trainer.trainer import Trainer, TrainerConfig
from tests.reference.trainer.helpers import SMALL, sample, small_weights

REWARDS = [1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.25, -0.25]
UPSTREAM = {"pg_loss_reducer_path": None, "tis_function_path": None}


def _batch(masked: tuple[int, ...] = ()) -> list:
    weights = small_weights()
    return [sample(weights, i, group_index=i // 4, remove=i in masked) for i in range(8)]


def _objective(trainer: Trainer, samples: list, rewards: list[float]) -> float:
    """The step's loss at the trainer's current weights, with old log-probs = the samples' rollout ones."""
    data = train_data(samples, rewards)
    new = []
    for i in range(len(data)):
        log_probs, _ = trainer.model.forward(
            data.tokens[i], data.total_lengths[i] - data.response_lengths[i], data.rollout_routed_experts[i]
        )
        new.append(log_probs)
    result = micro_batch_loss(
        args=trainer.args,
        new_log_probs=new,
        old_log_probs=data.rollout_log_probs,
        trainer_scored_log_probs=data.rollout_log_probs,
        rollout_log_probs=data.rollout_log_probs,
        advantages=data.advantages(),
        loss_masks=data.loss_masks,
        response_lengths=data.response_lengths,
        total_lengths=data.total_lengths,
        denominators=data.rollout_mask_sums,
        normalizer=float(len(data)),
        tis_function=trainer.tis_function,
        reducer_factory=trainer.reducer_factory,
    )
    return result.loss


@pytest.mark.parametrize("overrides", [{}, UPSTREAM], ids=["rl360-hooks", "miles-defaults"])
def test_one_update_lowers_the_batch_loss(overrides: dict) -> None:
    samples = _batch(masked=(2,))
    trainer = Trainer(SMALL, small_weights(), TrainerConfig(lr=1e-3, **overrides))
    before = _objective(trainer, samples, REWARDS)
    metrics = trainer.train_step(samples, REWARDS)
    after = _objective(trainer, samples, REWARDS)
    assert metrics["train/logprob_abs_diff_max"] <= 1e-9  # same weights as the rollout
    assert metrics["train/routing_agreement"] == 1.0
    assert after < before - 1e-4


def test_loss_scale_rl360_reducer_is_one_and_miles_default_shrinks() -> None:
    samples = _batch(masked=(1, 5))
    rl360 = Trainer(SMALL, small_weights(), TrainerConfig()).train_step(samples, REWARDS)
    miles = Trainer(SMALL, small_weights(), TrainerConfig(**UPSTREAM)).train_step(samples, REWARDS)
    assert rl360["train/valid_samples"] == 6 and rl360["train/masked_samples"] == 2
    assert rl360["train/loss_scale"] == pytest.approx(1.0)
    assert miles["train/loss_scale"] == pytest.approx(6 / 8)
    clean = Trainer(SMALL, small_weights(), TrainerConfig(**UPSTREAM)).train_step(_batch(), REWARDS)
    assert clean["train/loss_scale"] == pytest.approx(1.0)


def test_masked_samples_change_nothing_with_rl360_hooks() -> None:
    """Adding infra samples to the step leaves the rl360 update identical; Miles' default shrinks it."""
    weights = small_weights()
    kept = [sample(weights, i, group_index=i // 4) for i in range(4)]
    infra = [sample(weights, 10 + i, group_index=9, remove=True) for i in range(4)]
    for overrides, same in (({}, True), (UPSTREAM, False)):
        config = TrainerConfig(clip_grad=0.0, **overrides)
        alone = Trainer(SMALL, weights, config)
        alone.train_step(kept, REWARDS[:4])
        diluted = Trainer(SMALL, weights, config)
        diluted.train_step(kept + infra, REWARDS[:4] + [0.0] * 4)
        m_alone = alone.optimizer.m["lm_head"]
        m_diluted = diluted.optimizer.m["lm_head"]
        if same:
            np.testing.assert_allclose(m_diluted, m_alone, rtol=1e-10, atol=1e-15)
        else:
            np.testing.assert_allclose(m_diluted, 0.5 * m_alone, rtol=1e-10, atol=1e-15)


def test_micro_batches_sum_to_the_global_batch_gradient() -> None:
    """Miles' loss_function divides each micro-batch by the global batch's sample count."""
    samples = _batch()
    whole = Trainer(SMALL, small_weights(), TrainerConfig(clip_grad=0.0, **UPSTREAM))
    whole.train_step(samples, REWARDS)
    split = Trainer(SMALL, small_weights(), TrainerConfig(clip_grad=0.0, micro_batch_size=3, **UPSTREAM))
    split.train_step(samples, REWARDS)
    for name in whole.weights:
        np.testing.assert_allclose(split.optimizer.m[name], whole.optimizer.m[name], rtol=1e-9, atol=1e-15)


def test_steps_per_rollout_takes_that_many_optimizer_steps_and_clips() -> None:
    trainer = Trainer(SMALL, small_weights(), TrainerConfig(steps_per_rollout=2, lr=3e-2))
    samples = _batch()
    trainer.train_step(samples, REWARDS)
    metrics = trainer.train_step(samples, REWARDS)
    assert metrics["train/optimizer_steps"] == 2
    assert trainer.optimizer.steps == 4
    assert metrics["train/pg_clipfrac"] > 0  # the second global batch sees moved weights
    assert metrics["train/tis_clipfrac"] >= 0


def test_policy_loss_matches_miles_rules() -> None:
    ppo_kl = np.log(np.array([1.0, 1 / 1.5, 1 / 0.5, 1 / 1.1]))  # ratios 1, 1.5, 0.5, 1.1
    adv = np.array([1.0, 1.0, -1.0, -1.0])
    pg, clipfrac, grad = compute_policy_loss(ppo_kl, adv, 0.2, 0.28)
    np.testing.assert_allclose(pg, [-1.0, -1.28, 0.8, 1.1])
    np.testing.assert_array_equal(clipfrac, [0, 1, 1, 0])
    np.testing.assert_allclose(grad, [-1.0, 0.0, 0.0, 1.1])


def test_train_data_follows_miles_conversion() -> None:
    weights = small_weights()
    removed = sample(weights, 0, remove=True)
    no_mask = sample(weights, 1, masked_span=None)
    no_mask.loss_mask = None
    data = train_data([removed, no_mask], [0.0, 1.0], [float("nan"), 1.0])
    assert data.loss_masks[0].sum() == 0 and data.valid == [False, True]
    assert data.loss_masks[1].tolist() == [1.0] * no_mask.response_length
    assert data.rollout_mask_sums == [0.0, float(no_mask.response_length)]
    np.testing.assert_array_equal(data.advantages()[1], np.ones(no_mask.response_length))
    broken = sample(weights, 2)
    broken.loss_mask = broken.loss_mask[:-1]
    with pytest.raises(ValueError, match="loss_mask"):
        train_data([broken], [0.0])
    with pytest.raises(ValueError, match="rewards"):
        train_data([broken], [])


def test_sum_of_sample_mean_is_miles_default() -> None:
    masks = [np.array([1.0, 0.0, 1.0]), np.zeros(2)]
    reduce = sum_of_sample_mean([5, 4], [3, 2], masks, denominators=[2.0, 0.0])
    assert reduce(np.array([1.0, 5.0, 3.0, 7.0, 7.0])) == pytest.approx(2.0)


def test_non_linear_reducer_is_refused() -> None:
    def squared(total_lengths, response_lengths, loss_masks, per_token):
        return lambda x: (x * x).sum()

    trainer = Trainer(SMALL, small_weights(), TrainerConfig())
    trainer.reducer_factory = squared
    with pytest.raises(ValueError, match="reducer"):
        trainer.train_step(_batch(), REWARDS)


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="lr"):
        TrainerConfig(lr=0.0)
    with pytest.raises(ValueError, match="steps_per_rollout"):
        TrainerConfig(steps_per_rollout=0)
    with pytest.raises(ValueError, match="tis_clip_low"):
        TrainerConfig(tis_clip_low=3.0)


def test_r3_replay_reproduces_the_engines_routing() -> None:
    """The engine's recorded routing (incremental decode over its KV cache) replays exactly, and
    with float64 the trainer's own top-k agrees on every row and its log-probs to 1e-9."""
    engine = TinyEngine(EngineConfig(seed=4))
    prompt = engine.encode("Which of these numbers is prime? A) 4 B) 9 C) 7 D) 15")
    body = {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": 24, "temperature": 1.0, "sampling_seed": 3},
        "return_logprob": True,
        "return_routed_experts": True,
    }
    response = engine.generate(parse_generate_request(body, engine.vocab_size, engine.encode))
    meta = response["meta_info"]
    tokens = prompt + response["output_ids"]
    cfg = engine.model_config
    routing = decode_routed_experts(meta["routed_experts"], cfg.layers, cfg.top_k)
    assert routing.shape == (len(tokens) - 1, cfg.layers, cfg.top_k)
    model = TrainModel(cfg, engine.model.weights)
    log_probs, tape = model.forward(np.asarray(tokens), len(prompt), routing)
    assert np.array_equal(tape.used_routing, routing)
    assert np.array_equal(np.sort(tape.own_routing, axis=-1), np.sort(routing, axis=-1))
    recorded = np.array([entry[0] for entry in meta["output_token_logprobs"]])
    np.testing.assert_allclose(log_probs, recorded, rtol=0, atol=1e-9)
    other = (routing + 1) % cfg.experts
    replayed, other_tape = model.forward(np.asarray(tokens), len(prompt), other)
    assert np.array_equal(other_tape.used_routing, other)
    assert not np.allclose(replayed, log_probs)
