"""Run one /run attempt as a real Harbor trial under admission, one deadline, and flush.

Owns the attempt's life: resolve the task (the catalog's private snapshot of it, which Harbor
runs and which is removed when the attempt ends) and agent, wait for admission (concurrency, waves,
reservations) no longer than the deadline allows, split what is left into phase budgets, build
Harbor's TrialConfig (agent/verifier/environment timeouts = those budgets, the reservation and
placement handed to the environment), run `Trial.create(...).run()` (with the catalog's parsed
`Task` of the snapshot: `catalog_trial`), and classify the result
through `rl360_ext.harbor.outcome`. Between the agent phase and the verifier it has the
environment kill every process the agent left and empty what the verifier reads besides the
agent's work product (`end_phase`, when the environment has one: /logs/verifier, /tests,
/solution, and the environment's own HOME and tmp).
After the trial it reads the facts the verdict needs (`outcome.trial_facts`, with the limits the
environment saw its processes hit) and, when a verifier failed on the agent's end state, the
evidence about the task's verifier on its known-good state (`rl360_ext.harbor.controls`: the
audit's, or a control regrade that `_control` runs with Harbor's oracle). Under the `evidence`
and `regrade` rules Harbor grades after an agent timeout and after a limit the agent hit.
`flush(instance_id)` cancels every queued or running attempt of a session server instance;
Harbor stops their sandboxes on cancellation; `shutdown` refuses new attempts and cancels all
(each answers `failure_cause: cancelled`). Refused requests raise `rl360_ext.harbor.errors`
classes naming the field. HTTP-agnostic: the FastAPI app only translates requests and errors.
It does not own Harbor's trial internals.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import shutil
import time
import uuid
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harbor.models.environment_type import EnvironmentType
from harbor.models.task.task import Task
from harbor.models.trial.config import (
    EnvironmentConfig,
    TaskConfig,
    TrialConfig,
    VerifierConfig,
)
from harbor.models.trial.error_policy import ErrorPolicyOverride
from harbor.models.trial.paths import EnvironmentPaths
from harbor.tasks.client import TaskDownloadResult
from harbor.trial.hooks import TrialEvent, TrialHookEvent
from harbor.trial.trial import Trial

from rl360_ext.harbor import agents, budget, controls, outcome
from rl360_ext.harbor.admission import (
    Admission,
    AdmissionRefused,
    Gate,
    ImagePinning,
    Placement,
    Reservation,
    RollingStart,
    StartGate,
)
from rl360_ext.harbor.catalog import TaskCatalog, TaskInfo
from rl360_ext.harbor.envs import choice, warm
from rl360_ext.harbor.errors import AgentKwargReserved, AgentNotAllowed, FieldInvalid, ServerShuttingDown
from rl360_ext.harbor.metrics import RunMetrics
from rl360_ext.harbor.settings import HarborServerConfig
from rl360_ext.harbor.snapshot import SnapshotStore
from rl360_ext.harbor.verifier import IMPORT_PATH as VERIFIER_IMPORT_PATH
from rl360_ext.outcomes.attribution import AttributionRule, Control
from rl360_ext.outcomes.causes import Cause
from rl360_ext.outcomes.harbor_exceptions import AGENT_TIMEOUT_ERROR
from rl360_ext.outcomes.known_good import KnownGood
from rl360_ext.outcomes.verdict import TrialFacts, needs_known_good

FLUSH_WAIT_S = 60.0
_PATHS = EnvironmentPaths()
# emptied, with no agent process left, before grading: the verifier's output, the task's tests
# (uploaded again whole, so nothing the agent added there stays) and the oracle's solution
GRADING_CLEARS = tuple(str(path) for path in (_PATHS.verifier_dir, _PATHS.tests_dir, _PATHS.solution_dir))
# The `list` rule (rl360 before attribution): an agent that ran out of its budget is cut off, not
# judged. The other rules grade what a timed-out agent, or one whose processes hit the memory
# limit, left: the policy's own failure, scored (docs/harbor.md).
_LISTED_ERROR_POLICY = {AGENT_TIMEOUT_ERROR: ErrorPolicyOverride(should_grade=False, has_valid_reward=False)}
_GRADED = ErrorPolicyOverride(should_grade=True, has_valid_reward=True)
_POLICY_LIMIT_ERRORS = (AGENT_TIMEOUT_ERROR, "MemoryLimitExceededError", "SandboxLikelyOutOfMemoryError")
_EVIDENCE_ERROR_POLICY = dict.fromkeys(_POLICY_LIMIT_ERRORS, _GRADED)
ORACLE = agents.AgentEntry("oracle", harbor_name="oracle")
CONTROL_AGENT_S = 600.0  # a control's oracle budget where the task sets no agent timeout
_log = logging.getLogger(__name__)
_Worked = tuple[outcome.Outcome, Placement | None, str | None]  # an attempt's outcome, placement, agent


@dataclass(frozen=True)
class EnvironmentSpec:
    """`--env`: bwrap, docker (rl360's, over Harbor's), a Harbor environment type, or module.path:Class."""

    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    placement_kwarg: str | None = None

    @classmethod
    def parse(
        cls, spec: str, kwargs: dict[str, Any] | None = None, placement_kwarg: str | None = None
    ) -> EnvironmentSpec:
        if spec in choice.IMPORT_PATHS:
            return cls(spec, dict(kwargs or {}), placement_kwarg or "node_label")
        if ":" not in spec and spec not in {t.value for t in EnvironmentType}:
            raise ValueError(
                f"--env must be bwrap, a Harbor environment type or module.path:Class, got {spec!r}"
            )
        return cls(spec, dict(kwargs or {}), placement_kwarg)

    def config(self, reservation: Reservation, placement: Placement) -> EnvironmentConfig:
        kwargs = dict(self.kwargs)
        if self.placement_kwarg:
            kwargs[self.placement_kwarg] = placement.node_label
        target: dict[str, Any]
        if self.name in choice.IMPORT_PATHS:
            target = {"import_path": choice.IMPORT_PATHS[self.name]}
        elif ":" in self.name:
            target = {"import_path": self.name}
        else:
            target = {"type": EnvironmentType(self.name)}
        return EnvironmentConfig(
            **target,
            kwargs=kwargs,
            override_cpus=reservation.cpus,
            override_memory_mb=reservation.memory_mb,
            delete=True,
        )


@dataclass
class RunRequest:
    """A validated /run request (the HTTP schema lives in rl360_ext.harbor.app)."""

    task: str
    deadline_s: float
    base_url: str | None = None
    model: str | None = None
    sampling_params: dict[str, Any] = field(default_factory=dict)
    session_id: str | None = None
    session_server_instance_id: str | None = None
    max_seq_len: int | None = None
    agent: str | None = None
    agent_kwargs: dict[str, Any] = field(default_factory=dict)


class TrialRunner:
    """Runs /run attempts. `start_gate` replaces the server's own rolling-start gate (a Harbor pool
    passes one that takes slots from the pool-wide limiter)."""

    def __init__(self, settings: HarborServerConfig, start_gate: Gate | None = None) -> None:
        """Raises ValueError (naming the flag) or FileNotFoundError for settings it cannot run."""
        self.settings = settings
        self.environment = EnvironmentSpec.parse(
            settings.env, settings.parse_env_kwargs(), settings.placement_kwarg
        )
        self.agents = agents.AgentTable(settings.agent, settings.default_agent)
        self.budget = settings.budget
        self.catalog = TaskCatalog(
            settings.tasks_root,
            settings.default_reservation,
            SnapshotStore(settings.trials_dir),
            settings.allow_env,
        )
        self._trial_class = catalog_trial(self.catalog)
        rule = AttributionRule(settings.attribution)
        audited = controls.read_task_health(settings.task_health) if settings.task_health else {}
        self.controls = controls.KnownGoodControls(rule, audited, settings.max_controls)
        self._error_policy = _LISTED_ERROR_POLICY if rule == AttributionRule.LIST else _EVIDENCE_ERROR_POLICY
        self.metrics = RunMetrics()
        pacing = gate = None
        if settings.rolling_start_size is not None:
            pacing = RollingStart(settings.rolling_start_size, settings.rolling_start_interval)
            gate = RollingStart(settings.rolling_start_size, settings.rolling_start_interval)
            gate.on_wave_closed = self.metrics.starts_per_wave.observe
        self.start_gate: Gate | None = start_gate or (StartGate(gate) if gate is not None else None)
        self.admission = Admission(settings.max_concurrent, pacing, settings.capacity)
        self.admission.on_change = self._on_admission_change
        self.pinning = ImagePinning(settings.node_labels)
        self.peak_running = 0
        self.shutting_down = False
        self._inflight: dict[str, set[asyncio.Task[_Worked]]] = defaultdict(set)
        choice.check_server_options(self.environment.name, self.environment.kwargs)
        settings.trials_dir.mkdir(parents=True, exist_ok=True)
        self.cleaned_at_start = self._clean_stale()

    def _clean_stale(self) -> list[str]:
        """What a killed server (SIGKILL: no teardown) left of its sandboxes and cgroups."""
        removed = choice.clean_stale(self.environment.name, self.environment.kwargs)
        if removed:
            _log.warning(
                "removed %d sandbox leftovers of a server that is gone: %s", len(removed), removed[:10]
            )
        return removed

    def _on_admission_change(self) -> None:
        self.peak_running = max(self.peak_running, self.admission.running)
        self.metrics.observe_admission(self.admission.queue_depth, self.admission.running)

    def health(self) -> dict[str, Any]:
        settings = self.settings
        return {
            "status": "ok",
            "running": self.admission.running,
            "queue_depth": self.admission.queue_depth,
            "peak_running": self.peak_running,
            "max_concurrent": settings.max_concurrent,
            "rolling_start": {
                "size": settings.rolling_start_size,
                "interval_s": settings.rolling_start_interval,
            },
            "reserved": asdict(self.admission.reserved()),
            "capacity": asdict(settings.capacity) if settings.capacity is not None else None,
            "in_flight": {key or "-": len(tasks) for key, tasks in self._inflight.items() if tasks},
            "environment": self.environment.name,
            "agent": self.agents.default,
            "agents": self.agents.names,
            "shutting_down": self.shutting_down,
            "leftovers_removed_at_start": len(self.cleaned_at_start),
            "warm_sandboxes": warm.counts(),
            "attribution": {"rule": self.controls.rule.value, **self.controls.counts},
            "node_labels": list(settings.node_labels),
            "tasks_root": str(self.catalog.root),
        }

    # -- validation -----------------------------------------------------------------------------

    async def _check(self, request: RunRequest) -> tuple[TaskInfo, agents.AgentEntry]:
        """The task (its snapshot, taken off the event loop) and agent of a request; raises a
        HarborRequestError naming the bad field."""
        deadline, largest = request.deadline_s, self.settings.max_deadline_s
        if not math.isfinite(deadline) or not 0 < deadline <= largest:
            raise FieldInvalid(
                "deadline_s", f"deadline_s must be > 0 and <= {largest:g} seconds, got {deadline!r}"
            )
        loading = asyncio.ensure_future(asyncio.to_thread(self.catalog.load, request.task))
        try:
            task = await asyncio.shield(loading)
        except asyncio.CancelledError:  # the snapshot being taken is removed once it is done
            loading.add_done_callback(self._release_loaded)
            raise
        try:
            return task, self._check_agent(request)
        except BaseException:
            self.catalog.release(task)
            raise

    def _release_loaded(self, loading: asyncio.Future[TaskInfo]) -> None:
        if not loading.cancelled() and loading.exception() is None:
            self.catalog.release(loading.result())

    def _check_agent(self, request: RunRequest) -> agents.AgentEntry:
        entry = self.agents.get(request.agent)
        if entry is None:
            raise AgentNotAllowed(
                "agent",
                f"agent {request.agent!r} is not one this server runs ({', '.join(self.agents.names)})",
            )
        if reserved := agents.reserved_kwargs(request.agent_kwargs):
            raise AgentKwargReserved(
                "agent_kwargs", f"agent_kwargs may not set {', '.join(reserved)}: Harbor sets them itself"
            )
        if entry.needs_model:
            for name in ("base_url", "model"):
                if not getattr(request, name):
                    raise FieldInvalid(name, f"{name} is required for agent {entry.name!r}")
        return entry

    # -- running --------------------------------------------------------------------------------

    async def run(self, request: RunRequest) -> dict[str, Any]:
        """Run one attempt; raises a HarborRequestError for bad input, otherwise always returns a
        response (a cancelled attempt answers `failure_cause: cancelled`). The attempt is in flight,
        so `flush` and `shutdown` cancel it, from the moment it is received: also while its task
        is still loading."""
        if self.shutting_down:
            raise ServerShuttingDown("task", "the server is shutting down and takes no new attempts")
        received, received_at = time.monotonic(), time.time()
        work = asyncio.create_task(self._work(request, received))
        key = request.session_server_instance_id or ""
        self._inflight[key].add(work)
        try:
            result, placement, agent = await asyncio.shield(work)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():  # our caller went away
                work.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(asyncio.shield(work), timeout=FLUSH_WAIT_S)
                raise
            # flushed before it began to run
            result, placement, agent = self._unstarted(request, received, "it waited to begin")
        finally:
            self._inflight[key].discard(work)
            if not self._inflight[key]:
                self._inflight.pop(key, None)
        result.phase_timings["total"] = time.monotonic() - received
        result.timeline.update(received_at=received_at, finished_at=time.time())
        self.metrics.observe_outcome(result.failure_cause, result.reward_source, result.phase_timings)
        return {
            **result.as_dict(),
            "placement": None
            if placement is None
            else {"node_label": placement.node_label, "image_group": placement.image_group},
            "task": request.task,
            "agent": agent,
            "session_id": request.session_id,
            "session_server_instance_id": request.session_server_instance_id,
        }

    async def _work(self, request: RunRequest, received: float) -> _Worked:
        """Load and check the request, then run the attempt: its outcome, placement and agent.
        Cancelled before the attempt started (a flush or shutdown while the task loaded), it is
        `cancelled` with no placement; no sandbox was started."""
        if self.shutting_down:  # received before shutdown began, not begun before it
            return self._unstarted(request, received, "it waited to begin")
        try:
            task, spec = await self._check(request)
        except asyncio.CancelledError:
            _uncancel()
            return self._unstarted(request, received, "its task was loading")
        if self.shutting_down:  # loaded after shutdown's flush took its list
            self._release_off_loop(task)
            return self._unstarted(request, received, "its task had just loaded")
        try:
            placement = self.pinning.place(task.image_group)
        except BaseException:
            self._release_off_loop(task)
            raise
        try:
            result = await self._attempt(request, task, spec, placement, received)
        finally:  # its snapshot lives as long as the attempt
            self._release_off_loop(task)
        return result, placement, spec.name

    def _release_off_loop(self, task: TaskInfo) -> None:
        asyncio.get_running_loop().run_in_executor(None, self.catalog.release, task)

    def _unstarted(self, request: RunRequest, received: float, when: str) -> _Worked:
        failure = outcome.failure(Cause.CANCELLED, message=f"flushed or shut down while {when}")
        return self._with_queue(failure, received), None, request.agent or self.agents.default

    async def _attempt(
        self,
        request: RunRequest,
        task: TaskInfo,
        spec: agents.AgentEntry,
        placement: Placement,
        received: float,
    ) -> outcome.Outcome:
        policy = self.budget
        wait_s = budget.max_queue_s(policy, request.deadline_s, task.environment_setup_s, task.verifier_s)
        wait_s -= time.monotonic() - received
        if wait_s < 0:
            return self._insufficient(request, task, time.monotonic() - received)
        try:
            ticket = await self.admission.acquire(task.reservation, timeout_s=wait_s)
        except TimeoutError:
            return self._insufficient(request, task, time.monotonic() - received)
        except AdmissionRefused as exc:
            return outcome.failure(Cause.INSUFFICIENT_CAPACITY, exc)
        except asyncio.CancelledError:
            _uncancel()
            return self._with_queue(
                outcome.failure(Cause.CANCELLED, message="flushed while queued"), received
            )
        admitted_at = time.time()
        try:
            queue_s = time.monotonic() - received
            plan = budget.plan(
                policy, request.deadline_s, queue_s, task.environment_setup_s, task.verifier_s, task.agent_s
            )
            if plan.agent_s is None:
                return self._insufficient(request, task, queue_s)
            result = await self._run_trial(request, task, spec, placement, plan, plan.agent_s)
            result.phase_timings["queue"] = queue_s
            result.timeline["admitted_at"] = admitted_at
            return result
        finally:
            self.admission.release(ticket)

    def _insufficient(self, request: RunRequest, task: TaskInfo, queue_s: float) -> outcome.Outcome:
        policy = self.budget
        needed = budget.fixed_cost_s(policy, task.environment_setup_s, task.verifier_s) + policy.min_agent_s
        message = (
            f"deadline {request.deadline_s:.1f}s minus {queue_s:.1f}s queued leaves less than the "
            f"{needed:.1f}s this task needs (setup, verifier, margin and a "
            f"{policy.min_agent_s:.1f}s agent floor); no sandbox was started"
        )
        result = outcome.failure(Cause.INSUFFICIENT_BUDGET, message=message)
        result.phase_timings["queue"] = queue_s
        return result

    @staticmethod
    def _with_queue(result: outcome.Outcome, received: float) -> outcome.Outcome:
        result.phase_timings["queue"] = time.monotonic() - received
        return result

    def _trial_config(
        self,
        request: RunRequest,
        task: TaskInfo,
        spec: agents.AgentEntry,
        placement: Placement,
        plan: budget.TrialBudget,
        agent_s: float,
    ) -> TrialConfig:
        settings = agents.AgentModelConfig(
            request.base_url, request.model, request.sampling_params, request.max_seq_len
        )
        agent = agents.agent_config(
            spec,
            settings,
            self.settings.max_turns,
            request.agent_kwargs,
            agent_s,
            plan.agent_setup_s,
        )
        short = uuid.uuid4().hex[:10]
        return TrialConfig(
            task=TaskConfig(path=task.path),
            trial_name=f"{task.path.name[:40]}__{short}",
            trials_dir=self.settings.trials_dir,
            agent=agent,
            environment=self.environment.config(task.reservation, placement),
            verifier=VerifierConfig(
                import_path=VERIFIER_IMPORT_PATH,
                override_timeout_sec=plan.verifier_s,
                kwargs={"reward_min": self.settings.reward_min, "reward_max": self.settings.reward_max},
            ),
            environment_build_timeout_multiplier=plan.environment_setup_s
            / max(task.environment_setup_s, 1e-9),
            override_error_policy=self._error_policy,
        )

    async def _run_trial(
        self,
        request: RunRequest,
        task: TaskInfo,
        spec: agents.AgentEntry,
        placement: Placement,
        plan: budget.TrialBudget,
        agent_s: float,
    ) -> outcome.Outcome:
        try:
            config = self._trial_config(request, task, spec, placement, plan, agent_s)
        except ValueError as exc:
            return outcome.failure(Cause.HARBOR_INTERNAL_ERROR, exc)
        trial_dir = config.trials_dir / config.trial_name
        hard_stop = max(0.0, request.deadline_s - plan.queue_s - plan.margin_s / 2)
        trial: Trial | None = None
        slot: dict[str, float] = {}
        scope = asyncio.timeout(hard_stop)
        try:
            async with scope:
                trial = await self._trial_class.create(config)
                trial.add_hook(TrialEvent.ENVIRONMENT_START, self._sandbox_start_hook(slot))
                _end_phases(trial)
                finished = await trial.run()
                facts = self._facts(task, trial, finished, trial_dir, self.controls.rule)
                if needs_known_good(facts):
                    left = (scope.when() or 0.0) - asyncio.get_running_loop().time() - plan.margin_s / 4
                    known = await self.controls.known_good(task, functools.partial(self._control, task), left)
                    facts = dataclasses.replace(facts, known_good=known)
                result = outcome.classify(finished, trial_dir, facts=facts)
        except TimeoutError as exc:
            if not scope.expired():
                result = outcome.failure(Cause.HARBOR_INTERNAL_ERROR, exc)
            else:
                result = self._from_trial(trial, trial_dir, Cause.DEADLINE_EXCEEDED)
                result.exception_message = (
                    f"the trial ran past the client's deadline ({request.deadline_s:.1f}s)"
                )
        except asyncio.CancelledError:
            _uncancel()
            result = self._from_trial(trial, trial_dir, Cause.CANCELLED)
        except Exception as exc:
            _log.exception("trial %s failed outside Harbor's error handling", config.trial_name)
            result = outcome.failure(Cause.HARBOR_INTERNAL_ERROR, exc)
        result.trial_name = config.trial_name
        result.timeline.update(slot)
        await self._tidy(trial_dir, result)
        return result

    def _facts(
        self, task: TaskInfo, trial: Trial, finished: Any, trial_dir: Path, rule: AttributionRule
    ) -> TrialFacts:
        floor = task.floor_reward if task.floor_reward is not None else self.settings.floor_reward
        return outcome.trial_facts(
            finished,
            trial_dir,
            self.settings.reward_range,
            limit_hits=outcome.limit_hits(trial),
            rule=rule,
            floor_reward=floor,
        )

    async def _control(self, task: TaskInfo) -> KnownGood:
        """A control regrade: Harbor's oracle on `task` in a fresh sandbox, then its verifier, judged
        on what the trial left (`controls.known_good_of`). It holds a snapshot of its own (the
        attempt that asked may end first); a task whose tree changed since is no evidence."""
        loaded = await asyncio.to_thread(self.catalog.load, task.name)
        try:
            if loaded.digest != task.digest:
                return KnownGood(None, Control.REGRADE, "the task changed before its control could run")
            return await self._control_trial(loaded)
        finally:
            await asyncio.to_thread(self.catalog.release, loaded)

    async def _control_trial(self, task: TaskInfo) -> KnownGood:
        policy = self.budget
        agent_s = task.agent_s if task.agent_s is not None else CONTROL_AGENT_S
        deadline_s = budget.fixed_cost_s(policy, task.environment_setup_s, task.verifier_s) + agent_s
        plan = budget.plan(policy, deadline_s, 0.0, task.environment_setup_s, task.verifier_s, task.agent_s)
        request = RunRequest(task=task.name, deadline_s=deadline_s)
        placement = self.pinning.place(task.image_group)
        config = self._trial_config(request, task, ORACLE, placement, plan, agent_s)
        config.trial_name = "control__" + config.trial_name
        trial_dir = config.trials_dir / config.trial_name
        try:
            trial = await self._trial_class.create(config)
            _end_phases(trial)
            async with asyncio.timeout(deadline_s):
                finished = await trial.run()
            return controls.known_good_of(self._facts(task, trial, finished, trial_dir, AttributionRule.LIST))
        finally:
            await asyncio.to_thread(shutil.rmtree, trial_dir, ignore_errors=True)

    def _sandbox_start_hook(self, slot: dict[str, float]) -> Any:
        """A hook for Harbor's sandbox start: hold the rolling-start limit exactly, count the
        start, and keep the start slot's time (unix seconds) in `slot["start_slot_at"]`."""

        async def on_sandbox_start(event: TrialHookEvent) -> None:
            if self.start_gate is not None:
                slot["start_slot_at"] = await self.start_gate.wait_turn()
            self.metrics.sandbox_starts.inc()

        return on_sandbox_start

    def _from_trial(self, trial: Trial | None, trial_dir: Path, cause: str) -> outcome.Outcome:
        """A failure with whatever phase timings the interrupted trial recorded."""
        result = outcome.failure(cause)
        if trial is not None:
            with contextlib.suppress(RuntimeError):
                recorded = outcome.classify(trial.result, trial_dir, self.settings.reward_range)
                result.phase_timings, result.agent_metrics = recorded.phase_timings, recorded.agent_metrics
                result.timeline = recorded.timeline
        return result

    async def _tidy(self, trial_dir: Path, result: outcome.Outcome) -> None:
        """Remove the trial's directory unless --keep-trials keeps it: off the event loop (every
        attempt shares it), and done before the attempt answers. The trial has ended: a flush
        that comes now does not turn its outcome into "cancelled"."""
        keep = self.settings.keep_trials
        if keep == "all" or (keep == "failed" and result.reward_source is None):
            return
        removing = asyncio.ensure_future(asyncio.to_thread(shutil.rmtree, trial_dir, ignore_errors=True))
        while not removing.done():
            try:
                await asyncio.shield(removing)
            except asyncio.CancelledError:
                _uncancel()

    # -- flush ----------------------------------------------------------------------------------

    async def flush(self, instance_id: str) -> dict[str, Any]:
        """Cancel every queued or running attempt of this session server instance and wait until
        their sandboxes are stopped (bounded)."""
        attempts = list(self._inflight.get(instance_id, ()))
        for attempt in attempts:
            attempt.cancel()
        done, pending = await asyncio.wait(attempts, timeout=FLUSH_WAIT_S) if attempts else (set(), set())
        self.metrics.flushed.inc(len(attempts))
        return {
            "session_server_instance_id": instance_id,
            "cancelled": len(attempts),
            "finished": len(done),
            "still_stopping": len(pending),
        }

    async def flush_all(self) -> None:
        """Cancel everything in flight, concurrently across instances."""
        await asyncio.gather(*(self.flush(instance_id) for instance_id in list(self._inflight)))

    async def shutdown(self) -> None:
        """Refuse new attempts, cancel every queued or running one (each answers `failure_cause:
        cancelled`) and every control regrade, wait (bounded) until their sandboxes are stopped, and
        discard the warm ones."""
        self.shutting_down = True
        await self.flush_all()
        await self.controls.close()
        await warm.close()
        self.catalog.snapshots.close()


