"""`rl360 demo`: the whole rollout loop on one CPU machine, in Miles' order, ending in a step report.

Owns the demo driver: it calls the same hooks Miles would, in the order Miles calls them, against
real processes (tiny engines behind SMG, a session pool on local Ray, the Harbor `/run` server
with bubblewrap sandboxes; see `demo_stack`), trains the policy with the reference trainer
(`rl360_ext.local.demo.trainer`, standing in for Megatron), pushes each step's weights through
SMG, shows progress, prints a summary table, and writes `metrics.jsonl` and `report.html` in the
output folder. It does not own any hook: generate, filter, reward post-process and metrics are
rl360's own (`rl360_ext.rollout.*`), loaded by the dotted paths a Miles launch would pass, and the
train step applies rl360's pg-loss reducer and TIS hooks through Miles' contracts.

Order (read off radixark/miles 31f1ca96):
- `train_async.py` (one-step-off), as `demo.plan.one_step_off_schedule`: push weights once
  before anything; start rollout 0; then for each step k: wait for rollout k, start rollout k+1,
  train on step k, wait for rollout k+1 (Miles never pushes weights mid-generation), push
  weights. So step k's update overlaps step k+1's generation and step k+2 generates on step k's
  weights (`demo.plan.expected_weight_version`); every turn's version is checked.
- `--schedule in-flight` (`demo.plan.in_flight_schedule`): the same, but each push goes out as
  soon as the step's training wrote the weights, while the next rollout generates: the engines
  pause with `--pause-mode` (in_place: KV kept, so the push keeps the prefix cache, as SGLang
  refuses that flush; retract: KV recomputed on the new weights), update and continue. A step's
  turns may then carry the two versions `demo.plan.allowed_weight_versions` names; the trainer's
  TIS corrects for the hybrid behaviour policy through the per-token rollout logprobs. Each train
  step prints and records the per-token version figures the trainer logged
  (`rl360_ext.train.staleness`: staleness/*, kv/*, r3/* in its `train` record).
- one rollout (`RolloutManager.generate` -> `inference_rollout_train.generate_rollout_async`):
  submit every group's attempts at once through the generate hook (a fresh routing key per sample,
  as `generate_and_rm_group` does under policy manual), run the dynamic filter on each group as it
  completes, then the rollout log function over the kept samples, then reward post-processing
  (Miles logs before `convert_samples_to_train_data` applies the custom reward post-process).

- `--engine-churn SPEC` (`rl360_ext.local.demo.churn`): engines are killed mid-rollout and replaced, or
  hang at a push; every push plans on the gateway's current workers, fences an engine that does
  not confirm in time and retries (`rl360_ext.weights.push.push_with_fencing`), and records its
  `weights/*` metrics, stale-served tokens included (`rl360_ext.weights.stale`).

- eval (`--eval-interval N`; `RolloutManager.eval` -> `eval_rollout_single_dataset`): before
  training and after the push of every N-th train step and the last (train_async.py), every
  eval dataset's attempts through the generate hook with `evaluation=True`, then the eval log
  hook (`rl360_ext.rollout.eval_metrics`); held-out quiz tasks never train (`demo.plan.plan_eval`).

Deviations, on purpose: no over-sampling (Miles draws more prompts until `rollout_batch_size`
groups pass the filter; the demo submits `--tasks` groups per step and keeps what passes, so steps
stay comparable); the trainer is the CPU reference trainer (no parallelism), trained in a thread
of this process while the next rollout generates.

The model is the tiny engine's: random weights after two warm starts that never see an answer or
a reward (a base-model stage that tells the questions apart, then a format head, so the first
policy answers with a letter at chance; `rl360_ext.local.demo.trainer`); the quiz agent takes
two turns and reads the first a-d character of its answer as the answer. See docs/demo.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib
import json
import logging
import math
import os
import shutil
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from rl360_ext.local.demo.arms import ADVANTAGE_KIND, RL360_REWARD_POST_PROCESS, advantage_metrics, arm_rules
from rl360_ext.local.demo.churn import EngineChurn
from rl360_ext.local.demo.gate import DemoGate, Injector
from rl360_ext.local.demo.plan import (
    AGE_BUCKETS,
    CLIENT_DEADLINE,
    IN_FLIGHT,
    INITIAL_WEIGHT_VERSION,
    ONE_STEP_OFF,
    PAUSE_MODES,
    START,
    TRAIN,
    WAIT,
    AttemptPlan,
    DemoConfig,
    EvalAttempt,
    StepSummary,
    allowed_weight_versions,
    attach_push,
    attempt_sampling_seed,
    correlated_fault,
    eval_notes,
    max_token_age,
    plan_eval,
    plan_step,
    pushed_version,
    schedule_events,
    should_evaluate,
    split_eval_tasks,
    summarize_step,
)
from rl360_ext.local.demo.stack import demo_stack
from rl360_ext.local.demo.trainer import CHANCE_LEVEL, DemoTrainer
from rl360_ext.local.engines import engine_busy_seconds, engine_client, engine_fault_counts, engine_requests
from rl360_ext.local.fixtures import quiz_task_names
from rl360_ext.local.fixtures import tasks_root as demo_tasks_root
from rl360_ext.local.fixtures.quiz_agent import CRASH_LETTER, LETTERS
from rl360_ext.local.stack import LocalStack
from rl360_ext.outcomes.infra import mark_infra_sample
from rl360_ext.outcomes.provenance import DOMAIN, is_valid
from rl360_ext.reference.trainer.trainer import TrainerConfig
from rl360_ext.rollout.eval_metrics import EVAL_NOTE_KIND
from rl360_ext.rollout.metrics import append_records
from rl360_ext.templates.tokenizer import load_hf_tokenizer
from rl360_ext.util.console import make_console, print_table
from rl360_ext.util.dotted import load_function
from rl360_ext.util.procs import LOOPBACK
from rl360_ext.weights.stale import stale_served_tokens

GENERATE_PATH = "rl360_ext.rollout.generate.generate"
FILTER_PATH = "rl360_ext.rollout.filters.check_valid_reward_nonzero_std"
REWARD_POST_PROCESS_PATH = RL360_REWARD_POST_PROCESS
ROLLOUT_LOG_PATH = "rl360_ext.rollout.metrics.log_rollout_metrics"
EVAL_LOG_PATH = "rl360_ext.rollout.eval_metrics.log_eval_metrics"
METRICS_FILE = "metrics.jsonl"
REPORT_FILE = "report.html"
SUMMARY_FILE = "summary.json"
COMPARE_FILE = "compare.json"
TRUST_METRICS = ("train/logprob_abs_diff_mean", "train/tis_clipfrac")
VERSION_METRIC_PREFIXES = ("staleness/", "kv/", "r3/")  # the trainer's version metrics
IN_FLIGHT_WAIT_S = 60.0  # an in-flight push waits at most this long for the engines to generate
IN_FLIGHT_POLL_S = 0.05  # how often it reads their running-request counts meanwhile
# A client-deadline fault starts the attempt with its deadline already spent (as when an attempt
# waited in the rollout queue past its budget): the client gives up before Harbor can answer.
SPENT_DEADLINE_S = 0.001
TRANSFORMERS_ADVISORY_ENV = "TRANSFORMERS_NO_ADVISORY_WARNINGS"
QUIZ_OPTIONS = "environment/app/options.txt"  # what the quiz agent's probe prints in the sandbox
# The recipe's loss flags (recipes/lib/rl360-common.sh: --eps-clip 0.2 --eps-clip-high 0.28, no
# --eps-clip-c; --use-dynamic-global-batch-size, which the demo uses when it takes one step a rollout).
RECIPE_LOSS = {"eps_clip": 0.2, "eps_clip_high": 0.28}


def build_args(
    config: DemoConfig,
    stack: LocalStack,
    *,
    deadline_s: float | None = None,
    client_margin_s: float | None = None,
) -> argparse.Namespace:
    """Miles-style args: the generate hook's own flags parsed by its `add_arguments`, plus the Miles
    settings the hooks read (hook paths, group size, advantage estimator)."""
    from rl360_ext.rollout import generate

    parser = argparse.ArgumentParser(prog="rl360-demo", add_help=False)
    generate.add_arguments(parser)
    flags = [
        "--rl360-harbor-url", stack.harbor_urls,
        "--rl360-session-backend", stack.gateway_url,
        "--rl360-session-host", LOOPBACK,
        "--rl360-session-servers", str(config.session_servers),
        "--rl360-tokenizer", str(stack.tokenizer_dir),
        "--rl360-r3",
        "--rl360-deadline-s", str(config.deadline_s if deadline_s is None else deadline_s),
        "--rl360-task-key", "task",
        "--rl360-metrics-path", str(config.out / METRICS_FILE),
        "--rl360-top-logprobs-num", str(config.top_logprobs_num),
    ]  # fmt: skip
    if client_margin_s is not None:
        flags += ["--rl360-client-margin-s", str(client_margin_s)]
    if config.quarantine_file is not None:  # the agent masks its tasks; the log hook tracks task health
        flags += ["--rl360-quarantine-file", str(config.quarantine_file)]
    args = parser.parse_args(flags)
    args.custom_generate_function_path = GENERATE_PATH
    args.dynamic_sampling_filter_path = FILTER_PATH
    args.custom_reward_post_process_path = arm_rules(config.rules).reward_post_process_path
    args.custom_rollout_log_function_path = ROLLOUT_LOG_PATH
    args.custom_eval_rollout_log_function_path = EVAL_LOG_PATH
    args.eval_reward_key = None
    args.n_samples_per_prompt = config.attempts
    args.rollout_batch_size = config.tasks
    args.sglang_router_policy = "manual"
    args.advantage_estimator = "grpo"
    args.rewards_normalization = True
    args.grpo_std_normalization = True
    args.reward_key = None
    return args


@dataclass(frozen=True)
class DemoState:
    """Stands in for Miles' GenerateState: the generate hook reads only `state.args`."""

    args: argparse.Namespace


