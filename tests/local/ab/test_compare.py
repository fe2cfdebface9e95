"""The fault A/B's plumbing: which arms a `--compare` value runs, every arm on the same plan and
sampling seeds, each arm's rules reaching the reward hook and the trainer, and the advantage shift
the report draws (hypothesis over batches with infra samples and partial groups)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.local.ab.compare import compare_runs, parse_compare, report_folders
from rl360_ext.local.demo.arms import (
    ADVANTAGE_REFERENCE_MEAN,
    ADVANTAGE_SHIFT,
    ADVANTAGE_VALID_MEAN,
    ADVANTAGE_VALID_SAMPLES,
    RL360_RULES,
    UPSTREAM_RULES,
    advantage_metrics,
    arm_rules,
    upstream_advantages,
)
from rl360_ext.local.demo.miles_args import build_args
from rl360_ext.local.demo.modes import CLEAN as CLEAN_ARM
from rl360_ext.local.demo.modes import CRASH_MODES, FAULT_MODES
from rl360_ext.local.demo.modes import RL360 as RL360_ARM
from rl360_ext.local.demo.modes import UPSTREAM as UPSTREAM_ARM
from rl360_ext.local.demo.plan import SAMPLING_SEED_LIMIT, DemoConfig, attempt_sampling_seed, plan_step
from rl360_ext.reference.trainer.trainer import Trainer, TrainerConfig
from rl360_ext.rollout.rewards import valid_group_advantages
from rl360_ext.util.dotted import load_function
from tests.reference.trainer.helpers import SMALL, small_weights
from tests.rollout.duck_samples import DuckSample, infra, valid

QUIZ = [f"quiz-{n:02d}" for n in range(1, 13)]


# ---- --compare --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "arms"),
    [
        ("upstream", [RL360_ARM, UPSTREAM_ARM]),
        ("upstream,clean", [RL360_ARM, UPSTREAM_ARM, CLEAN_ARM]),
        (" clean , upstream ", [RL360_ARM, CLEAN_ARM, UPSTREAM_ARM]),
    ],
)
def test_compare_runs_rl360_first_then_the_named_arms(value: str, arms: list[str]) -> None:
    assert parse_compare(value) == arms


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "comma-separated list"),
        ("rl360", "comma-separated list"),
        ("upstream,bogus", "comma-separated list"),
        ("upstream,upstream", "twice"),
        ("clean", "needs the 'upstream' arm"),
    ],
)
def test_a_bad_compare_value_names_the_option(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        parse_compare(value)
    assert "--compare" in str(err.value)


def test_an_unknown_rule_set_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="rules must be one of rl360, upstream"):
        DemoConfig(rules="miles")
    with pytest.raises(ValueError, match="seeded_sampling must be true or false"):
        DemoConfig(seeded_sampling=1)  # type: ignore[arg-type]


# ---- every arm on the same plan -----------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    st.integers(0, 1000),
    st.integers(1, 4),
    st.integers(1, 12),
    st.integers(2, 5),
    st.floats(0.05, 1.0),
    st.integers(1, 3),
    st.lists(st.sampled_from(FAULT_MODES), min_size=1, max_size=3, unique=True),
)
def test_every_arm_runs_the_same_seeds_tasks_faults_and_sampling_seeds(
    seed: int, steps: int, tasks: int, attempts: int, faults: float, seeds: int, modes: list[str]
) -> None:
    base = DemoConfig(steps=steps, tasks=tasks, attempts=attempts, faults=faults, seed=seed, out=Path("ab"))
    runs = compare_runs(base, [RL360_ARM, UPSTREAM_ARM, CLEAN_ARM], modes, seeds)
    plain = [m for m in modes if m not in CRASH_MODES]
    # clean: once per seed without the crash tool, once in each mode with it
    assert len(runs) == seeds * (2 * len(modes) + bool(plain) + len(modes) - len(plain))
    assert len({r.config.out for r in runs}) == len(runs)
    assert all(r.config.out.is_relative_to(base.out) and r.config.seeded_sampling for r in runs)
    by_key = {(r.mode, r.arm, r.seed): r.config for r in runs}
    for run_seed in range(seed, seed + seeds):
        for mode in modes:
            clean = by_key[(mode if mode in CRASH_MODES else plain[0], CLEAN_ARM, run_seed)]
            assert (clean.rules, clean.faults, clean.seed) == (RL360_RULES, 0.0, run_seed)
            assert clean.crash_tool == (mode in CRASH_MODES)
            ours, theirs = by_key[(mode, RL360_ARM, run_seed)], by_key[(mode, UPSTREAM_ARM, run_seed)]
            assert (ours.rules, theirs.rules) == (RL360_RULES, UPSTREAM_RULES)
            assert ours.fault_mode == theirs.fault_mode == mode and ours.faults == theirs.faults == faults
            # everything else is the user's
            assert replace(ours, out=base.out, rules=base.rules, seed=base.seed, fault_mode=base.fault_mode,
                           seeded_sampling=False) == base  # fmt: skip
            for step in range(steps):
                plan = plan_step(step, ours, QUIZ)
                assert plan_step(step, theirs, QUIZ) == plan
                clean_plan = plan_step(step, clean, QUIZ)
                assert [[(a.task, a.index) for a in g] for g in clean_plan] == [
                    [(a.task, a.index) for a in g] for g in plan
                ]
                assert all(a.fault is None for g in clean_plan for a in g)
    folders = report_folders(runs, modes)
    assert {(f.mode, f.arm) for f in folders} == {
        (m, a) for m in modes for a in (RL360_ARM, UPSTREAM_ARM, CLEAN_ARM)
    }
    assert len(folders) == seeds * 3 * len(modes)


@pytest.mark.parametrize("seeds", [0, -1, True])
def test_compare_runs_refuses_a_bad_seed_count_naming_the_option(seeds: int) -> None:
    with pytest.raises(ValueError, match="--seeds must be an integer >= 1"):
        compare_runs(DemoConfig(out=Path("ab")), [RL360_ARM, UPSTREAM_ARM], ["uniform"], seeds)


def test_sampling_seeds_are_distinct_per_attempt_and_in_range() -> None:
    seeds = [attempt_sampling_seed(0, index) for index in range(2_000)]
    assert len(set(seeds)) == len(seeds)
    assert all(0 <= s < SAMPLING_SEED_LIMIT for s in seeds)
    assert attempt_sampling_seed(1, 5) != attempt_sampling_seed(0, 5)
    assert attempt_sampling_seed(3, 7) == attempt_sampling_seed(3, 7)


# ---- each arm's rules reach the hooks -------------------------------------------------------------------


def _stack() -> SimpleNamespace:
    return SimpleNamespace(
        harbor_urls="http://127.0.0.1:1", gateway_url="http://127.0.0.1:2", tokenizer_dir="tok"
    )


@pytest.mark.parametrize(
    ("rules", "hook"), [(RL360_RULES, valid_group_advantages), (UPSTREAM_RULES, upstream_advantages)]
)
def test_the_arms_reward_post_process_path_is_the_arms_hook(rules: str, hook: Any) -> None:
    args = build_args(DemoConfig(rules=rules, out=Path("ab")), _stack())  # type: ignore[arg-type]
    assert load_function(args.custom_reward_post_process_path) is hook


def _trained(group: int, index: int, reward: float | None) -> DuckSample:
    sample = valid(group, index, reward) if reward is not None else infra(group, index)
    sample.rollout_log_probs = [-1.0, -1.0]
    return sample


def test_the_upstream_trainer_scales_gradients_by_the_valid_share_and_rl360s_does_not() -> None:
    samples = [_trained(0, 0, 1.0), _trained(0, 1, 0.0), _trained(0, 2, None), _trained(1, 3, 1.0)]
    scales = {}
    for rules in (RL360_RULES, UPSTREAM_RULES):
        config = TrainerConfig(r3=False, **arm_rules(rules).trainer)
        metrics = Trainer(SMALL, small_weights(5), config).train_step(samples, [0.5, -0.5, 0.0, 0.0])
        scales[rules] = metrics["train/loss_scale"]
    assert scales[RL360_RULES] == pytest.approx(1.0, abs=1e-12)
    assert scales[UPSTREAM_RULES] == pytest.approx(3 / 4, abs=1e-12)


# ---- the advantage shift ----------------------------------------------------------------------------------


def _args(std: bool) -> SimpleNamespace:
    return SimpleNamespace(
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=std,
        reward_key=None,
        n_samples_per_prompt=4,
        rollout_batch_size=4,
    )


@st.composite
def batches(draw: st.DrawFn) -> list[Any]:
    samples: list[Any] = []
    for group in range(draw(st.integers(1, 4))):
        for _ in range(draw(st.integers(1, 4))):  # partial groups
            index = len(samples)
            if draw(st.integers(0, 3)) == 0:
                samples.append(infra(group, index))
            else:
                samples.append(valid(group, index, float(draw(st.integers(0, 1)))))
    return samples


@settings(max_examples=200, deadline=None)
@given(batches(), st.booleans())
def test_rl360s_arm_has_no_shift_and_upstreams_is_its_baseline_gap(samples: list[Any], std: bool) -> None:
    args = _args(std)
    valid_positions = [p for p, s in enumerate(samples) if not s.remove_sample]
    ours = advantage_metrics(args, samples, valid_group_advantages(args, samples)[1])
    theirs = advantage_metrics(args, samples, upstream_advantages(args, samples)[1])
    if not valid_positions:
        assert ours == {} and theirs == {}
        return
    assert ours[ADVANTAGE_SHIFT] == pytest.approx(0.0, abs=1e-12)
    assert ours[ADVANTAGE_REFERENCE_MEAN] == pytest.approx(0.0, abs=1e-12)
    assert theirs[ADVANTAGE_VALID_SAMPLES] == len(valid_positions)
    assert theirs[ADVANTAGE_SHIFT] == pytest.approx(
        theirs[ADVANTAGE_VALID_MEAN] - theirs[ADVANTAGE_REFERENCE_MEAN], abs=1e-12
    )
    groups: dict[int, list[Any]] = {}
    for sample in samples:
        groups.setdefault(sample.group_index, []).append(sample)
    if not std:  # upstream: r - mean(rewards, failures as 0); rl360: r - mean(valid), 0 below two valid
        gaps = []
        for members in groups.values():
            rewards = [0.0 if s.remove_sample else s.reward for s in members]
            good = [s.reward for s in members if not s.remove_sample]
            for sample in members:
                if sample.remove_sample:
                    continue
                upstream = sample.reward - sum(rewards) / len(rewards)
                ours_value = sample.reward - sum(good) / len(good) if len(good) >= 2 else 0.0
                gaps.append(upstream - ours_value)
        assert theirs[ADVANTAGE_SHIFT] == pytest.approx(sum(gaps) / len(gaps), abs=1e-12)
    if not any(s.remove_sample for s in samples) and all(
        sum(not s.remove_sample for s in m) >= 2 for m in groups.values()
    ):
        assert theirs[ADVANTAGE_SHIFT] == pytest.approx(0.0, abs=1e-9)


def test_a_failure_shifts_upstreams_advantages_up() -> None:
    samples = [valid(0, 0, 1.0), valid(0, 1, 0.0), infra(0, 2), infra(0, 3)]
    shift = advantage_metrics(_args(False), samples, upstream_advantages(_args(False), samples)[1])
    assert shift[ADVANTAGE_SHIFT] == pytest.approx(0.25)  # baseline 0.25 (failures as 0) vs 0.5 (valid)


def test_advantage_metrics_refuses_a_length_mismatch() -> None:
    with pytest.raises(ValueError, match="2 samples but 1 advantages"):
        advantage_metrics(_args(False), [valid(0, 0, 1.0), valid(0, 1, 0.0)], [0.5])


def test_the_cli_refuses_a_bad_compare_value_before_starting_anything(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rl360_ext.cli import app

    result = CliRunner().invoke(app, ["demo", "--out", str(tmp_path / "ab"), "--compare", "upstream,miles"])
    assert result.exit_code == 2
    assert "--compare" in result.output and "upstream, rl360-list, clean" in result.output
    assert not (tmp_path / "ab").exists()


@pytest.mark.parametrize(
    ("flags", "option", "message"),
    [
        (["--compare", "upstream", "--seeds", "0"], "--seeds", "must be an integer >= 1"),
        (["--seeds", "2"], "--seeds", "needs --compare upstream"),
        (["--compare", "upstream", "--fault-modes", "uniform,sideways"], "--fault-modes", "comma-separated"),
        (["--fault-modes", "burst"], "--fault-modes", "needs --compare upstream"),
    ],
)
def test_the_cli_refuses_bad_seeds_and_fault_modes_naming_the_option(
    tmp_path: Path, flags: list[str], option: str, message: str
) -> None:
    from typer.testing import CliRunner

    from rl360_ext.cli import app

    result = CliRunner().invoke(app, ["demo", "--out", str(tmp_path / "ab"), *flags], env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert option in result.output and message in " ".join(result.output.split())
    assert not (tmp_path / "ab").exists()
