"""Pure parts of `rl360 demo`: settings, task/fault plan, one-step-off schedule, step summary."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.local.demo.plan import ATTEMPT_FAULT_KINDS, CLIENT_DEADLINE, FAULT_TASKS, DemoConfig, plan_step
from rl360_ext.local.demo.summary import attach_push, summarize_step
from rl360_ext.local.demo.versions import (
    INITIAL_WEIGHT_VERSION,
    PUSH,
    START,
    TRAIN,
    WAIT,
    Event,
    expected_weight_version,
    one_step_off_schedule,
    pushed_version,
    version_mismatches,
    versions_per_rollout,
)
from rl360_ext.local.fixtures import quiz_task_names
from rl360_ext.local.fixtures import tasks_root as demo_tasks_root

QUIZ = [f"quiz-{n:02d}" for n in range(1, 13)]


# ---- settings -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "option"),
    [
        ("steps", 0, "--steps"),
        ("tasks", 0, "--tasks"),
        ("attempts", 1, "--attempts"),
        ("engines", 0, "--engines"),
        ("faults", 1.5, "--faults"),
        ("faults", -0.1, "--faults"),
        ("steps", 2.5, "--steps"),
    ],
)
def test_config_rejects_values_naming_the_option(field: str, value: Any, option: str) -> None:
    with pytest.raises(ValueError, match=option):
        DemoConfig(**{field: value})


def test_fault_rate_is_split_between_attempt_faults_and_engine_503s() -> None:
    config = DemoConfig(faults=0.4)
    assert config.attempt_fault_rate == pytest.approx(0.3)
    assert config.engine_error_rate == pytest.approx(0.1)
    assert config.attempt_fault_rate + config.engine_error_rate == pytest.approx(config.faults)


# ---- plan -----------------------------------------------------------------------------------------


def test_plan_numbers_groups_and_attempts_like_miles_and_never_repeats_them() -> None:
    config = DemoConfig(steps=3, tasks=4, attempts=3)
    seen_groups, seen_indices = set(), set()
    for step in range(config.steps):
        groups = plan_step(step, config, QUIZ)
        assert len(groups) == 4 and all(len(g) == 3 for g in groups)
        for group in groups:
            assert len({a.group_index for a in group}) == 1
            assert len({a.task for a in group}) == 1
            assert all(a.step == step for a in group)
            seen_groups.add(group[0].group_index)
            seen_indices.update(a.index for a in group)
        assert len({g[0].task for g in groups}) == 4  # distinct while the pool lasts
    assert len(seen_groups) == 12 and len(seen_indices) == 36


def test_plan_is_deterministic_per_seed_and_step() -> None:
    config = DemoConfig(tasks=6, attempts=4, faults=0.5)
    assert plan_step(1, config, QUIZ) == plan_step(1, config, QUIZ)
    assert plan_step(1, config, QUIZ) != plan_step(2, config, QUIZ)
    other_seed = DemoConfig(tasks=6, attempts=4, faults=0.5, seed=7)
    assert plan_step(1, config, QUIZ) != plan_step(1, other_seed, QUIZ)


def test_plan_repeats_tasks_only_when_asked_for_more_than_the_pool() -> None:
    groups = plan_step(0, DemoConfig(tasks=15, attempts=2), QUIZ)
    names = [g[0].task for g in groups]
    assert set(names) == set(QUIZ) and len(names) == 15


def test_no_faults_without_a_fault_rate() -> None:
    groups = plan_step(0, DemoConfig(tasks=12, attempts=8, faults=0.0), QUIZ)
    assert all(a.fault is None and a.run_task == a.task for g in groups for a in g)


def test_fault_plan_hits_about_three_quarters_of_the_rate_with_every_kind() -> None:
    config = DemoConfig(tasks=12, attempts=50, faults=0.8)
    attempts = [a for step in range(3) for g in plan_step(step, config, QUIZ) for a in g]
    kinds = Counter(a.fault for a in attempts)
    faulted = sum(n for kind, n in kinds.items() if kind is not None)
    assert abs(faulted / len(attempts) - config.attempt_fault_rate) < 0.05
    assert set(kinds) - {None} == set(ATTEMPT_FAULT_KINDS)
    for attempt in attempts:
        if attempt.fault in FAULT_TASKS:
            assert attempt.run_task == FAULT_TASKS[attempt.fault]
        else:  # a client deadline runs the quiz itself, with a spent deadline
            assert attempt.run_task == attempt.task
    assert kinds[CLIENT_DEADLINE] > 0


def test_plan_needs_tasks() -> None:
    with pytest.raises(ValueError, match="quiz task"):
        plan_step(0, DemoConfig(), [])


def test_shipped_demo_tasks_are_complete_harbor_tasks() -> None:
    root = demo_tasks_root()
    names = quiz_task_names(root)
    assert len(names) >= 8
    for name in [*names, *FAULT_TASKS.values()]:
        task = root / name
        for part in ("task.toml", "instruction.md", "environment/Dockerfile", "tests/test.sh"):
            assert (task / part).is_file(), f"{name}: missing {part}"
    for name in names:
        expected = (root / name / "tests" / "expected.txt").read_text().strip()
        assert expected in {"A", "B", "C", "D"}
        assert "A)" in (root / name / "environment" / "app" / "options.txt").read_text()
    assert "exit 1" in (root / FAULT_TASKS["sandbox_start"] / "environment" / "setup.sh").read_text()
    crash = (root / FAULT_TASKS["verifier_crash"] / "tests" / "test.sh").read_text()
    assert "exit 3" in crash and "/logs/verifier/reward" not in crash


# ---- schedule -------------------------------------------------------------------------------------


def test_schedule_for_three_steps_is_miles_train_async_order() -> None:
    assert one_step_off_schedule(3) == [
        Event(PUSH, None),
        Event(START, 0),
        Event(WAIT, 0),
        Event(START, 1),
        Event(TRAIN, 0),
        Event(WAIT, 1),
        Event(PUSH, 0),
        Event(START, 2),
        Event(TRAIN, 1),
        Event(WAIT, 2),
        Event(PUSH, 1),
        Event(TRAIN, 2),
        Event(PUSH, 2),
    ]


@given(st.integers(min_value=1, max_value=40))
@settings(max_examples=40, deadline=None)
def test_schedule_overlaps_training_with_the_next_rollout_and_never_pushes_mid_generation(steps: int) -> None:
    schedule = one_step_off_schedule(steps)
    versions = versions_per_rollout(schedule)  # one version each: no push during a rollout
    assert versions == {step: [expected_weight_version(step)] for step in range(steps)}
    for step in range(steps):
        assert schedule.count(Event(START, step)) == schedule.count(Event(WAIT, step)) == 1
        assert schedule.index(Event(START, step)) < schedule.index(Event(WAIT, step))
        assert schedule.index(Event(WAIT, step)) < schedule.index(Event(TRAIN, step))
        assert schedule.index(Event(TRAIN, step)) < schedule.index(Event(PUSH, step))
        if step + 1 < steps:  # one-step-off: step k trains while step k+1 generates
            assert schedule.index(Event(START, step + 1)) < schedule.index(Event(TRAIN, step))
            assert schedule.index(Event(TRAIN, step)) < schedule.index(Event(WAIT, step + 1))
    assert [e.step for e in schedule if e.action == PUSH] == [None, *range(steps)]


def test_a_rollout_before_any_push_is_refused() -> None:
    with pytest.raises(ValueError, match="before any weights"):
        versions_per_rollout([Event(START, 0)])


def test_versions_pushed_and_expected() -> None:
    assert pushed_version(None) == INITIAL_WEIGHT_VERSION == "0"
    assert [pushed_version(k) for k in range(3)] == ["1", "2", "3"]
    assert [expected_weight_version(k) for k in range(5)] == ["0", "0", "1", "2", "3"]
    with pytest.raises(ValueError):
        expected_weight_version(-1)


# ---- summary --------------------------------------------------------------------------------------


def _sample(group: int, index: int, cls: str, reward: Any, versions: list[str]) -> SimpleNamespace:
    return SimpleNamespace(
        group_index=group,
        index=index,
        reward=reward,
        weight_versions=versions,
        metadata={"attempt_class": cls},
    )


def test_summary_keeps_infra_attempts_out_of_both_means_and_counts_causes() -> None:
    groups = [
        [
            _sample(0, 0, "valid", 1.0, ["1"]),
            _sample(0, 1, "valid", 0.0, ["1"]),
            _sample(0, 2, "infra:no_sandbox", 1.0, []),  # garbage reward on an infra attempt
        ],
        [
            _sample(1, 3, "valid", 1.0, ["1"]),
            _sample(1, 4, "infra:client_deadline", None, []),
            _sample(1, 5, "infra:no_sandbox", 0.0, []),
        ],
        [_sample(2, 6, "valid", 0.0, ["1"]), _sample(2, 7, "valid", 0.0, ["1", "1"])],
    ]
    summary = summarize_step(2, groups, [True, False, False], expected_version="1", rollout_time_s=3.0)
    assert summary.attempts == 8 and summary.valid == 5 and summary.infra == 3
    assert summary.infra_by_cause == {"client_deadline": 1, "no_sandbox": 2}
    assert (summary.groups, summary.kept_groups) == (3, 1)
    assert summary.unfiltered_mean == pytest.approx(2 / 5)
    assert summary.kept_mean == pytest.approx(0.5)
    assert summary.versions_seen == ["1"] and summary.version_problems == []
    attach_push(summary, {"weight_version": "3", "duration_s": 0.2, "complete": True})
    assert (summary.push_version, summary.push_duration_s, summary.push_complete) == ("3", 0.2, True)


def test_summary_without_valid_attempts_has_no_means() -> None:
    groups = [[_sample(0, 0, "infra:aborted", None, []), _sample(0, 1, "infra:aborted", None, [])]]
    summary = summarize_step(0, groups, [False], expected_version="0")
    assert summary.unfiltered_mean is None and summary.kept_mean is None and summary.valid == 0
    with pytest.raises(ValueError, match="decisions"):
        summarize_step(0, groups, [], expected_version="0")


def test_version_mismatches_name_the_attempt_and_versions() -> None:
    samples = [_sample(4, 17, "valid", 1.0, ["2", "3"]), _sample(4, 18, "valid", 0.0, ["3"])]
    (problem,) = version_mismatches(samples, "3")
    assert "attempt 17" in problem and "2" in problem and "expected 3" in problem
    assert version_mismatches(samples, "3") == version_mismatches(samples[:1], "3")
    assert version_mismatches([_sample(0, 0, "infra:aborted", None, [])], "9") == []


def test_defaults_are_the_cli_defaults() -> None:
    config = DemoConfig()
    assert (config.steps, config.tasks, config.attempts, config.faults, config.engines) == (20, 8, 4, 0.0, 2)
    assert config.out == Path("runs/demo")


def test_infra_table_lists_every_cause_per_step() -> None:
    from rich.console import Console

    from rl360_ext.local.demo.console import infra_table

    clean = summarize_step(0, [[_sample(0, 0, "valid", 1.0, ["0"])]], [False], expected_version="0")
    assert infra_table([clean]) is None
    faulty = summarize_step(
        1,
        [[_sample(0, 0, "infra:no_sandbox", None, []), _sample(0, 1, "infra:verifier_crash", None, [])]],
        [False],
        expected_version="0",
    )
    table = infra_table([clean, faulty])
    assert table is not None
    console = Console(width=120, record=True)
    console.print(table)
    text = console.export_text()
    assert "infra:no_sandbox" in text and "infra:verifier_crash" in text
    assert [column.header for column in table.columns] == ["cause", "step 0", "step 1"]