@dataclass
class StepData:
    """What one rollout hands to training: the kept samples and their advantages."""

    step: int
    samples: list[Any]
    raw_rewards: list[float]
    advantages: list[float]
    summary: StepSummary


class DemoDriver:
    """Runs the steps: rollouts, reference-trainer steps, weight pushes, in Miles' one-step-off order."""

    def __init__(
        self, config: DemoConfig, stack: LocalStack, progress: Progress, policy: DemoTrainer
    ) -> None:
        from rl360_ext.rollout.sample import GenerateFnInput, Sample

        self.config = config
        self.stack = stack
        self.progress = progress
        self.console = progress.console
        self.args = build_args(config, stack)
        self.state = DemoState(self.args)
        self.deadline_state = DemoState(
            build_args(config, stack, deadline_s=SPENT_DEADLINE_S, client_margin_s=0.0)
        )
        self.generate = load_function(self.args.custom_generate_function_path)
        self.dynamic_filter = load_function(self.args.dynamic_sampling_filter_path)
        self.reward_post_process = load_function(self.args.custom_reward_post_process_path)
        self.log_rollout = load_function(self.args.custom_rollout_log_function_path)
        self.log_eval = load_function(self.args.custom_eval_rollout_log_function_path)
        self._sample_type = Sample
        self.run_id = uuid.uuid4().hex
        self._input_type = GenerateFnInput
        self.sampling_params = {"temperature": config.temperature, "max_new_tokens": config.max_new_tokens}
        root = demo_tasks_root()
        self.quiz_tasks = quiz_task_names(root)
        self.instructions = {name: (root / name / "instruction.md").read_text() for name in self.quiz_tasks}
        self.train_tasks, self.held_out_tasks = split_eval_tasks(config, self.quiz_tasks)
        self.metrics_path = config.out / METRICS_FILE
        self.weights = policy
        warm = self.weights.warm_start
        took = f"{warm.seconds:.1f} s"
        if warm.cached:
            took = f"read from the cache, computed in {took}"
        self.console.print(
            f"warm start ({warm.prompts} answer prompts, {took}, no answers or rewards seen): "
            f"base stage {warm.label_steps} steps, question labels at p {warm.label_prob:.2f}, "
            f"answer-position cosine between questions {warm.cosine_before:.3f} -> {warm.cosine_after:.3f}, "
            f"look turn ends at once with p {warm.look_end_prob:.2f}; "
            f"format head: letters A-D hold {warm.letter_mass:.0%} of the answer's probability, equally "
            f"(chance {CHANCE_LEVEL:.2f})"
        )
        self.train_metrics: dict[int, dict[str, float]] = {}
        self.summaries: dict[int, StepSummary] = {}
        self.pushes: list[dict[str, Any]] = []
        self.problems: list[str] = []
        self.published_version: str | None = None  # the last version every live engine confirmed
        self._push_engines: list[str] | None = None  # the engines after the last push
        self._calls_history: dict[str, list[int]] = {}  # calls per engine (max) of each path's pushes
        self._stale_since_push = 0  # stale-served tokens of the attempts finished since the last push
        self.gate = DemoGate(self.metrics_path, config.gate)  # --inject, --no-gate: demo.gate
        self.injector = Injector(
            config, self.args, lambda: [e.url for e in stack.engines], stack.tokenizer_dir,
            policy.model_config, self.metrics_path,
        )  # fmt: skip
        self.churn: EngineChurn | None = None
        if config.churn_events:
            self.churn = EngineChurn(stack, config.churn_events, self._record_churn)

    # ---- the one-step-off loop (train_async.py) ---------------------------------------------------

    async def run(self) -> list[StepSummary]:
        """Carry out the schedule (`demo.plan.schedule_events`): rollouts as tasks, training and
        pushes in between."""
        await self._start_session_pool()
        if self.config.eval_interval is not None:
            notes = eval_notes(self.train_tasks, self.held_out_tasks)
            append_records(self.metrics_path, [{"kind": EVAL_NOTE_KIND, "datasets": notes}])
        rollouts: dict[int, asyncio.Task[StepData]] = {}
        churning: dict[int, asyncio.Task[None]] = {}
        finished: dict[int, StepData] = {}
        trained: dict[int, Path] = {}
        try:
            for event in schedule_events(self.config.schedule, self.config.steps):
                if event.action == START:
                    rollouts[event.step] = task = asyncio.create_task(self.rollout(event.step))
                    if self.churn is not None:
                        generating = functools.partial(self.await_generation, task)
                        churning[event.step] = asyncio.create_task(
                            self.churn.during_rollout(event.step, generating)
                        )
                elif event.action == WAIT:
                    finished[event.step] = await rollouts.pop(event.step)
                    if event.step in churning:  # a kill and its replacement finish before the push
                        await churning.pop(event.step)
                elif event.action == TRAIN:
                    trained[event.step] = await self.train(finished.pop(event.step))
                    if self.gate.stopped_at is not None:  # the gate's stop: nothing after this step
                        break
                elif event.step is None:
                    await self.push(None, await asyncio.to_thread(self.weights.save, INITIAL_WEIGHT_VERSION))
                    if self.config.eval_interval is not None:  # Miles evaluates before training
                        await self.evaluate(0, before_training=True)  # (train_async.py:62-63)
                else:
                    generating = rollouts.get(event.step + 1) if self.config.schedule == IN_FLIGHT else None
                    await self.push(event.step, trained.pop(event.step), generating)
                    if should_evaluate(event.step, self.config):  # after the push (train_async.py:113)
                        await self.evaluate(event.step)
        finally:
            for task in [*rollouts.values(), *churning.values()]:
                task.cancel()
            for task in [*rollouts.values(), *churning.values()]:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        last = self.config.steps - 1 if self.gate.stopped_at is None else self.gate.stopped_at
        return [self.summaries[step] for step in range(last + 1)]

    async def _start_session_pool(self) -> None:
        from rl360_ext.rollout.config import GenerateConfig
        from rl360_ext.rollout.generate import session_pool

        handle = await session_pool(GenerateConfig.from_args(self.args).pool)
        self.stack.session_servers = list(handle.pool.urls)
        self.stack.write_manifest()

    async def train(self, data: StepData) -> Path:
        """`actor_model.train` on the reference trainer: new weights on disk for the next push."""
        path, metrics = await asyncio.to_thread(
            self.weights.update,
            data.step,
            pushed_version(data.step),
            data.samples,
            data.advantages,
            data.raw_rewards,
            self.metrics_path,
            self.gate.before_update(data.step, self.pushes[-1].get("metrics") if self.pushes else None),
        )
        self.train_metrics[data.step] = metrics
        data.summary.gate = self.gate.cell(data.step)
        data.summary.train_time_s = metrics.get("train/time_s")
        data.summary.trust = {k: metrics[k] for k in TRUST_METRICS if k in metrics}
        data.summary.versions = version_metrics(metrics)
        self.console.print(train_line(data.step, metrics, pushed_version(data.step)))
        self.console.print(versions_line(data.step, data.summary.versions))
        if (line := self.gate.line(data.step)) is not None:
            self.console.print(line)
        return path

    async def await_generation(self, rollout: asyncio.Task[StepData]) -> dict[str, Any]:
        """Wait (at most IN_FLIGHT_WAIT_S) until the engines are generating for `rollout` or have
        answered one of its requests since the wait began, so an in-flight push lands
        mid-trajectory: a rollout first sets up its sandboxes (a push sent then would land before
        its first model call), and the tiny model answers a turn in milliseconds, so the push
        most often lands while trajectories run their tools between two turns. It reads the
        engines every IN_FLIGHT_POLL_S through one keep-alive client (one connection per engine),
        each read bounded by the time the wait has left. Returns what the wait saw."""
        started = time.monotonic()
        engines = self.stack.engines

        def left() -> float:
            return IN_FLIGHT_WAIT_S - (time.monotonic() - started)

        async with engine_client(engines) as client:  # one keep-alive connection per engine
            running, first = await engine_requests(client, engines, left())
            answered = first
            while not rollout.done() and not running and answered == first and left() > IN_FLIGHT_POLL_S:
                await asyncio.sleep(IN_FLIGHT_POLL_S)
                running, answered = await engine_requests(client, engines, left())
        return {
            "waited_s": time.monotonic() - started,
            "running_requests": running,
            "requests_answered": answered - first,
            "rollout_done": rollout.done(),
        }

    async def push(
        self, step: int | None, weights_path: Path, generating: asyncio.Task[StepData] | None = None
    ) -> dict[str, Any]:
        """Push `weights_path` to every engine through SMG's RL fan-out and record it in the JSONL.

        With `generating` (the in-flight schedule's next rollout) the push waits for the engines to
        be generating it first (`await_generation`, recorded under "in_flight"). Each push plans on
        the gateway's worker set at that moment and fences an engine that does not confirm within
        `confirm_timeout_s` (`push_with_fencing`); under `--engine-churn` a hang is injected just
        before it and fenced engines are replaced after it (`rl360_ext.local.demo.churn`)."""
        version = pushed_version(step)
        in_flight = None if generating is None else await self.await_generation(generating)
        async with self.churn.lock if self.churn is not None else contextlib.nullcontext():
            return await self._push(step, weights_path, version, in_flight)

    async def _push(
        self, step: int | None, weights_path: Path, version: str, in_flight: dict[str, Any] | None
    ) -> dict[str, Any]:
        from rl360_ext.rollout.metrics import append_records
        from rl360_ext.weights.push import is_degraded, push_with_fencing

        if self.churn is not None:
            self.churn.before_push(step)
        # In flight, an in_place pause leaves requests holding KV, so SGLang would refuse the flush.
        flush = not (self.config.schedule == IN_FLIGHT and self.config.pause_mode == "in_place")
        push = await asyncio.to_thread(
            push_with_fencing,
            self.stack.gateway_url,
            str(weights_path),
            version,
            fence=self._fence,
            previous_engines=self._push_engines,
            published=self.published_version,
            pause_mode=self.config.pause_mode,
            flush_cache=flush,
            confirm_timeout_s=self.config.confirm_timeout_s,
        )
        history = self._calls_history.setdefault(push.path, [])
        push.degraded = is_degraded(push.calls_per_engine_max, history)
        history.append(push.calls_per_engine_max)
        push.stale_served_tokens, self._stale_since_push = self._stale_since_push, 0
        if push.complete:
            self.published_version = version
        self._push_engines = push.engines_reached  # an engine joining after this push is new to the next
        await asyncio.to_thread(self.injector.after_push, step, weights_path, version)  # --inject bad-push
        if self.churn is not None:
            self.churn.publish(str(weights_path), version)
            await asyncio.to_thread(self.churn.after_push)
        record = {"kind": "weight_push", "rollout_id": step, **push.to_dict()}
        if in_flight is not None:
            record["in_flight"] = in_flight
        append_records(self.metrics_path, [record])
        self.pushes.append(record)
        if step is not None:
            attach_push(self.summaries[step], record)
        after = "" if step is None else f" (after step {step})"
        if in_flight is not None:
            after += (
                f", sent after {in_flight['waited_s']:.1f} s with {in_flight['running_requests']} "
                f"requests generating and {in_flight['requests_answered']} answered while it waited"
            )
        self.console.print(push_line(version, after, push.metrics()))
        if not push.complete:
            self._problem(
                f"weight push v{version} incomplete: engine versions {push.final.engine_versions}, "
                f"missed {push.final.missed}, failures {push.final.failures}"
            )
        return record

    def _fence(self, url: str) -> None:
        """A push's fence for an engine that did not confirm: with churn, the churn controller
        (it replaces the engine after the push); else the stack removes it."""
        if self.churn is not None:
            self.churn.fence(url)
        else:
            self.stack.remove_engine(url)

    def _record_churn(self, record: dict[str, Any]) -> None:
        from rl360_ext.local.demo.churn import churn_line

        append_records(self.metrics_path, [record])
        self.console.print(churn_line(record))

    # ---- one rollout (RolloutManager.generate) -----------------------------------------------------

    async def rollout(self, step: int) -> StepData:
        started = time.monotonic()
        plan = plan_step(step, self.config, self.train_tasks)
        total = sum(len(group) for group in plan)
        task_id = self.progress.add_task(f"step {step}", total=total, phase="generating")
        counts: Counter[str] = Counter()
        pending = [asyncio.create_task(self._generate_group(group, task_id, counts)) for group in plan]
        finished: dict[int, list[Any]] = {}
        kept: dict[int, bool] = {}
        data: list[list[Any]] = []
        drops: Counter[str] = Counter()
        try:
            for next_group in asyncio.as_completed(pending):
                group = await next_group
                decision = self.dynamic_filter(self.args, group)
                keep = bool(getattr(decision, "keep", decision))
                finished[group[0].group_index] = group
                kept[group[0].group_index] = keep
                if keep:
                    data.append(group)
                else:
                    drops[getattr(decision, "reason", None) or "unspecified"] += 1
        finally:
            for task in pending:
                task.cancel()
        self.progress.update(task_id, phase="log, reward post-process")
        data.sort(key=lambda group: group[0].index)
        samples = [sample for group in data for sample in group]
        extra = {f"rollout/dynamic_filter/drop_{reason}": count for reason, count in drops.items()}
        rollout_time = time.monotonic() - started
        self.log_rollout(step, self.args, samples, extra, rollout_time)
        self.gate.after_rollout(step, samples)  # the step record just written: the gate's evidence
        raw_rewards, advantages = self.reward_post_process(self.args, samples)
        shift = advantage_metrics(self.args, samples, advantages)
        append_records(self.metrics_path, [{"kind": ADVANTAGE_KIND, "rollout_id": step, "metrics": shift}])
        order = sorted(finished)
        summary = summarize_step(
            step,
            [finished[g] for g in order],
            [kept[g] for g in order],
            allowed_weight_versions(self.config.schedule, step, self.config.steps),
            rollout_time,
        )
        self.summaries[step] = summary
        for problem in summary.version_problems:
            self._problem(f"step {step}: {problem}")
        versions = ",".join(summary.versions_seen) or "-"
        self.progress.update(
            task_id, phase=f"done: {summary.kept_groups}/{summary.groups} groups kept, weights v{versions}"
        )
        return StepData(step, samples, list(raw_rewards), list(advantages), summary)

    async def _generate_group(
        self, plans: Sequence[AttemptPlan], task_id: TaskID, counts: Counter[str]
    ) -> list[Any]:
        """All attempts of one group at once (Miles' generate_and_rm_group)."""

        async def attempt(plan: AttemptPlan) -> Any:
            state = self.deadline_state if plan.fault == CLIENT_DEADLINE else self.state
            state = self.injector.generate_state(plan.step, state)  # --inject template-drift
            published = self.published_version  # what the attempt's first request is routed under
            output = await self.generate(
                self._input_type(
                    state=state,
                    sample=self._sample(plan),
                    sampling_params=self._sampling_params(plan),
                    evaluation=False,
                )
            )
            sample = output.samples
            if is_valid(sample):  # the correlated fault mode: decided once the attempt ran
                fault = correlated_fault(self.config, plan.step, plan.index, sample.response, sample.reward)
                if fault is not None:
                    mark_infra_sample(sample, fault)
            self._stale_since_push += stale_served_tokens(sample, published)
            counts["valid" if is_valid(sample) else "infra"] += 1
            self.progress.update(
                task_id, advance=1, phase=f"generating: {counts['valid']} valid, {counts['infra']} infra"
            )
            return sample

        return list(await asyncio.gather(*(attempt(plan) for plan in plans)))

    # ---- eval (RolloutManager.eval -> eval_rollout_single_dataset) --------------------------------

    async def evaluate(self, rollout_id: int, *, before_training: bool = False) -> None:
        """Every eval dataset through the generate hook with `evaluation=True` (Miles'
        `eval_rollout_single_dataset`: the dataset's sampling params, a fresh routing key per
        sample, no filter, nothing trained), then the eval log hook on Miles' `data` shape."""
        started = time.monotonic()
        datasets = plan_eval(rollout_id, self.config, self.train_tasks, self.held_out_tasks)
        total = sum(len(attempts) for attempts in datasets.values())
        task_id = self.progress.add_task(f"eval {rollout_id}", total=total, phase="evaluating")

        async def attempt(plan: EvalAttempt) -> Any:
            params: dict[str, Any] = {
                "temperature": plan.temperature,
                "max_new_tokens": self.config.max_new_tokens,
            }
            if plan.sampling_seed is not None:
                params["sampling_seed"] = plan.sampling_seed
            sample = self._sample_type(
                index=plan.index,
                prompt=self.instructions[plan.task],
                metadata={"task": plan.task, "quiz": plan.task, DOMAIN: "quiz"},
                routing_key=uuid.uuid4().hex,
            )
            output = await self.generate(
                self._input_type(state=self.state, sample=sample, sampling_params=params, evaluation=True)
            )
            self.progress.update(task_id, advance=1)
            return output.samples

        names = list(datasets)
        results = await asyncio.gather(*(asyncio.gather(*(attempt(a) for a in datasets[n])) for n in names))
        data = {
            name: {
                "rewards": [s.reward for s in samples],
                "truncated": [s.status == self._sample_type.Status.TRUNCATED for s in samples],
                "samples": sorted(samples, key=lambda s: s.index),
            }
            for name, samples in zip(names, results, strict=True)
        }
        self.log_eval(rollout_id, self.args, data, {"eval/duration_seconds": time.monotonic() - started})
        rates = []
        for name in names:
            valid = [s for s in data[name]["samples"] if is_valid(s)]
            passed = sum(1 for s in valid if s.reward == 1.0)
            rates.append(
                f"{name} {passed}/{len(valid)} valid pass ({len(data[name]['samples']) - len(valid)} infra)"
            )
        self.progress.update(task_id, phase="done")
        when = "before training" if before_training else f"after step {rollout_id}"
        self.console.print(f"eval {when}: " + ", ".join(rates))

    def _sampling_params(self, plan: AttemptPlan) -> dict[str, Any]:
        params = dict(self.sampling_params)
        if self.config.seeded_sampling:
            params["sampling_seed"] = attempt_sampling_seed(self.config.seed, plan.index)
        return params

    def _sample(self, plan: AttemptPlan) -> Any:
        return self._sample_type(
            group_index=plan.group_index,
            index=plan.index,
            prompt=self.instructions[plan.task],
            metadata={"task": plan.run_task, "quiz": plan.task, DOMAIN: "quiz", "demo_fault": plan.fault},
            # One key per group, as Miles' generate_and_rm_group sets under a manual router policy:
            # a group's attempts share one engine and its prefix cache.
            routing_key=f"{self.run_id}-group-{plan.group_index}",
        )

    def _problem(self, message: str) -> None:
        self.problems.append(message)
        self.console.print(f"[bold red]MISMATCH[/] {message}")


