"""The fault A/B offline (`rl360 ab`): arms are paired (same tasks, faults and draws), an infra
attempt never enters rl360's baseline, and the interval math and the summary sentence are right.

The problem here is the demo's quizzes and tokenizer around a small random model (no warm start:
the tests check plumbing and rules, not learning)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from rl360_ext.local.ab.config import OfflineConfig
from rl360_ext.local.ab.offline import merge_runs
from rl360_ext.local.ab.problem import (
    OFFLINE_ARMS,
    Problem,
    Sampler,
    make_sample,
    miles_args,
    run_attempt,
)
from rl360_ext.local.ab.runs import (
    RunResult,
    StepRecord,
    jobs_for,
    rollout_step,
    run_figures,
    run_one,
    with_clean_everywhere,
)
from rl360_ext.local.ab.stats import METRICS
from rl360_ext.local.demo.modes import (
    BURST,
    CLEAN,
    CRASH_MODES,
    DENOMINATOR,
    EXPLOITABLE,
    FAULT_MODES,
    RL360,
    UNIFORM,
    UPSTREAM,
    ZERO_SCORED,
)
from rl360_ext.local.demo.plan import SANDBOX_START
from rl360_ext.outcomes.provenance import is_valid
from rl360_ext.rollout.rewards import valid_group_advantages
from rl360_ext.util.dotted import load_function

SMALL = {"steps": 3, "tasks": 2, "attempts": 3, "seeds": 1}


def _tokens(groups: list[list[object]]) -> list[list[int]]:
    return [list(s.tokens) for g in groups for s in g]  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode", FAULT_MODES)
def test_arms_share_tasks_faults_and_tokens_on_the_same_weights(problem: Problem, mode: str) -> None:
    config = OfflineConfig(**SMALL, faults=0.5)
    sampler = Sampler(problem, problem.weights, config.temperature)
    step = config.steps // 2 if mode == BURST else 0
    seen = {
        arm: rollout_step(problem, config, sampler, mode, arm, 4, step, 0)
        for arm in (RL360, UPSTREAM, ZERO_SCORED, CLEAN)
    }
    rl360_groups, rl360_faulted, _, rl360_tasks = seen[RL360]
    assert rl360_faulted, "the seed and rate are chosen so that some attempt faults"
    for arm, (groups, faulted, _, tasks) in seen.items():
        assert tasks == rl360_tasks
        assert _tokens(groups) == _tokens(rl360_groups)  # same draws, same weights: same tokens
        assert faulted == ([] if arm == CLEAN else rl360_faulted)
    assert all(is_valid(s) for g in seen[CLEAN][0] for s in g)


def test_whole_runs_are_paired_and_deterministic(problem: Problem) -> None:
    config = OfflineConfig(**SMALL, faults=0.4)
    rl360 = run_one(problem, config, UNIFORM, RL360, 1)
    upstream = run_one(problem, config, UNIFORM, UPSTREAM, 1)
    assert rl360.tasks == upstream.tasks
    assert rl360.faulted == upstream.faulted  # uniform faults come from the plan: never from the weights
    # steps 0 and 1 sample on the first weights in every arm (one-step-off): same rewards
    assert [s.unfiltered_mean for s in rl360.steps[:2]] == [s.unfiltered_mean for s in upstream.steps[:2]]
    again = run_one(problem, config, UNIFORM, RL360, 1)
    assert [s.unfiltered_mean for s in again.steps] == [s.unfiltered_mean for s in rl360.steps]
    assert again.eval_pass == rl360.eval_pass
    assert all(s.advantage_shift in (None, pytest.approx(0.0, abs=1e-12)) for s in rl360.steps)
    assert all(s.loss_scale in (None, pytest.approx(1.0)) for s in rl360.steps)


def test_an_infra_attempt_never_enters_the_rl360_baseline(problem: Problem) -> None:
    sampler = Sampler(problem, problem.weights, 1.0)
    task = problem.task_names[0]
    attempts = [run_attempt(problem, sampler, task, [0.5, u, 0.5], 2) for u in (0.1, 0.4, 0.7, 0.95)]
    rewards = [1.0, 0.0, 0.0, 1.0]  # set by hand: the rule, not the tiny model's luck, is tested
    for attempt, reward in zip(attempts, rewards, strict=True):
        attempt.reward = reward
    faults = [None, None, None, SANDBOX_START]
    samples = [make_sample(a, 0, i, 0, f) for i, (a, f) in enumerate(zip(attempts, faults, strict=True))]
    infra = samples[3]
    assert not is_valid(infra) and infra.reward is None and set(infra.loss_mask) == {0}
    args = miles_args(OfflineConfig(**SMALL))
    raw, advantages = valid_group_advantages(args, samples)
    _, without = valid_group_advantages(args, samples[:3])
    assert advantages[:3] == pytest.approx(without)  # the infra attempt's 1.0 never counted
    assert advantages[3] == 0.0 and math.isnan(raw[3])
    upstream = load_function(OFFLINE_ARMS[UPSTREAM].reward_post_process_path)
    up_raw, _ = upstream(args, samples)
    assert up_raw[3] == 0.0  # upstream scores the failure 0 instead


def test_figures_censor_a_run_that_never_reaches_the_goal() -> None:
    steps = [
        StepRecord(i, 4, 4, 0, 1, m, 1.0, 0.0, 1.0) for i, m in enumerate([0.2, 0.5, 0.7, 0.6, None, 0.75])
    ]
    run = RunResult(UNIFORM, RL360, 0, steps, 0.5, [], [], 1.0)
    figures = run_figures(run, 6, 0.8)
    assert figures["steps_to_goal"] == 6 and figures["censored"] == 1
    assert figures["auc"] == pytest.approx(np.mean([0.2, 0.5, 0.7, 0.6, 0.75]))
    assert figures["final_mean"] == pytest.approx(0.75)  # the last third: steps 4 (no valid attempt) and 5
    reached = run_figures(run, 6, 0.7)
    assert reached["steps_to_goal"] == 2 and reached["censored"] == 0


def test_jobs_run_clean_once_per_seed_and_ablations_only_where_asked() -> None:
    config = OfflineConfig(seeds=2, arms="rl360,upstream,clean,denominator", ablation_modes="uniform")
    jobs = jobs_for(config)
    # once per seed without the crash tool, once in each mode with it
    assert [j for j in jobs if j[1] == CLEAN] == [
        (UNIFORM, CLEAN, 0), (EXPLOITABLE, CLEAN, 0), (UNIFORM, CLEAN, 1), (EXPLOITABLE, CLEAN, 1)
    ]  # fmt: skip
    assert {j[0] for j in jobs if j[1] == DENOMINATOR} == {UNIFORM}
    assert len([j for j in jobs if j[1] == RL360]) == 2 * len(FAULT_MODES)
    assert [j[2] for j in jobs] == sorted(j[2] for j in jobs)  # seed by seed
    run = RunResult(UNIFORM, CLEAN, 0, [], 0.0, [], [], 0.0)
    copies = with_clean_everywhere([run], FAULT_MODES)
    assert sorted(r.mode for r in copies) == sorted(m for m in FAULT_MODES if m not in CRASH_MODES)


def test_config_names_the_bad_flag() -> None:
    with pytest.raises(ValueError, match="--fault-mode"):
        OfflineConfig(fault_mode="uniform,sideways")
    with pytest.raises(ValueError, match="--arms"):
        OfflineConfig(arms="rl360,rl360")
    with pytest.raises(ValueError, match="--seeds"):
        OfflineConfig(seeds=0)


def test_cli_refuses_a_bad_mode_before_running() -> None:
    from rl360_ext.cli import app

    result = CliRunner().invoke(app, ["ab", "--fault-mode", "sideways"])
    assert result.exit_code == 2
    assert "--fault-mode" in result.output


def test_merge_runs_summarizes_seed_ranges_and_repeats_clean(tmp_path: Path) -> None:
    def record(mode: str, arm: str, seed: int, final: float) -> dict[str, object]:
        figures = dict.fromkeys(METRICS, 0.5) | {"final_mean": final, "censored": 0.0}
        return {"mode": mode, "arm": arm, "seed": seed, "figures": figures}

    first = [
        record("uniform", "rl360", 0, 0.4),
        record("uniform", "upstream", 0, 0.6),
        record("uniform", "clean", 0, 0.9),
    ]
    second = [
        record("uniform", "rl360", 1, 0.5),
        record("uniform", "upstream", 1, 0.8),
        record("uniform", "clean", 1, 0.9),
    ]
    paths = []
    for name, records in (("a", first), ("b", second)):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        paths.append(path)
    document = merge_runs(OfflineConfig(fault_mode="uniform,burst"), paths)
    table = document["table"]
    assert table["uniform"]["upstream"]["seeds"] == 2
    assert table["uniform"]["upstream"]["final_mean_minus_rl360"]["mean"] == pytest.approx(0.25)
    assert table["burst"]["clean"]["final_mean"]["mean"] == pytest.approx(0.9)  # clean repeated
    assert any(line.startswith("uniform, upstream vs rl360") for line in document["summary"])


def test_advantage_agreement_is_zero_for_clean_and_counts_the_same_attempts(problem: Problem) -> None:
    from rl360_ext.local.ab.gradient import advantage_agreement

    config = OfflineConfig(**SMALL, faults=0.4, gradient_draws=2)
    out = advantage_agreement(problem, config, UNIFORM, [CLEAN, RL360, UPSTREAM], draws=2)
    assert out[CLEAN]["rmse"] == 0.0 or math.isnan(out[CLEAN]["rmse"])  # clean against itself
    assert out[RL360]["attempts"] <= out[CLEAN]["attempts"]  # an arm keeps at most the valid attempts
    assert all(out[arm]["rmse"] >= 0 or math.isnan(out[arm]["rmse"]) for arm in out)
