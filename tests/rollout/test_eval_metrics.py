"""The eval log hook: pass rate over valid attempts, infra rate beside it, pass@k, upstream's number."""

from __future__ import annotations

import itertools
import json
import math
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl360_ext.outcomes.infra import mark_infra_sample
from rl360_ext.outcomes.provenance import ATTEMPT_CLASS, REWARD_SOURCE, VALID
from rl360_ext.rollout.eval_metrics import dataset_metrics, log_eval_metrics, unbiased_pass_at_k
from rl360_ext.rollout.sample import Sample


def brute_force_pass_at_k(outcomes: list[bool], k: int) -> float:
    """The fraction of all k-subsets of the attempts that contain a pass."""
    subsets = list(itertools.combinations(outcomes, k))
    return sum(1 for s in subsets if any(s)) / len(subsets)


@given(st.data())
def test_the_estimator_equals_the_fraction_of_k_subsets_with_a_pass(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 10))
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    outcomes = [True] * c + [False] * (n - c)
    assert unbiased_pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(outcomes, k), abs=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(3, 1, 4), (3, 4, 1), (3, -1, 1), (0, 0, 1), (3, 1, 0)])
def test_the_estimator_refuses_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="pass@k needs"):
        unbiased_pass_at_k(n, c, k)


def valid(task: str, reward: float, index: int = 0) -> Sample:
    return Sample(
        index=index,
        prompt=f"solve {task}",
        tokens=[1, 2, 3],
        response_length=1,
        reward=reward,
        metadata={"task": task, ATTEMPT_CLASS: VALID, REWARD_SOURCE: "verifier"},
    )


def infra(task: str, cause: str = "no_sandbox", index: int = 0) -> Sample:
    sample = Sample(index=index, prompt=f"solve {task}", tokens=[1, 2], metadata={"task": task})
    return mark_infra_sample(sample, cause)


def miles_entry(samples: list[Sample], reward_key: str | None = None) -> dict[str, Any]:
    """`data[name]` as Miles' eval rollout builds it (inference_rollout_eval.py:126-132)."""
    return {
        "rewards": [s.reward if not reward_key else s.reward[reward_key] for s in samples],
        "truncated": [s.status == Sample.Status.TRUNCATED for s in samples],
        "samples": samples,
    }


def test_infra_attempts_leave_the_pass_rate_and_count_in_the_infra_rate() -> None:
    samples = [
        valid("a", 1.0),
        valid("a", 0.0),
        infra("a"),
        infra("a", "sandbox_lost"),
        valid("b", 1.0),
        valid("b", 1.0),
        infra("b"),
        infra("b"),
    ]
    metrics = dataset_metrics("quiz", miles_entry(samples), reward_key=None, task_key="task")
    assert metrics["eval/quiz/pass_rate"] == 3 / 4  # 3 passes of 4 valid attempts
    assert metrics["eval/quiz/infra_rate"] == 4 / 8
    assert metrics["eval/quiz/upstream"] == 3 / 8  # upstream scores the 4 outages as 0
    assert metrics["eval/quiz/upstream_none_reward_ratio"] == 4 / 8
    assert (metrics["eval/quiz/infra/no_sandbox"], metrics["eval/quiz/infra/sandbox_lost"]) == (3, 1)
    assert metrics["eval/quiz/pass@1"] == pytest.approx((1 / 2 + 1) / 2)
    assert metrics["eval/quiz/pass@2"] == pytest.approx((1.0 + 1.0) / 2)  # a: 1 - C(1,2)/C(2,2) = 1
    assert metrics["eval/quiz/pass@2_tasks"] == 2 and "eval/quiz/pass@4" not in metrics