def push_line(version: str, after: str, metrics: Mapping[str, Any]) -> str:
    """One console line per weight push, from its `weights/*` metrics."""
    pause = metrics.get("weights/pause_s")
    fenced = metrics.get("weights/engines_fenced") or 0
    line = (
        f"weight push v{version}{after}: {metrics['weights/duration_s']:.2f} s "
        f"(paused {'n/a' if pause is None else f'{pause:.2f} s'}), path {metrics['weights/path']}, "
        f"reason {metrics['weights/reason']}, {metrics['weights/engines_reached']}/"
        f"{metrics['weights/engines_expected']} live engines reached, update calls per engine max "
        f"{metrics['weights/calls_per_engine_max']}, "
        f"stale-served tokens {metrics['weights/stale_served_tokens']}"
    )
    if fenced:
        line += f", {fenced} engine(s) fenced, {metrics['weights/attempts']} attempts"
    if metrics.get("weights/degraded"):
        line += " [bold red]DEGRADED[/] (calls per engine over 2x the path's rolling median)"
    return line


def version_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """The per-token version metrics of a train step, as the trainer logged them
    (`rl360_ext.train.staleness`: staleness/*, kv/*, r3/*)."""
    return {k: float(v) for k, v in metrics.items() if k.startswith(VERSION_METRIC_PREFIXES)}


