"""The offline A/B's runs: one (mode, arm, seed) run of the demo's schedule over the in-process
problem (`run_one`: plan, sample, filter, reward post-process, train, per step), many of them in
worker processes (`run_all`), and each run's record and figures.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

import numpy as np

from rl360_ext.local.ab.config import OfflineConfig
from rl360_ext.local.ab.problem import (
    OFFLINE_ARMS,
    Problem,
    Sampler,
    make_sample,
    miles_args,
    run_attempt,
    sampling_uniforms,
)
from rl360_ext.local.ab.stats import (
    curve_figures,
)
from rl360_ext.local.demo.arms import (
    ADVANTAGE_SHIFT,
    advantage_metrics,
)
from rl360_ext.local.demo.modes import (
    ABLATION_ARMS,
    CLEAN,
    CRASH_MODES,
    ONE_STEP_OFF,
    PLANNED_FAULT_MODES,
    RL360_LIST,
)
from rl360_ext.local.demo.plan import DemoConfig, attempt_fault, fault_uniforms, plan_step
from rl360_ext.local.demo.versions import expected_weight_version
from rl360_ext.outcomes.provenance import is_valid
from rl360_ext.reference.engine.threads import single_blas_thread
from rl360_ext.reference.trainer.trainer import Trainer
from rl360_ext.rollout.filters import check_valid_reward_nonzero_std
from rl360_ext.rollout.metrics import REGISTRY
from rl360_ext.rollout.sample import Sample
from rl360_ext.util.dotted import load_function


def sampling_version(schedule: str, step: int) -> int:
    """The weight version step `step` samples on (one-step-off: the demo's; on-policy: its own)."""
    return int(expected_weight_version(step)) if schedule == ONE_STEP_OFF else step


@dataclass
class StepRecord:
    step: int
    attempts: int
    valid: int
    infra: int
    kept_groups: int
    unfiltered_mean: float | None
    loss_scale: float | None
    advantage_shift: float | None
    grad_norm: float | None
    crashes: int = 0  # attempts whose answer turn took the crash action
    pass_rate: float | None = None  # reward over the attempts no infrastructure fault hit, a crash 0

    @property
    def crash_rate(self) -> float:
        return self.crashes / self.attempts if self.attempts else 0.0


@dataclass
class RunResult:
    """One (mode, arm, seed) run: its steps, eval and the figures the statistics use."""

    mode: str
    arm: str
    seed: int
    steps: list[StepRecord]
    eval_pass: float
    faulted: list[list[int]]  # per step, the Miles indices of the faulted attempts (infrastructure)
    tasks: list[list[str]]  # per step, the groups' quizzes
    seconds: float
    weights: dict[str, np.ndarray] | None = None  # the final weights, when asked for (run_one)

    def figures(self, total_steps: int, goal: float) -> dict[str, float]:
        return run_figures(self, total_steps, goal)


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if values else None


def run_figures(run: RunResult, total_steps: int, goal: float) -> dict[str, float]:
    """The run's figures (`ab.stats.curve_figures`) from its steps and its eval."""
    return curve_figures(
        [(s.step, s.unfiltered_mean) for s in run.steps],
        [s.loss_scale for s in run.steps],
        [s.advantage_shift for s in run.steps],
        run.eval_pass,
        total_steps,
        goal,
        crash_rates=[s.crash_rate for s in run.steps],
        pass_rates=[s.pass_rate for s in run.steps],
    )


def greedy_eval(
    problem: Problem, weights: dict[str, np.ndarray], max_new_tokens: int, crash_tool: bool = False
) -> float:
    """The demo's `train_greedy` eval: one greedy attempt per training quiz, the pass rate (a
    crash action scores 0)."""
    sampler = Sampler(problem, weights, 1.0)
    rewards = [
        run_attempt(problem, sampler, task, None, max_new_tokens, crash_tool).reward
        for task in problem.task_names
    ]
    return float(np.mean(rewards))


def arm_trainer(problem: Problem, arm: str, weights: dict[str, np.ndarray] | None = None) -> Trainer:
    config = dataclasses.replace(problem.trainer_config, **OFFLINE_ARMS[arm].trainer)
    return Trainer(problem.model_config, copy.deepcopy(weights or problem.weights), config)


def plan_run_step(
    config: OfflineConfig, seed: int, step: int, task_names: Sequence[str], mode: str
) -> list[Any]:
    """The demo's plan of one step for `seed` (uniform and exploitable modes: with the attempt
    faults at `faults`)."""
    rate = config.faults if mode in PLANNED_FAULT_MODES else 0.0
    demo = DemoConfig(
        steps=config.steps, tasks=config.tasks, attempts=config.attempts, faults=rate, seed=seed
    )
    return plan_step(step, demo, task_names)


def rollout_step(
    problem: Problem,
    config: OfflineConfig,
    sampler: Sampler,
    mode: str,
    arm: str,
    seed: int,
    step: int,
    version: int,
) -> tuple[list[list[Sample]], list[int], list[int], list[str]]:
    """One step's groups of samples; the indices of the attempts an infrastructure fault hit, and
    of those that took the crash action; the groups' quizzes."""
    rules = OFFLINE_ARMS[arm]
    crash_tool = mode in CRASH_MODES
    groups, faulted, crashed, tasks = [], [], [], []
    for group in plan_run_step(config, seed, step, problem.task_names, mode):
        samples = []
        for plan in group:
            attempt = run_attempt(
                problem, sampler, plan.task, sampling_uniforms(seed, plan.index, config.max_new_tokens),
                config.max_new_tokens, crash_tool,
            )  # fmt: skip
            fault = None
            if rules.faults:
                fault = attempt_fault(
                    mode, config.faults, step, config.steps, plan.fault,
                    fault_uniforms(seed, mode, plan.index), attempt.sandbox_calls,
                )  # fmt: skip
            if fault is not None:
                faulted.append(plan.index)
            if attempt.crashed:
                crashed.append(plan.index)
            sample = make_sample(attempt, plan.group_index, plan.index, version, fault, rules.attribution)
            samples.append(sample)
        groups.append(samples)
        tasks.append(group[0].task)
    return groups, faulted, crashed, tasks


def run_one(
    problem: Problem, config: OfflineConfig, mode: str, arm: str, seed: int, keep_weights: bool = False
) -> RunResult:
    """One whole run of `config.steps` steps under `mode`'s faults with `arm`'s rules (with
    `keep_weights`, the result holds the final weights)."""
    with single_blas_thread():
        return _run_one(problem, config, mode, arm, seed, keep_weights)


def _run_one(
    problem: Problem, config: OfflineConfig, mode: str, arm: str, seed: int, keep_weights: bool
) -> RunResult:
    started = time.perf_counter()
    args = miles_args(config)
    post_process = load_function(OFFLINE_ARMS[arm].reward_post_process_path)
    trainer = arm_trainer(problem, arm, problem.first_weights(mode))
    snapshots: dict[int, dict[str, np.ndarray]] = {0: copy.deepcopy(trainer.weights)}
    samplers: dict[int, Sampler] = {}
    steps, faulted, tasks = [], [], []
    for step in range(config.steps):
        version = sampling_version(config.schedule, step)
        if version not in samplers:
            samplers = {version: Sampler(problem, snapshots[version], config.temperature)}
        groups, faults, crashes, names = rollout_step(
            problem, config, samplers[version], mode, arm, seed, step, version
        )
        faulted.append(faults)
        tasks.append(names)
        kept = [group for group in groups if check_valid_reward_nonzero_std(args, group).keep]
        REGISTRY.drain()
        every = [s for group in groups for s in group]
        valid_rewards = [float(s.reward) for s in every if is_valid(s)]
        fault_indices, crash_indices = set(faults), set(crashes)
        unfaulted = [s for s in every if s.index not in fault_indices]
        passed = [0.0 if s.index in crash_indices else float(s.reward) for s in unfaulted]
        samples = [s for group in sorted(kept, key=lambda g: g[0].index) for s in group]
        shift: dict[str, float] = {}
        if samples:
            raw, advantages = post_process(args, samples)
            shift = advantage_metrics(args, samples, advantages)
        else:
            raw, advantages = [], []
        metrics = trainer.train_step(samples, advantages, raw, policy_version=step)
        snapshots[step + 1] = copy.deepcopy(trainer.weights)
        for old in [v for v in snapshots if v < step]:
            del snapshots[old]  # the next sampling version is step or later
        trained = bool(metrics.get("train/valid_samples"))
        steps.append(
            StepRecord(
                step=step,
                attempts=len(every),
                valid=len(valid_rewards),
                infra=len(every) - len(valid_rewards),
                kept_groups=len(kept),
                unfiltered_mean=_mean(valid_rewards),
                loss_scale=metrics.get("train/loss_scale") if trained else None,
                advantage_shift=shift.get(ADVANTAGE_SHIFT),
                grad_norm=metrics.get("train/grad_norm"),
                crashes=len(crashes),
                pass_rate=_mean(passed),
            )
        )
    eval_pass = greedy_eval(problem, trainer.weights, config.max_new_tokens, mode in CRASH_MODES)
    weights = copy.deepcopy(trainer.weights) if keep_weights else None
    return RunResult(
        mode, arm, seed, steps, eval_pass, faulted, tasks, time.perf_counter() - started, weights
    )


_SHARED: dict[str, Any] = {}


def _run_job(job: tuple[str, str, int]) -> RunResult:
    return run_one(_SHARED["problem"], _SHARED["config"], *job)


def run_all(
    problem: Problem,
    config: OfflineConfig,
    jobs: Sequence[tuple[str, str, int]],
    progress: Callable[[RunResult], None] | None = None,
) -> list[RunResult]:
    """Every (mode, arm, seed) job, in `config.workers` forked processes (1: in this one)."""
    results: list[RunResult] = []
    if config.workers == 1:
        for job in jobs:
            results.append(run_one(problem, config, *job))
            if progress:
                progress(results[-1])
        return results
    import multiprocessing

    _SHARED.update(problem=problem, config=config)
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(config.workers, mp_context=context) as pool:
        for future in as_completed([pool.submit(_run_job, job) for job in jobs]):  # run in job order
            results.append(future.result())
            if progress:
                progress(results[-1])
    order = {job: number for number, job in enumerate(jobs)}
    return sorted(results, key=lambda r: order[(r.mode, r.arm, r.seed)])


def jobs_for(config: OfflineConfig) -> list[tuple[str, str, int]]:
    """Every (mode, arm, seed) to run, seed by seed (stopped early, every arm and mode has the
    same seeds); the ablation arms only in `ablation_modes`, rl360-list only in `list_modes`. The
    clean arm has no fault, and its tasks and sampling draws do not depend on the mode, so its
    runs are the same in every mode without the crash tool: it runs once per seed in the first of
    them (`with_clean_everywhere` copies it to the others), and once in each mode with the crash
    tool (another first policy and action space: the crash, under attribution by evidence)."""
    jobs = []
    plain = [mode for mode in config.mode_names if mode not in CRASH_MODES]
    for seed in config.seed_list:
        for mode in config.mode_names:
            for arm in config.arm_names:
                if (
                    (arm == CLEAN and mode in plain and mode != plain[0])
                    or (arm in ABLATION_ARMS and mode not in config.ablation_mode_names)
                    or (arm == RL360_LIST and mode not in config.list_mode_names)
                ):
                    continue
                jobs.append((mode, arm, seed))
    return jobs


def with_clean_everywhere(results: Sequence[RunResult], modes: Sequence[str]) -> list[RunResult]:
    """`results` with the clean arm's runs repeated under every mode without the crash tool (they
    are the same in each); a crash mode's clean runs are its own."""
    clean = [r for r in results if r.arm == CLEAN and r.mode not in CRASH_MODES]
    plain = [mode for mode in modes if mode not in CRASH_MODES]
    extra = [dataclasses.replace(r, mode=mode) for mode in plain for r in clean if r.mode != mode]
    return [*results, *extra]


def run_record(run: RunResult, config: OfflineConfig) -> dict[str, Any]:
    """One run as ab.json and runs.jsonl hold it."""
    return {
        "mode": run.mode,
        "arm": run.arm,
        "seed": run.seed,
        "eval_pass": run.eval_pass,
        "seconds": run.seconds,
        "figures": run_figures(run, config.steps, config.goal),
        "curve": [s.unfiltered_mean for s in run.steps],
        "loss_scale": [s.loss_scale for s in run.steps],
        "advantage_shift": [s.advantage_shift for s in run.steps],
        "infra": [s.infra for s in run.steps],
        "kept_groups": [s.kept_groups for s in run.steps],
        "crash_rate": [s.crash_rate for s in run.steps],
        "pass_rate": [s.pass_rate for s in run.steps],
    }


def _json_default(value: Any) -> Any:
    if isinstance(value, np.floating | np.integer):
        return value.item()
    raise TypeError(f"not JSON: {type(value).__name__}")