def test_pass_at_k_uses_only_tasks_with_k_valid_attempts() -> None:
    samples = [valid("a", 0.0), valid("a", 0.0), valid("a", 1.0), valid("a", 0.0), valid("b", 1.0)]
    metrics = dataset_metrics("d", miles_entry(samples), reward_key=None, task_key="task")
    assert metrics["eval/d/pass@1_tasks"] == 2 and metrics["eval/d/pass@1"] == pytest.approx((1 / 4 + 1) / 2)
    assert metrics["eval/d/pass@2_tasks"] == 1 and metrics["eval/d/pass@2"] == pytest.approx(1 - 3 / 6)
    assert metrics["eval/d/pass@4"] == pytest.approx(1.0) and metrics["eval/d/pass@4_tasks"] == 1


def test_an_outage_moves_the_infra_rate_not_the_pass_rate() -> None:
    healthy = [valid(t, float(i % 2), i) for i, t in enumerate("aabbccdd")]
    outage = [s if i % 4 else infra(s.metadata["task"], index=i) for i, s in enumerate(healthy)]
    clean = dataset_metrics("d", miles_entry(healthy), reward_key=None, task_key="task")
    hit = dataset_metrics("d", miles_entry(outage), reward_key=None, task_key="task")
    assert clean["eval/d/pass_rate"] == 0.5 and hit["eval/d/pass_rate"] == pytest.approx(4 / 6)
    assert (clean["eval/d/infra_rate"], hit["eval/d/infra_rate"]) == (0.0, 2 / 8)
    assert hit["eval/d/upstream"] == 4 / 8  # the outage hid no passes here: upstream equals clean
    assert all(o.reward is None for o in outage[::4])


def test_a_reward_key_reads_the_dict_rewards_and_infra_rewards_keyed_none() -> None:
    good = valid("a", 1.0)
    good.reward = {"reward": 1.0, "tests_passed": 3.0}
    failed = infra("a")
    failed.reward = {"reward": None}  # the generate hook's eval infra sample under a reward key
    metrics = dataset_metrics(
        "d", miles_entry([good, failed], "reward"), reward_key="reward", task_key="task"
    )
    assert (metrics["eval/d/pass_rate"], metrics["eval/d/infra_rate"], metrics["eval/d/upstream"]) == (
        1.0,
        0.5,
        0.5,
    )


def test_no_valid_attempt_gives_no_pass_rate_and_no_samples_is_an_error() -> None:
    metrics = dataset_metrics("d", miles_entry([infra("a"), infra("b")]), reward_key=None, task_key="task")
    assert metrics["eval/d/pass_rate"] is None and metrics["eval/d/infra_rate"] == 1.0
    assert not any("pass@" in key for key in metrics)
    with pytest.raises(ValueError, match=r"eval dataset 'd'.*samples"):
        dataset_metrics("d", {"rewards": [1.0]}, reward_key=None, task_key="task")


def test_tasks_without_the_task_key_are_told_apart_by_prompt() -> None:
    samples = [valid("a", 1.0), valid("b", 0.0)]
    for sample in samples:
        del sample.metadata["task"]
    metrics = dataset_metrics("d", miles_entry(samples), reward_key=None, task_key="task")
    assert metrics["eval/d/tasks"] == 2


def test_the_hook_replaces_miles_logging_and_writes_one_jsonl_line_per_dataset(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    args = Namespace(rl360_metrics_path=str(path), rl360_metrics_attempts=None, reward_key=None)
    data = {"quiz": miles_entry([valid("a", 1.0), infra("a")]), "held_out": miles_entry([valid("b", 0.0)])}
    assert log_eval_metrics(3, args, data, None) is True
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["kind"], r["rollout_id"], r["dataset"]) for r in lines] == [
        ("eval", 3, "quiz"),
        ("eval", 3, "held_out"),
    ]
    assert lines[0]["metrics"]["pass_rate"] == 1.0 and lines[0]["metrics"]["infra_rate"] == 0.5
    assert lines[1]["metrics"]["pass_rate"] == 0.0 and not math.isnan(lines[1]["metrics"]["upstream"])