def versions_line(step: int, figures: Mapping[str, float] | None) -> str:
    """One console line per train step: token ages, mixed versions, stale KV and R3 provenance of
    its trained samples (the trainer's metrics, `version_metrics`)."""
    if not figures or not figures.get("staleness/aged_tokens"):
        return f"versions step {step}: no trained token carries a version"

    def share(name: str) -> str:
        value = figures.get(name)
        return "-" if value is None else f"{value:.0%}"

    hist = " ".join(f"{b}:{share(f'staleness/token_age_hist/{b}')}" for b in AGE_BUCKETS)
    mean = figures.get("staleness/token_age_mean")
    return (
        f"versions step {step}: token age [{hist}] mean {'-' if mean is None else f'{mean:.2f}'}, "
        f"mixed-version samples {share('staleness/mixed_version_frac')}, "
        f"stale KV {share('kv/stale_prefix_tokens_frac')}, "
        f"R3 rows from a later prefill {share('r3/rows_from_later_prefill_frac')}"
    )


def train_line(step: int, metrics: dict[str, float], version: str) -> str:
    """One console line per train step: samples, the trust metrics, time, the weights written."""

    def value(name: str, fmt: str) -> str:
        number = metrics.get(name)
        return "-" if number is None else format(number, fmt)

    valid, masked = int(metrics.get("train/valid_samples", 0)), int(metrics.get("train/masked_samples", 0))
    if not valid:
        return f"train step {step}: no valid sample in the kept groups; weights v{version} unchanged"
    return (
        f"train step {step}: {valid} valid + {masked} masked samples; mismatch at the sampling version: "
        f"|Δ log p| mean {value('train/logprob_abs_diff_mean', '.1e')} max "
        f"{value('train/logprob_abs_diff_max', '.1e')} (first token of a turn "
        f"{value('train/logprob_abs_diff_first_token_mean', '.1e')}), top-k KL "
        f"{value('train/topk_kl', '.1e')} overlap {value('train/topk_overlap', '.3f')} TV <= "
        f"{value('train/tv_bound_max', '.1e')}, routing agreement "
        f"{value('train/routing_agreement', '.3f')}; policy lag: |Δ log p| mean "
        f"{value('train/policy_lag_abs_diff_mean', '.1e')} max "
        f"{value('train/policy_lag_abs_diff_max', '.1e')}, "
        f"KL {value('train/policy_lag_kl', '.1e')}; pg clip {value('train/pg_clipfrac', '.3f')}, TIS clip "
        f"{value('train/tis_clipfrac', '.3f')}, grad norm {value('train/grad_norm', '.2f')}, loss scale "
        f"{value('train/loss_scale', '.2f')}; {value('train/time_s', '.1f')} s -> weights v{version}"
    )


