"""The rollout-side hooks inside Miles' own call sites, on real Miles `Sample`s.

- the dynamic filter through `call_dynamic_filter` (the call at inference_rollout_train.py) and
  Miles' `MetricGatherer` drop counters;
- the reward post-process through `convert_samples_to_train_data`, the function RolloutManager
  calls to build the trainer's batch (it calls the hook, checks lengths, zeroes masks);
- the rollout log function through Miles' `log_rollout_data`, after the same groups went
  through the filter, reading the JSONL the hook writes.
Each test also shows the upstream default on the same samples, so it could not pass by accident.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

FILTER = "rl360_ext.rollout.filters.check_valid_reward_nonzero_std"
POST_PROCESS = "rl360_ext.rollout.rewards.valid_group_advantages"
LOG_FUNCTION = "rl360_ext.rollout.metrics.log_rollout_metrics"
UPSTREAM_FILTER = "miles.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"


@pytest.fixture(autouse=True)
def _empty_filter_registry() -> None:
    """Groups recorded by an earlier test's filter calls must not leak into this test's metrics."""
    from rl360_ext.rollout.metrics import REGISTRY

    REGISTRY.drain()


def _filter(args, group):
    from miles.rollout.filter_hub.base_types import call_dynamic_filter
    from miles.utils.misc import load_function

    return call_dynamic_filter(load_function(args.dynamic_sampling_filter_path), args, group)


def test_filter_keeps_only_groups_with_two_differing_valid_rewards(make_args, make_sample) -> None:
    from miles.rollout.filter_hub.base_types import DynamicFilterOutput, MetricGatherer

    args = make_args(dynamic_sampling_filter_path=FILTER)
    learning = [make_sample(0, 0, 1.0), make_sample(0, 1, 0.0), make_sample(0, 2, infra="sandbox_lost")]
    all_pass = [make_sample(1, 3, 1.0), make_sample(1, 4, 1.0), make_sample(1, 5, infra="verifier_timeout")]
    one_valid = [
        make_sample(2, 6, 1.0),
        make_sample(2, 7, infra="no_sandbox"),
        make_sample(2, 8, infra="aborted"),
    ]
    nested = [
        [make_sample(3, 9, 0.0)],
        [make_sample(3, 10, 0.5)],
    ]  # list[Sample] elements, as multi-sample generate returns

    gatherer = MetricGatherer()
    outputs = {}
    for name, group in [
        ("learning", learning),
        ("all_pass", all_pass),
        ("one_valid", one_valid),
        ("nested", nested),
    ]:
        output = _filter(args, group)
        assert isinstance(output, DynamicFilterOutput)  # Miles' own type, not wrapped as keep=<object>
        outputs[name] = output
        if not output.keep:
            gatherer.on_dynamic_filter_drop(reason=output.reason)

    assert outputs["learning"].keep and outputs["nested"].keep
    assert (outputs["all_pass"].keep, outputs["all_pass"].reason) == (False, "zero_std_valid")
    assert (outputs["one_valid"].keep, outputs["one_valid"].reason) == (False, "insufficient_valid_rewards")
    assert gatherer.collect() == {
        "rollout/dynamic_filter/drop_zero_std_valid": 1,
        "rollout/dynamic_filter/drop_insufficient_valid_rewards": 1,
    }


def test_upstream_filter_cannot_judge_infra_samples(make_args, make_sample) -> None:
    """Why the rl360 filter exists: upstream's std check fails on an infra sample's missing reward."""
    args = make_args(dynamic_sampling_filter_path=UPSTREAM_FILTER)
    group = [make_sample(0, 0, 1.0), make_sample(0, 1, 1.0), make_sample(0, 2, infra="sandbox_lost")]
    with pytest.raises(TypeError):
        _filter(args, group)


def _train_data(args, samples):
    from miles.ray.rollout.train_data_conversion import convert_samples_to_train_data
    from miles.utils.misc import load_function

    post_process = None
    if args.custom_reward_post_process_path is not None:
        post_process = load_function(args.custom_reward_post_process_path)
    return convert_samples_to_train_data(
        args,
        samples,
        metadata={},
        custom_convert_samples_to_train_data_func=None,
        custom_reward_post_process_func=post_process,
    )


def test_reward_post_process_baseline_is_the_valid_mean_of_the_group(make_args, make_sample) -> None:
    args = make_args(custom_reward_post_process_path=POST_PROCESS, grpo_std_normalization=False)
    group_a = [
        make_sample(0, 0, 1.0),
        make_sample(0, 1, 1.0),
        make_sample(0, 2, 0.0),
        make_sample(0, 3, infra="sandbox_lost"),
    ]
    group_b = [
        make_sample(1, 4, 1.0),
        make_sample(1, 5, infra="no_sandbox"),
        make_sample(1, 6, infra="aborted"),
        make_sample(1, 7, infra="client_deadline"),
    ]
    samples = group_a + group_b

    data = _train_data(args, samples)

    baseline_a = 2 / 3
    expected = [1 - baseline_a, 1 - baseline_a, -baseline_a, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert data["rewards"] == pytest.approx(expected)
    assert data["raw_reward"][:3] == [1.0, 1.0, 0.0]
    assert all(math.isnan(r) for r in data["raw_reward"][3:4] + data["raw_reward"][5:])
    # Miles zeroes the loss mask of every sample rl360 marked remove_sample.
    assert [sum(mask) for mask in data["loss_masks"]] == [4, 4, 4, 0, 4, 0, 0, 0]


def test_reward_post_process_std_normalizes_over_valid_samples(make_args, make_sample) -> None:
    args = make_args(custom_reward_post_process_path=POST_PROCESS, grpo_std_normalization=True)
    samples = [
        make_sample(0, 0, 1.0),
        make_sample(0, 1, 0.0),
        make_sample(0, 2, 0.0),
        make_sample(0, 3, infra="verifier_crash"),
    ]
    data = _train_data(args, samples)
    valid = [1.0, 0.0, 0.0]
    mean = sum(valid) / 3
    std = math.sqrt(sum((r - mean) ** 2 for r in valid) / 2)
    assert data["rewards"] == pytest.approx([(r - mean) / (std + 1e-6) for r in valid] + [0.0])


def test_reward_post_process_refuses_the_whole_batch_fallback(make_args, make_sample) -> None:
    """A partial batch without group_index: upstream silently uses one whole-batch group; rl360 refuses."""
    samples = [make_sample(0, i, r) for i, r in enumerate([1.0, 1.0, 1.0, 0.0, 0.0, 0.0])]
    for sample in samples:
        sample.group_index = None

    upstream = _train_data(
        make_args(custom_reward_post_process_path=None, grpo_std_normalization=False), samples
    )
    assert upstream["rewards"] == pytest.approx(
        [0.5, 0.5, 0.5, -0.5, -0.5, -0.5]
    )  # one baseline for the batch

    args = make_args(custom_reward_post_process_path=POST_PROCESS)
    with pytest.raises(ValueError, match="group_index"):
        _train_data(args, samples)


def test_log_function_reports_reward_before_the_filter_over_valid_samples(
    make_args, make_sample, tmp_path: Path
) -> None:
    from miles.ray.rollout.metrics import log_rollout_data

    metrics_path = tmp_path / "metrics.jsonl"
    args = make_args(
        dynamic_sampling_filter_path=FILTER,
        custom_rollout_log_function_path=LOG_FUNCTION,
        rl360_metrics_path=str(metrics_path),
    )
    groups = [
        [
            make_sample(0, 0, 1.0),
            make_sample(0, 1, 0.0),
            make_sample(0, 2, 0.0),
            make_sample(0, 3, infra="sandbox_lost"),
        ],
        [make_sample(1, 4, 1.0), make_sample(1, 5, 1.0), make_sample(1, 6, 1.0), make_sample(1, 7, 1.0)],
        [
            make_sample(2, 8, 1.0),
            make_sample(2, 9, infra="no_sandbox"),
            make_sample(2, 10, infra="no_sandbox"),
            make_sample(2, 11, infra="aborted"),
        ],
    ]
    kept = [group for group in groups if _filter(args, group).keep]
    assert [group[0].group_index for group in kept] == [0]
    trained = [sample for group in kept for sample in group]  # Miles flattens before logging

    log_rollout_data(7, args, trained, {"rollout/dynamic_filter/drop_zero_std_valid": 1}, 12.5)

    records = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    step = next(r for r in records if r["kind"] == "step")
    metrics = step["metrics"]
    assert step["rollout_id"] == 7
    assert metrics["reward/kept_mean"] == pytest.approx(1 / 3)
    assert metrics["reward/unfiltered_mean"] == pytest.approx(6 / 8)  # 8 valid rewards of 12 attempts
    assert metrics["reward/valid_fraction"] == pytest.approx(8 / 12)
    assert metrics["infra/failure_rate"] == pytest.approx(4 / 12)
    assert metrics["infra/no_sandbox_rate"] == pytest.approx(2 / 12)
    assert metrics["count/dropped_groups/zero_std_valid"] == 1
    assert metrics["count/dropped_groups/insufficient_valid_rewards"] == 1
    assert metrics["count/masked"] == 1
    dropped = [r for r in records if r["kind"] == "attempt" and r["filter"] == "dropped"]
    assert len(dropped) == 8
