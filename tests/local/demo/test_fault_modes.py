"""The fault modes the live and offline A/B share (`rl360_ext.local.demo.plan`): uniform, burst and
correlated, each a function of the run's seed and the attempt's identity only, so every arm of a
`rl360 demo --compare` run loses the same attempts whatever order its requests arrive in."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.local.ab.compare import compare_runs
from rl360_ext.local.demo.modes import BURST, BURST_RATE, CORRELATED, FAULT_MODES, UNIFORM
from rl360_ext.local.demo.modes import CLEAN as CLEAN_ARM
from rl360_ext.local.demo.modes import RL360 as RL360_ARM
from rl360_ext.local.demo.modes import UPSTREAM as UPSTREAM_ARM
from rl360_ext.local.demo.plan import (
    SANDBOX_LOST,
    SANDBOX_START,
    DemoConfig,
    answer_written,
    attempt_fault,
    attempt_sampling_seed,
    burst_step,
    correlated_fault,
    correlated_hazard,
    fault_uniforms,
    plan_step,
)
from rl360_ext.local.demo.stack import demo_stack_config
from rl360_ext.reference.engine.faults import FaultConfig, FaultInjector

QUIZ = [f"quiz-{n:02d}" for n in range(1, 13)]
GENERATION = "<|im_start|>assistant\n"
WITH_LETTER = f"x<|im_end|><|im_start|>tool\n<tool_response>A) 1\nB) 2</tool_response><|im_end|>{GENERATION}b"
NO_LETTER = f"x<|im_end|><|im_start|>tool\n<tool_response>A) 1\nB) 2</tool_response><|im_end|>{GENERATION}?"


def test_correlated_faults_grow_with_sandbox_calls() -> None:
    rate = 0.3
    h = correlated_hazard(rate)
    assert 1 - (1 - h) ** 3 == pytest.approx(rate)
    draws = np.random.default_rng(0).random(4000)
    with_letter = np.mean(
        [attempt_fault(CORRELATED, rate, 0, 20, None, [u, 1.0], 3) is not None for u in draws]
    )
    without = np.mean([attempt_fault(CORRELATED, rate, 0, 20, None, [u, 1.0], 2) is not None for u in draws])
    assert without < with_letter
    assert with_letter == pytest.approx(rate, abs=0.03)
    assert attempt_fault(BURST, rate, 3, 20, None, [0.0, 0.0], 3) is None  # not the burst step
    assert attempt_fault(BURST, rate, burst_step(20), 20, None, [0.0, 0.0], 3) == SANDBOX_START
    with pytest.raises(ValueError, match="fault mode must be one of"):
        attempt_fault("sideways", rate, 0, 20, None, [0.0, 0.0], 3)


def test_the_fault_mode_is_validated_and_sets_what_is_planned_and_what_the_engines_refuse() -> None:
    with pytest.raises(ValueError, match="fault_mode must be one of uniform, burst, correlated"):
        DemoConfig(fault_mode="sideways")
    uniform = DemoConfig(faults=0.4)
    assert (uniform.attempt_fault_rate, uniform.engine_error_rate) == pytest.approx((0.3, 0.1))
    for mode in (BURST, CORRELATED):
        config = DemoConfig(faults=0.4, fault_mode=mode, seeded_sampling=True)
        assert config.attempt_fault_rate == config.engine_error_rate == 0.0
        body = demo_stack_config(config).engine_faults
        assert body is not None and body["error_rate"] == 0.0  # no 503s: the mode places every fault


def test_the_burst_plan_faults_only_the_middle_step_and_the_offline_ab_agrees() -> None:
    config = DemoConfig(steps=5, tasks=12, attempts=4, faults=0.3, fault_mode=BURST, seed=3)
    faulted = {}
    for step in range(config.steps):
        plans = [a for g in plan_step(step, config, QUIZ) for a in g]
        faulted[step] = [a for a in plans if a.fault is not None]
        for a in plans:  # the offline A/B's decision for the same attempt
            offline = attempt_fault(BURST, 0.3, step, 5, None, fault_uniforms(3, BURST, a.index), 3)
            assert a.fault == offline
    assert all(not faulted[s] for s in range(config.steps) if s != burst_step(config.steps))
    middle = faulted[burst_step(config.steps)]
    assert {a.fault for a in middle} == {SANDBOX_START} and 0.75 < len(middle) / 48 <= BURST_RATE + 0.1
    same_tasks = DemoConfig(steps=5, tasks=12, attempts=4, faults=0.3, seed=3)
    assert [[a.task for a in g] for g in plan_step(2, config, QUIZ)] == [
        [a.task for a in g] for g in plan_step(2, same_tasks, QUIZ)
    ]  # the mode never changes which quizzes a step asks


@pytest.mark.parametrize(
    ("response", "reward", "written"),
    [
        (WITH_LETTER, 0.0, True),  # a letter in the answer turn, even a wrong one
        (NO_LETTER, 0.0, False),
        ("b", 1.0, True),  # only the look turn kept: a reward of 1 shows a letter was written
        ("b", 0.0, False),  # ... a 0 cannot tell: counted as no write
        ("", None, False),
    ],
)
def test_answer_written_reads_the_answer_turn(response: str, reward: float | None, written: bool) -> None:
    assert answer_written(response, reward) is written


def test_correlated_faults_are_decided_only_in_that_mode_and_follow_the_calls() -> None:
    config = DemoConfig(steps=4, faults=0.5, fault_mode=CORRELATED, seed=2)
    assert correlated_fault(DemoConfig(faults=0.5, seed=2), 0, 1, WITH_LETTER, 1.0) is None  # uniform
    assert correlated_fault(DemoConfig(faults=0.0, fault_mode=CORRELATED), 0, 1, WITH_LETTER, 1.0) is None
    with_letter = [correlated_fault(config, 0, i, WITH_LETTER, 0.0) for i in range(600)]
    without = [correlated_fault(config, 0, i, NO_LETTER, 0.0) for i in range(600)]
    assert set(with_letter) | set(without) == {None, SANDBOX_LOST}
    assert all(w is not None for w, wo in zip(with_letter, without, strict=True) if wo is not None)
    assert sum(f is not None for f in without) < sum(f is not None for f in with_letter)
    assert abs(sum(f is not None for f in with_letter) / 600 - 0.5) < 0.07


def _arm_faults(config: DemoConfig, order: random.Random, responses: dict[int, str]) -> dict[int, str | None]:
    """One arm's fault per attempt, its requests reaching one engine in its own order: the plan's
    fault, else the engines' 503 (two model calls per attempt, interleaved), else the correlated
    mode's decision on the attempt's response."""
    plans = [a for step in range(config.steps) for g in plan_step(step, config, QUIZ) for a in g]
    body = demo_stack_config(config).engine_faults
    injector = FaultInjector(FaultConfig.from_dict(dict(body)) if body else FaultConfig())
    requests = [a for a in plans for _ in range(2)]
    order.shuffle(requests)
    refused = {
        a.index
        for a in requests
        if injector.draw(
            2, attempt_sampling_seed(config.seed, a.index) if config.seeded_sampling else None
        ).unavailable
    }
    faults: dict[int, str | None] = {}
    for a in plans:
        if a.fault is not None:
            faults[a.index] = a.fault
        elif a.index in refused:
            faults[a.index] = "engine_503"
        else:
            faults[a.index] = correlated_fault(config, a.step, a.index, responses[a.index], 0.0)
    return faults


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    mode=st.sampled_from(FAULT_MODES),
    faults=st.floats(0.1, 1.0),
    orders=st.lists(st.randoms(use_true_random=False), min_size=2, max_size=2),
    letters=st.lists(st.booleans(), min_size=48, max_size=48),
)
def test_every_arm_loses_the_same_attempts_whatever_the_arrival_order(
    seed: int, mode: str, faults: float, orders: list[random.Random], letters: list[bool]
) -> None:
    base = DemoConfig(steps=3, tasks=4, attempts=4, faults=faults, seed=seed, out=Path("ab"))
    runs = {r.arm: r.config for r in compare_runs(base, [RL360_ARM, UPSTREAM_ARM, CLEAN_ARM], [mode], 1)}
    responses = {i: WITH_LETTER if letter else NO_LETTER for i, letter in enumerate(letters)}
    ours = _arm_faults(runs[RL360_ARM], orders[0], responses)
    theirs = _arm_faults(runs[UPSTREAM_ARM], orders[1], responses)
    assert ours == theirs
    assert set(_arm_faults(runs[CLEAN_ARM], orders[1], responses).values()) == {None}
    if mode == UNIFORM and faults >= 0.5:
        assert any(f is not None for f in ours.values())