# ---- run_demo ----------------------------------------------------------------------------------


def demo_policy(config: DemoConfig) -> DemoTrainer:
    """The trainer side, warm-started on the quiz questions. It runs in the main thread after the
    stack is up: run in a thread beside the stack's start-up, the process hung (every thread
    waiting on a lock) before Ray started."""
    from rl360_ext.reference.engine.tokenizer import default_tokenizer_dir
    from rl360_ext.util.cache import cache_root

    root = demo_tasks_root()
    questions = [
        ((root / name / "instruction.md").read_text(), (root / name / QUIZ_OPTIONS).read_text())
        for name in quiz_task_names(root)
    ]
    policy = DemoTrainer(
        config.out / "weights",
        default_tokenizer_dir(),
        questions,
        config.seed,
        TrainerConfig(
            lr=config.lr,
            decoupled_lr=config.head_lr,
            lr_warmup_steps=config.lr_warmup_steps,
            steps_per_rollout=config.steps_per_rollout,
            use_dynamic_global_batch_size=config.steps_per_rollout == 1,
            **RECIPE_LOSS,
            keep_old_actor=config.keep_old_actor,
            max_token_age=max_token_age(config.schedule, config.steps),
            **arm_rules(config.rules).trainer,
        ),
        cache_dir=cache_root(),
    )
    if config.crash_tool:
        tokenizer = load_hf_tokenizer(str(default_tokenizer_dir()))
        letters = [tokenizer.convert_tokens_to_ids(letter) for letter in LETTERS]
        crash_action_head(policy.trainer.weights, letters, tokenizer.convert_tokens_to_ids(CRASH_LETTER))
    return policy


