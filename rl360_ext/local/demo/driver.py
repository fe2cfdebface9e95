"""The demo's driver: one run's rollout steps in Miles' order, against the local stack.

Owns `DemoDriver`: it calls the same hooks Miles would, in the order Miles calls them, against
real processes (tiny engines behind SMG, a session pool on local Ray, the Harbor `/run` server
with bubblewrap sandboxes; `rl360_ext.local.demo.stack`), trains the policy with the reference
trainer (`rl360_ext.local.demo.trainer`, standing in for Megatron) and pushes each step's weights
through SMG. It does not own any hook: generate, filter, reward post-process and metrics are
rl360's own (`rl360_ext.rollout.*`), loaded by the dotted paths a Miles launch would pass
(`rl360_ext.local.demo.miles_args`). The order it follows (Miles' `train.py` and
`train_async.py`), the schedules and the deliberate deviations are in docs/demo.md; starting a
run, its summary and its report are `rl360_ext.local.demo.run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.progress import Progress, TaskID

from rl360_ext.local.demo.arms import ADVANTAGE_KIND, advantage_metrics
from rl360_ext.local.demo.churn import EngineChurn
from rl360_ext.local.demo.console import TRUST_METRICS, push_line, train_line, version_metrics, versions_line
from rl360_ext.local.demo.gate import DemoGate, Injector
from rl360_ext.local.demo.miles_args import METRICS_FILE, DemoState, build_args
from rl360_ext.local.demo.modes import IN_FLIGHT
from rl360_ext.local.demo.plan import (
    CLIENT_DEADLINE,
    AttemptPlan,
    DemoConfig,
    EvalAttempt,
    attempt_sampling_seed,
    correlated_fault,
    eval_notes,
    plan_eval,
    plan_step,
    should_evaluate,
    split_eval_tasks,
)
from rl360_ext.local.demo.summary import StepSummary, attach_push, summarize_step
from rl360_ext.local.demo.trainer import CHANCE_LEVEL, DemoTrainer
from rl360_ext.local.demo.versions import (
    INITIAL_WEIGHT_VERSION,
    START,
    TRAIN,
    WAIT,
    allowed_weight_versions,
    pushed_version,
    schedule_events,
)
from rl360_ext.local.engines import engine_client, engine_requests
from rl360_ext.local.fixtures import quiz_task_names
from rl360_ext.local.fixtures import tasks_root as demo_tasks_root
from rl360_ext.local.stack import LocalStack
from rl360_ext.outcomes.infra import mark_infra_sample
from rl360_ext.outcomes.provenance import DOMAIN, is_valid
from rl360_ext.rollout.eval_metrics import EVAL_NOTE_KIND
from rl360_ext.rollout.metrics import append_records
from rl360_ext.util.dotted import load_function
from rl360_ext.weights.stale import stale_served_tokens

IN_FLIGHT_WAIT_S = 60.0  # an in-flight push waits at most this long for the engines to generate


IN_FLIGHT_POLL_S = 0.05  # how often it reads their running-request counts meanwhile


# A client-deadline fault starts the attempt with its deadline already spent (as when an attempt
# waited in the rollout queue past its budget): the client gives up before Harbor can answer.
SPENT_DEADLINE_S = 0.001


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
        """Carry out the schedule (`demo.versions.schedule_events`): rollouts as tasks, training and
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
