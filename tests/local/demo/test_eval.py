"""`rl360 demo --eval-interval N`: held-out tasks, when eval runs, and each eval point's datasets."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl360_ext.local.demo.plan import (
    HELD_OUT_GREEDY,
    HELD_OUT_SAMPLED,
    TRAIN_GREEDY,
    TRAIN_SAMPLED,
    DemoConfig,
    eval_notes,
    plan_eval,
    plan_step,
    should_evaluate,
    split_eval_tasks,
)

TASKS = [f"quiz-{n:02d}" for n in range(1, 13)]


def config(**kw: object) -> DemoConfig:
    return DemoConfig(out=Path("unused"), **kw)  # type: ignore[arg-type]


def test_without_eval_every_task_trains_and_nothing_is_evaluated() -> None:
    plain = config(steps=5)
    assert split_eval_tasks(plain, TASKS) == (TASKS, [])
    assert not any(should_evaluate(step, plain) for step in range(5))


def test_held_out_tasks_never_appear_in_a_training_step() -> None:
    evaluated = config(steps=30, tasks=8, eval_interval=3, eval_held_out=3)
    train, held_out = split_eval_tasks(evaluated, TASKS)
    assert len(held_out) == 3 and sorted(train + held_out) == TASKS
    assert split_eval_tasks(evaluated, TASKS) == (train, held_out)  # a function of the seed
    planned = {a.task for step in range(30) for group in plan_step(step, evaluated, train) for a in group}
    assert planned == set(train)
    with pytest.raises(ValueError, match="--eval-held-out 12 leaves no training task"):
        split_eval_tasks(config(eval_interval=1, eval_held_out=12), TASKS)


def test_eval_runs_when_miles_would() -> None:
    """Miles' should_run_periodic_action: after every N-th train step, and after the last."""
    evaluated = config(steps=7, eval_interval=3)
    assert [s for s in range(7) if should_evaluate(s, evaluated)] == [2, 5, 6]
    assert [s for s in range(3) if should_evaluate(s, config(steps=3, eval_interval=1))] == [0, 1, 2]


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_a_bad_eval_interval_names_the_option(bad: object) -> None:
    with pytest.raises(ValueError, match="--eval-interval"):
        config(eval_interval=bad)


def test_each_eval_point_holds_greedy_and_sampled_datasets_numbered_like_miles() -> None:
    evaluated = config(attempts=3, temperature=0.7, eval_interval=2, eval_held_out=2)
    train, held_out = split_eval_tasks(evaluated, TASKS)
    datasets = plan_eval(4, evaluated, train, held_out)
    assert set(datasets) == {TRAIN_GREEDY, TRAIN_SAMPLED, HELD_OUT_GREEDY, HELD_OUT_SAMPLED}
    assert [a.task for a in datasets[HELD_OUT_SAMPLED]] == [t for t in held_out for _ in range(3)]
    assert all(a.temperature == 0.0 for a in datasets[TRAIN_GREEDY]) and len(datasets[TRAIN_GREEDY]) == 10
    assert all(a.temperature == 0.7 for a in datasets[TRAIN_SAMPLED]) and len(datasets[TRAIN_SAMPLED]) == 30
    for attempts in datasets.values():
        assert [a.index for a in attempts] == list(range(len(attempts)))
        assert all(a.sampling_seed is None for a in attempts)


def test_seeded_eval_draws_are_the_same_in_every_arm_and_differ_between_points() -> None:
    seeded = config(seeded_sampling=True, eval_interval=1)
    train, held_out = split_eval_tasks(seeded, TASKS)
    first, again = plan_eval(3, seeded, train, held_out), plan_eval(3, seeded, train, held_out)
    assert first == again
    later = plan_eval(4, seeded, train, held_out)
    seeds = [a.sampling_seed for a in first[TRAIN_SAMPLED]]
    assert len(set(seeds)) == len(seeds) and seeds != [a.sampling_seed for a in later[TRAIN_SAMPLED]]


def test_the_notes_say_held_out_answers_cannot_transfer() -> None:
    notes = eval_notes(["quiz-01"], ["quiz-02"])
    assert (
        "arbitrary letter" in notes[HELD_OUT_SAMPLED]
        and "chance" in notes[HELD_OUT_SAMPLED]
        and "quiz-02" in notes[HELD_OUT_GREEDY]
    )
    assert set(eval_notes(["quiz-01"], [])) == {TRAIN_GREEDY, TRAIN_SAMPLED}
