"""The A/B tests' quiz problem: the demo's quizzes around a small random model (the offline A/B and
the exploitable mode's tests run on it; the latter fits its LM head first)."""

from __future__ import annotations

import pytest

from rl360_ext.local.ab.problem import Problem, quiz_problem
from rl360_ext.reference.engine.model import ModelConfig, init_weights
from rl360_ext.reference.trainer.trainer import TrainerConfig


@pytest.fixture(scope="module")
def problem() -> Problem:
    model = ModelConfig(
        vocab_size=580, layers=1, experts=2, top_k=1, d_model=16, heads=2, head_dim=8, expert_hidden=16
    )
    trainer = TrainerConfig(
        lr=1e-2,
        decoupled_lr=5e-2,
        eps_clip=0.2,
        eps_clip_high=0.28,
        keep_old_actor=True,
        use_dynamic_global_batch_size=True,
        max_token_age=1,
    )
    return quiz_problem(model, init_weights(model, 3), trainer)
