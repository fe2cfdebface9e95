"""The warm starts: the base-model stage separates prompts, the format head keeps letters equal."""

from __future__ import annotations

import numpy as np
import pytest

from rl360_ext.reference.trainer.optim import AdamW
from rl360_ext.reference.trainer.trainer import Trainer, TrainerConfig
from rl360_ext.reference.trainer.warm_start import fit_head, fit_labels, head_features, separation
from tests.reference.trainer.helpers import SMALL, small_weights

LETTERS = [30, 31, 32, 33]
LABELS = [5, 6, 7, 8]


def _prompts(seed: int, per_group: int = 3) -> tuple[list[list[int]], list[int]]:
    """Four 'questions' sharing a long common tail (as the quiz agent's answer prompts do), each
    asked with a few random tokens in between; the group of each prompt."""
    rng = np.random.default_rng(seed)
    heads = [rng.integers(10, 30, 4).tolist() for _ in range(4)]
    tail = rng.integers(10, 30, 10).tolist()
    prompts, groups = [], []
    for group, head in enumerate(heads):
        for _ in range(per_group):
            prompts.append([*head, int(rng.integers(10, 30)), *tail])
            groups.append(group)
    return prompts, groups


def test_separation_is_one_for_identical_rows_and_zero_for_orthogonal_ones() -> None:
    assert separation(np.ones((4, 3)), [0, 0, 1, 1]) == pytest.approx(1.0)
    assert separation(np.eye(3), [0, 1, 2]) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="two groups"):
        separation(np.eye(3), [0, 0, 0])


def test_fit_labels_separates_the_prompts_and_trains_every_tensor() -> None:
    weights = small_weights(4)
    prompts, groups = _prompts(1)
    held_out, held_groups = _prompts(1, per_group=2)  # same questions, other random middles
    before = separation(head_features(SMALL, weights, held_out), held_groups)
    trained, prob, steps = fit_labels(
        SMALL, weights, prompts, [LABELS[g] for g in groups], batch_size=6, lr=1e-2, steps=60
    )
    after = separation(head_features(SMALL, trained, held_out), held_groups)
    assert prob >= 0.9 and steps == 60
    assert after < before - 0.3, (before, after)
    assert all(not np.array_equal(weights[name], trained[name]) for name in weights)
    assert np.array_equal(weights["lm_head"], small_weights(4)["lm_head"])  # the input is not modified


def test_fit_labels_refuses_mismatched_labels() -> None:
    with pytest.raises(ValueError, match="one label per prompt"):
        fit_labels(SMALL, small_weights(), [[1, 2, 3]], [4, 5])


def test_format_head_after_the_base_stage_gives_equal_letters_at_high_mass() -> None:
    prompts, groups = _prompts(2)
    based, _, _ = fit_labels(SMALL, small_weights(5), prompts, [LABELS[g] for g in groups], lr=1e-2, steps=60)
    weights, mass = fit_head(SMALL, based, prompts, LETTERS, target_mass=0.8)
    assert mass >= 0.8
    features = head_features(SMALL, weights, prompts)
    logits = features @ weights["lm_head"]
    np.testing.assert_allclose(logits[:, LETTERS], logits[:, LETTERS[:1]].repeat(4, axis=1), atol=1e-9)


def test_decoupled_lr_moves_embedding_and_head_at_their_own_rate() -> None:
    params = {"embed": np.zeros(3), "lm_head": np.zeros(3), "w": np.zeros(3)}
    optimizer = AdamW(params, 1e-3, lrs={"embed": 1e-1, "lm_head": 1e-1})
    optimizer.step({name: np.ones(3) for name in params})
    np.testing.assert_allclose(params["w"], -1e-3, rtol=1e-6)
    np.testing.assert_allclose(params["lm_head"], -1e-1, rtol=1e-6)
    with pytest.raises(ValueError, match="unknown tensors"):
        AdamW(params, 1e-3, lrs={"nope": 1.0})
    trainer = Trainer(SMALL, small_weights(), TrainerConfig(lr=1e-3, decoupled_lr=2e-2))
    assert trainer.optimizer.lrs == {"embed": 2e-2, "lm_head": 2e-2}
    with pytest.raises(ValueError, match="decoupled_lr"):
        TrainerConfig(decoupled_lr=0.0)