def crash_action_head(weights: dict[str, np.ndarray], letters: Sequence[int], crash: int) -> None:
    """Give the first policy the crash action as one more answer (the exploitable fault mode): the
    crash token's LM-head column becomes the mean of the letters' columns, as the format warm start
    (`warm_start.fit_head`) starts each letter's, so after any prompt its logit is the letters' mean
    logit (at most their mean probability: about a fifth of the answer mass on the warm start) and
    RL moves it like any letter's. In place."""
    head = weights["lm_head"]
    head[:, crash] = head[:, list(letters)].mean(axis=1)


@dataclass
class DemoResult:
    out: Path
    summaries: list[StepSummary]
    pushes: list[dict[str, Any]]
    wall_s: float
    metrics_path: Path
    report_path: Path
    engine_503s: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    loop_s: float | None = None  # the driver's steps alone (no stack start, no warm start)
    engine_idle_share: float | None = None  # engine_idle_share over the driver's steps
    harbor_replicas: list[dict[str, Any]] = field(default_factory=list)  # the Harbor pool's, if any
    harbor_replacements: list[dict[str, Any]] = field(default_factory=list)  # by the pool's watchdog


def harbor_pool_line(replicas: Sequence[Mapping[str, Any]], replacements: Sequence[Any]) -> str:
    """What each Harbor pool replica (a Ray actor) served, and how many the watchdog replaced."""
    served = ", ".join(
        f"replica {r['index']} (pid {r['pid']}, {r['url']}, generation {r['generation']}) {r['attempts']}"
        for r in replicas
    )
    return f"Harbor pool attempts served: {served}; replicas replaced by the watchdog: {len(replacements)}"


def write_summary(config: DemoConfig, result: DemoResult) -> Path:
    """The summary table as JSON (`summary.json`), plus the run's settings and wall time."""
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()}
    body = {
        "config": settings,
        "wall_s": result.wall_s,
        "steps": [{**asdict(s), "infra": s.infra} for s in result.summaries],
        "pushes": result.pushes,
        "engine_503s": result.engine_503s,
        "problems": result.problems,
        "loop_s": result.loop_s,
        "engine_idle_share": result.engine_idle_share,
        "harbor_replicas": result.harbor_replicas,
        "harbor_replacements": result.harbor_replacements,
    }
    path = config.out / SUMMARY_FILE
    path.write_text(json.dumps(body, indent=2) + "\n")
    return path


def _import_transformers_quietly() -> None:
    """Import transformers now, without its "PyTorch was not found" advisory (rl360 never needs
    torch), instead of letting the first tokenizer load print it over the progress bars."""
    saved = os.environ.get(TRANSFORMERS_ADVISORY_ENV)
    os.environ[TRANSFORMERS_ADVISORY_ENV] = "1"
    try:
        importlib.import_module("transformers")
    finally:
        if saved is None:
            del os.environ[TRANSFORMERS_ADVISORY_ENV]
        else:
            os.environ[TRANSFORMERS_ADVISORY_ENV] = saved


def _fresh_output(out: Path) -> None:
    """A re-run into the same folder starts clean: the JSONL is append-only."""
    out.mkdir(parents=True, exist_ok=True)
    for name in (METRICS_FILE, REPORT_FILE, SUMMARY_FILE):
        (out / name).unlink(missing_ok=True)
    for name in ("weights", "trials"):
        shutil.rmtree(out / name, ignore_errors=True)


