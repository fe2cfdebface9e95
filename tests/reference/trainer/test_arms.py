"""rl360's train hooks against Miles' defaults: the updates differ exactly where masked samples enter
Miles' loss denominator (hypothesis over batches with masked samples and partial groups)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.reference.trainer.trainer import Trainer, TrainerConfig
from rl360_ext.rollout.sample import Sample
from tests.reference.trainer.helpers import SMALL, small_weights

WEIGHTS = small_weights(7)
UPSTREAM = {"pg_loss_reducer_path": None, "tis_function_path": None}


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[Sample], list[float]]:
    count = draw(st.integers(2, 6))
    samples, advantages = [], []
    for index in range(count):
        prompt = draw(st.integers(1, 4))
        length = draw(st.integers(1, 5))
        masked = draw(st.booleans())
        mask = [0] * length if masked else draw(st.lists(st.integers(0, 1), min_size=length, max_size=length))
        tokens = draw(
            st.lists(st.integers(0, SMALL.vocab_size - 1), min_size=prompt + length, max_size=prompt + length)
        )
        samples.append(
            Sample(group_index=draw(st.integers(0, 2)), index=index, tokens=tokens, response_length=length,
                   loss_mask=mask, rollout_log_probs=[-1.0] * length, remove_sample=masked)
        )  # fmt: skip
        advantages.append(0.0 if masked else draw(st.floats(-2, 2, allow_nan=False)))
    return samples, advantages


def _first_moment(
    config: TrainerConfig, samples: list[Sample], advantages: list[float]
) -> dict[str, np.ndarray]:
    trainer = Trainer(SMALL, WEIGHTS, config)
    trainer.train_step(samples, advantages)
    return trainer.optimizer.m


@settings(max_examples=25)
@given(batches())
def test_arms_differ_by_the_valid_share_exactly_when_samples_are_masked(
    batch: tuple[list[Sample], list[float]],
) -> None:
    samples, advantages = batch
    rl360 = _first_moment(TrainerConfig(clip_grad=0.0, r3=False), samples, advantages)
    upstream = _first_moment(TrainerConfig(clip_grad=0.0, r3=False, **UPSTREAM), samples, advantages)
    valid = sum(1 for s in samples if sum(s.loss_mask) > 0)
    share = valid / len(samples)
    for name in rl360:
        np.testing.assert_allclose(upstream[name], share * rl360[name], rtol=1e-9, atol=1e-15)
