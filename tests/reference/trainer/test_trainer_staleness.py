"""The reference trainer logs the staleness metrics of samples that carry version arrays."""

from __future__ import annotations

from rl360_ext.reference.trainer.trainer import Trainer, TrainerConfig
from rl360_ext.sglang.versions import UNVERSIONED, VERSIONS_KEY
from tests.reference.trainer.helpers import SMALL, sample, small_weights

REWARDS = [1.0, -1.0, 0.5, -0.5]


def _versioned(index: int, output_version: int, remove: bool = False):
    item = sample(small_weights(), index, group_index=0, remove=remove)
    n, response = len(item.tokens), item.response_length
    prompt = n - response
    item.metadata[VERSIONS_KEY] = {
        "token_version": [UNVERSIONED] * prompt + [output_version] * response,
        "kv_version": [output_version] * n,
        "turn_first_version": [output_version],
    }
    return item


def test_train_step_logs_token_ages_against_the_policy_version() -> None:
    samples = [_versioned(0, 2), _versioned(1, 2), _versioned(2, 1), _versioned(3, 0, remove=True)]
    metrics = Trainer(SMALL, small_weights(), TrainerConfig()).train_step(samples, REWARDS, policy_version=3)
    trained = 8 - 2  # response_length 8 with a loss-mask-0 span of 2
    assert metrics["staleness/aged_tokens"] == 3 * trained  # the removed sample does not train
    assert metrics["staleness/token_age_max"] == 2
    assert metrics["staleness/token_age_hist/1"] == 2 / 3
    assert metrics["staleness/group_version_spread_max"] == 1
    assert metrics["staleness/mixed_version_frac"] == 0.0
    assert "kv/stale_prefix_tokens_frac" not in metrics  # no turn_output_start


def test_policy_version_defaults_to_the_steps_taken_and_plain_samples_log_nothing() -> None:
    trainer = Trainer(SMALL, small_weights(), TrainerConfig())
    first = trainer.train_step([_versioned(i, 0) for i in range(4)], REWARDS)
    second = trainer.train_step([_versioned(i, 0) for i in range(4)], REWARDS)
    assert first["staleness/token_age_mean"] == 0 and second["staleness/token_age_mean"] == 1
    plain = trainer.train_step([sample(small_weights(), i) for i in range(4)], REWARDS)
    assert not [key for key in plain if key.startswith(("staleness/", "kv/", "r3/"))]