@contextlib.contextmanager
def _log_to_file(path: Path) -> Iterator[None]:
    """rl360's own log lines (per-attempt warnings) go to logs/driver.log, not over the progress bars."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    package = logging.getLogger("rl360_ext")
    saved = (package.level, package.propagate)
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    package.propagate = False
    try:
        yield
    finally:
        package.removeHandler(handler)
        package.setLevel(saved[0])
        package.propagate = saved[1]
        handler.close()


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops the demo the way Ctrl-C does (through every `finally`)."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


PROGRESS_COLUMNS = (
    TextColumn("[bold]{task.description}"),
    BarColumn(),
    MofNCompleteColumn(),
    TextColumn("{task.fields[phase]}"),
    TimeElapsedColumn(),
)


def summary_table(summaries: Sequence[StepSummary]) -> Table:
    def mean(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    table = Table(title="rl360 demo: per step")
    for column in (
        "step", "attempts", "valid", "infra", "kept groups",
        "mean (all)", "mean (kept)", "rollout s", "train s", "weights", "push after", "gate",
    ):  # fmt: skip
        table.add_column(column, justify="left" if column.startswith(("weights", "push")) else "right")
    for s in summaries:
        version = ",".join(s.versions_seen) or "-"
        version_cell = (
            version if not s.version_problems else f"[bold red]{version} (expected {s.expected_version})[/]"
        )
        push = "-" if s.push_duration_s is None else f"v{s.push_version} in {s.push_duration_s:.2f} s"
        if s.push_complete is False:
            push = f"[bold red]{push} INCOMPLETE[/]"
        table.add_row(
            str(s.step),
            str(s.attempts),
            str(s.valid),
            str(s.infra),
            f"{s.kept_groups}/{s.groups}",
            mean(s.unfiltered_mean),
            mean(s.kept_mean),
            seconds(s.rollout_time_s),
            seconds(s.train_time_s),
            version_cell,
            push,
            s.gate or "-",
        )
    return table


def infra_table(summaries: Sequence[StepSummary]) -> Table | None:
    """Infrastructure failures by cause (rows) and step (columns); None when there were none."""
    causes = sorted({cause for s in summaries for cause in s.infra_by_cause})
    if not causes:
        return None
    table = Table(title="infrastructure failures by cause (masked, out of every mean)")
    table.add_column("cause")
    for s in summaries:
        table.add_column(f"step {s.step}", justify="right")
    for cause in causes:
        table.add_row(f"infra:{cause}", *(str(s.infra_by_cause.get(cause, 0)) for s in summaries))
    return table


def learning_line(summaries: Sequence[StepSummary], wall_s: float, goal: float = 0.8) -> str:
    """Where the policy got: first and last unfiltered means, the first step at `goal`, time split."""
    means = [(s.step, s.unfiltered_mean) for s in summaries if s.unfiltered_mean is not None]
    if not means:
        return "learning: no step had a valid attempt"
    reached = next((step for step, mean in means if mean >= goal), None)
    rollout = sum(s.rollout_time_s or 0.0 for s in summaries)
    train = sum(s.train_time_s or 0.0 for s in summaries)
    goal_text = f"first at >= {goal:g} in step {reached}" if reached is not None else f"never >= {goal:g}"
    return (
        f"learning: unfiltered mean {means[0][1]:.3f} (step {means[0][0]}) -> {means[-1][1]:.3f} "
        f"(step {means[-1][0]}), best {max(m for _, m in means):.3f}, {goal_text}; chance "
        f"{CHANCE_LEVEL:.2f}; {wall_s:.0f} s wall; rollouts {rollout:.0f} s, training {train:.0f} s "
        "(training overlaps the next rollout)"
    )


def run_demo(
    steps: int = 20,
    tasks: int = 8,
    attempts: int = 4,
    faults: float = 0.0,
    engines: int = 2,
    out: Path = Path("runs/demo"),
    *,
    seed: int = 0,
    console: Console | None = None,
    **options: Any,
) -> DemoResult:
    """Start the stack, run `steps` rollout steps in Miles' order, stop everything, write the report.

    `options` are further `DemoConfig` fields (lr, steps_per_rollout, engine_dtype, ...)."""
    from rl360_ext.diagnostics.report import main as write_report

    config = DemoConfig(
        steps=steps,
        tasks=tasks,
        attempts=attempts,
        faults=faults,
        engines=engines,
        out=Path(out),
        seed=seed,
        **options,
    )
    console = console or make_console()
    _fresh_output(config.out)
    _import_transformers_quietly()
    started = time.monotonic()
    engine_503s: dict[str, int] = {}
    replicas: list[dict[str, Any]] = []
    replacements: list[dict[str, Any]] = []
    console.print(
        f"rl360 demo: {config.steps} steps x {config.tasks} tasks x {config.attempts} attempts, "
        f"{config.engines} engines, faults {config.faults:g}, output {config.out}"
    )
    with _sigterm_as_interrupt(), _log_to_file(config.out / "logs" / "driver.log"):
        console.print("starting tiny engines, the SMG gateway, the Harbor /run server and local Ray ...")
        with demo_stack(config) as stack:
            try:
                console.print(
                    f"ready in {time.monotonic() - started:.1f} s: gateway {stack.gateway_url}, "
                    f"engines {', '.join(e.url for e in stack.engines)}, Harbor {stack.harbor_urls}; "
                    f"logs in {stack.logs}"
                )
                with Progress(*PROGRESS_COLUMNS, console=console) as progress:
                    driver = DemoDriver(config, stack, progress, demo_policy(config))
                    busy_before, loop_started = engine_busy_seconds(stack.engines), time.monotonic()
                    summaries = asyncio.run(driver.run())
                    loop_s = time.monotonic() - loop_started
                    idle_share = engine_idle_share(busy_before, engine_busy_seconds(stack.engines), loop_s)
                if config.faults > 0:
                    engine_503s = engine_fault_counts(stack.engines)
                if stack.harbor_pool is not None:
                    replicas, replacements = stack.harbor_replicas(), list(stack.harbor_pool.replacements)
            finally:
                console.print("stopping every process the demo started ...")
                stopping = time.monotonic()
    wall_s = time.monotonic() - started
    console.print(f"stopped in {time.monotonic() - stopping:.1f} s")
    print_table(console, summary_table(summaries))
    if (by_cause := infra_table(summaries)) is not None:
        print_table(console, by_cause)
    if engine_503s:
        console.print("engine 503s injected: " + ", ".join(f"{name} {n}" for name, n in engine_503s.items()))
    if replicas:
        console.print(harbor_pool_line(replicas, replacements))
    for problem in driver.problems:
        console.print(f"[bold red]MISMATCH[/] {problem}")
    console.print(learning_line(summaries, wall_s))
    if (gate_line := driver.gate.summary_line()) is not None:
        console.print(gate_line)
    report_path = config.out / REPORT_FILE
    write_report(config.out, report_path)
    result = DemoResult(
        out=config.out,
        summaries=summaries,
        pushes=driver.pushes,
        wall_s=wall_s,
        metrics_path=config.out / METRICS_FILE,
        report_path=report_path,
        engine_503s=engine_503s,
        problems=list(driver.problems),
        loop_s=loop_s,
        engine_idle_share=idle_share,
        harbor_replicas=replicas,
        harbor_replacements=replacements,
    )
    write_summary(config, result)
    console.print(
        f"done in {wall_s:.1f} s: {config.out / METRICS_FILE}, {report_path}, {config.out / SUMMARY_FILE}"
    )
    return result


def engine_idle_share(before: dict[str, float], after: dict[str, float], seconds: float) -> float | None:
    """The share of `seconds` x engines the engines spent outside model steps (None if unreadable)."""
    if not before or seconds <= 0 or any(v < 0 for v in (*before.values(), *after.values())):
        return None
    if set(before) != set(after):  # an engine was replaced (--engine-churn): no common clock
        return None
    busy = sum(after[name] - before[name] for name in before)
    return max(0.0, 1.0 - busy / (seconds * len(before)))


def _weighted(steps: Sequence[StepSummary], name: str, weight: str | None) -> float | None:
    """`name` over the steps that report it, weighted by the step's `weight` metric (its
    population: tokens, rows) or, with None, each step alike."""
    total = weights = 0.0
    for s in steps:
        figures = s.versions or {}
        if (value := figures.get(name)) is None:
            continue
        w = 1.0 if weight is None else figures.get(weight, 0.0)
        total, weights = total + value * w, weights + w
    return total / weights if weights else None


def _mid_rollout(in_flight: dict[str, Any] | None) -> bool:
    """Whether an in-flight push went out while its rollout's trajectories were under way: the
    engines were generating, or had answered a request of it, and the rollout was not done."""
    if not in_flight or in_flight.get("rollout_done"):
        return False
    return in_flight.get("running_requests", 0) > 0 or in_flight.get("requests_answered", 0) > 0


def schedule_figures(result: DemoResult) -> dict[str, Any]:
    """One schedule's side of `--compare schedules`, from its step summaries (the trainer's
    version metrics per step, pooled over steps by their populations)."""
    steps = result.summaries
    hist: Counter[str] = Counter()
    for s in steps:
        figures = s.versions or {}
        aged = figures.get("staleness/aged_tokens", 0.0)
        for bucket in AGE_BUCKETS:
            hist[bucket] += round(figures.get(f"staleness/token_age_hist/{bucket}", 0.0) * aged)

    def trust(name: str) -> float | None:
        values = [v for s in steps if s.trust and (v := s.trust.get(name)) is not None and not math.isnan(v)]
        return sum(values) / len(values) if values else None

    rollout = [s.rollout_time_s for s in steps if s.rollout_time_s is not None]
    later = "r3/rows_from_later_prefill_frac"
    return {
        "wall_s": result.wall_s,
        "loop_s_per_step": result.loop_s / len(steps) if steps and result.loop_s else None,
        "engine_idle_share": result.engine_idle_share,
        "rollout_s_mean": sum(rollout) / len(rollout) if rollout else None,
        "pushes_mid_rollout": sum(1 for p in result.pushes if _mid_rollout(p.get("in_flight"))),
        "token_age_hist": {bucket: hist.get(bucket, 0) for bucket in AGE_BUCKETS},
        "token_age_mean": _weighted(steps, "staleness/token_age_mean", "staleness/aged_tokens"),
        "mixed_version_frac": _weighted(steps, "staleness/mixed_version_frac", None),
        "stale_kv_frac": _weighted(steps, "kv/stale_prefix_tokens_frac", "kv/context_tokens"),
        "r3_later_prefill_frac": _weighted(steps, later, "r3/rows"),
        "r3_later_prefill_frac_cache_hit": _weighted(steps, f"{later}/cache_hit", None),
        "r3_later_prefill_frac_cache_miss": _weighted(steps, f"{later}/cache_miss", None),
        "logprob_abs_diff_mean": trust("train/logprob_abs_diff_mean"),
        "tis_clipfrac": trust("train/tis_clipfrac"),
        "learning_curve": [s.unfiltered_mean for s in steps],
        "problems": len(result.problems),
    }


def compare_table(figures: dict[str, dict[str, Any]]) -> Table:
    """The schedules side by side."""
    table = Table(title="schedules compared")
    table.add_column("figure", justify="left")
    for name in figures:
        table.add_column(name, justify="right")

    def cell(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.3f}"
        if isinstance(value, dict):
            return " ".join(f"{k}:{v}" for k, v in value.items())
        if isinstance(value, list):
            return " ".join("-" if v is None else f"{v:.2f}" for v in value)
        return str(value)

    first = next(iter(figures.values()))
    for key in first:
        table.add_row(key, *(cell(side[key]) for side in figures.values()))
    return table


def schedule_sides() -> list[tuple[str, str, str]]:
    """(side name, schedule, pause mode) of `--compare schedules`: one-step-off, then in-flight
    under each pause mode (the pause mode only matters when a push lands mid-rollout)."""
    sides = [(ONE_STEP_OFF, ONE_STEP_OFF, PAUSE_MODES[0])]
    sides += [(f"{IN_FLIGHT} {mode}", IN_FLIGHT, mode) for mode in PAUSE_MODES]
    return sides


def compare_schedules(
    out: Path = Path("runs/demo"), console: Console | None = None, **options: Any
) -> dict[str, dict[str, Any]]:
    """`rl360 demo --compare schedules`: the demo once per side of `schedule_sides`
    (OUT/<schedule>[-<pause mode>]), same seed and settings, then the figures side by side
    (printed, and written to OUT/compare.json)."""
    console = console or make_console()
    options.pop("schedule", None)
    options.pop("pause_mode", None)
    figures: dict[str, dict[str, Any]] = {}
    for side, schedule, mode in schedule_sides():
        folder = Path(out) / side.replace(" ", "-")
        result = run_demo(out=folder, console=console, schedule=schedule, pause_mode=mode, **options)
        figures[side] = schedule_figures(result)
    print_table(console, compare_table(figures))
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / COMPARE_FILE).write_text(json.dumps(figures, indent=2) + "\n")
    return figures