def _end_phases(trial: Trial) -> None:
    """Hooks that end each phase of `trial` in its environment: the agent's, then grading's."""
    trial.add_hook(TrialEvent.AGENT_END, _phase_ender(trial))
    trial.add_hook(TrialEvent.VERIFICATION_START, _phase_ender(trial, *GRADING_CLEARS, grading=True))


def _phase_ender(trial: Trial, *clear: str, grading: bool = False) -> Any:
    """A hook that has the trial's environment kill what the last phase left running and empty
    the sandbox directories `clear` (and, before `grading`, its own HOME and tmp)."""

    async def end_phase(event: TrialHookEvent) -> None:
        environment = getattr(trial, "agent_environment", None)
        ender = getattr(environment, "end_phase", None)
        if ender is not None:
            await ender(clear, grading=grading)

    return end_phase


def catalog_trial(catalog: TaskCatalog) -> type[Trial]:
    """Harbor's `Trial` whose `create` takes the task from `catalog.harbor_task` (parsed once per
    snapshot, shared by the trials of a group) instead of parsing task.toml again for every trial.
    Never instantiated: `create` still builds Harbor's own trial class around the task. A trial
    config that asks for extra instructions or no verification is loaded by Harbor itself."""

    async def load_task(config: TrialConfig) -> tuple[Task, TaskDownloadResult]:
        path = config.task.path
        extras = config.extra_instruction_paths or config.extra_instructions
        if path is None or extras or config.verifier.disable:
            return await Trial._load_task(config)
        return catalog.harbor_task(path), TaskDownloadResult(path=path, download_time_sec=0.0, cached=True)

    return type("CatalogTrial", (Trial,), {"_load_task": staticmethod(load_task)})


def _uncancel() -> None:
    """We turn a cancellation into a "cancelled" outcome; tell asyncio it was handled."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
