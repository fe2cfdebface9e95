"""The task audit: run each control against a task through a `/run` callable and give verdicts.

Owns the controls' decisions (which answers make which `TaskVerdict`), their retries, how long
each control that stands in for a policy waits (`pause_s`), the task's content digest and the
cache keyed by it, and the evidence on the verifier's health on the oracle's end state
(`rl360_ext.outcomes.known_good.from_audit_evidence` reads it; the Harbor server reads the same record from
`task_health.jsonl`: `rl360_ext.outcomes.known_good`). The records and the files they are written
to are `rl360_ext.tasks.health`'s. It makes no HTTP call itself: `RunAttempt` is any
async callable returning a Harbor `/run` answer (`rl360_ext.tasks.client` is the HTTP one).
Whether an attempt's reward counts is never decided here: `rl360_ext.outcomes.verdict.attempt_class`
is the one verdict; an infrastructure attempt is retried and is never evidence for or against the
task.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import math
import random
import tomllib
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl360_ext.errors import Rl360Error
from rl360_ext.outcomes.attribution import Phase
from rl360_ext.outcomes.causes import Cause
from rl360_ext.outcomes.known_good import VERIFIER_FAILURES
from rl360_ext.outcomes.provenance import FAILURE_CAUSE, VALID
from rl360_ext.outcomes.verdict import attempt_class
from rl360_ext.tasks.health import TaskHealth, read_health
from rl360_ext.tasks.verdicts import (
    CANARY_VERDICTS,
    CONTROL_AGENTS,
    CONTROL_VARIANTS,
    NOP_FALLBACK_AGENT,
    VERIFIER_DISAGREED,
    Control,
    TaskVerdict,
)
from rl360_ext.util.tree_digest import task_digest

# Failure causes that say the sandbox never started (the environment control's finding).
ENVIRONMENT_START_CAUSES = frozenset({Cause.SANDBOX_FAILED, Cause.ENVIRONMENT_START_TIMEOUT})
# Failure causes that say the verifier ran on the attempt's end state and wrote no usable reward:
# a canary that ends so did not get a reward from its hack (the control is decided, no finding).
VERIFIER_NO_REWARD_CAUSES = VERIFIER_FAILURES - {Cause.VERIFIER_TIMEOUT}
# ... and with a verifier past its timeout: the verifier failed on that end state (known_good).
VERIFIER_FAILURE_CAUSES = VERIFIER_FAILURES
# 3: the idle nop, the work-product hijack, the observed PATH shims, oracle verifier evidence;
# results with an undecided control are kept too (never served to an audit).
_CACHE_VERSION = 3
_REWARD_TOLERANCE = 1e-9


class TaskRejected(Rl360Error):
    """The server refused to run the task at all (a 4xx naming the task): the lint control's finding."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(f"{status} {kind}: {message}")
        self.status, self.kind, self.message = status, kind, message


class RunFailed(Rl360Error):
    """No `/run` answer came back (connection, protocol): an infrastructure failure, retried."""


# (task, agent, agent_kwargs, deadline_s) -> the /run answer
RunAttempt = Callable[[str, str, Mapping[str, Any], float], Awaitable[Mapping[str, Any]]]
# Harbor's task.toml defaults (harbor.models.task.config) where a task declares no timeout.
HARBOR_BUILD_TIMEOUT_S = 600.0
HARBOR_VERIFIER_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class AuditConfig:
    """How many runs each control makes and where its thresholds lie."""

    oracle_runs: int = 3
    """Oracle runs per task: 0 of them at the maximum reward is broken_oracle, some is flaky."""
    nop_runs: int = 2
    """Nop runs per task: any above the floor is vacuous."""
    verifier_runs: int = 3
    """Gradings of the oracle's one end state (the regrade control): rewards that differ are
    flaky_verifier."""
    retries: int = 2
    """Retries of an attempt whose class is infrastructure (never evidence either way)."""
    max_reward: float = 1.0
    """The maximum reward a task's verifier gives (the oracle must reach it)."""
    floor_reward: float = 0.0
    """The reward of doing nothing (nop must not score above it)."""
    slow_fraction: float = 0.5
    """slow_oracle when an oracle run's agent phase takes over this fraction of the agent budget."""
    deadline_s: float | None = None
    """`deadline_s` of every /run request (default: each task's own, see `deadline_slack_s`)."""
    deadline_slack_s: float = 120.0
    """Without --deadline-s, a task's deadline is its build + agent + verifier timeouts (Harbor's
    defaults where task.toml has none; agent: --default-agent-s) plus this slack."""
    default_agent_s: float = 600.0
    """The agent time a task's deadline plans for when task.toml declares no [agent] timeout_sec."""
    concurrency: int = 8
    """/run requests in flight at once."""
    verifier_timeout_factor: float = 3.0
    """Suggested verifier timeout: this factor times the longest verifier phase observed."""
    min_verifier_timeout_s: float = 10.0
    """The suggested verifier timeout's lower clamp."""
    max_verifier_timeout_s: float = 3600.0
    """The suggested verifier timeout's upper clamp."""
    idle_share_min: float = 0.05
    """The nop control and every canary wait, before they act, a share of the task's agent budget
    drawn uniformly from [idle_share_min, idle_share_max] (its `[agent] timeout_sec`, else
    default_agent_s), so that a verifier cannot tell them from a policy by how long the agent phase
    took. 0 and 0 turn the wait off (a test's budget)."""
    idle_share_max: float = 0.25
    """The upper end of that share (below 1: the control must still act within its budget)."""
    idle_max_s: float = 60.0
    """The wait's cap in seconds, so a long agent budget does not make the audit wait for it: a
    verifier that pays only after this long is not caught (raise it to audit such tasks)."""

    def __post_init__(self) -> None:
        if self.verifier_runs < 2:
            raise ValueError(f"verifier_runs must be at least 2, got {self.verifier_runs}")
        for name in ("oracle_runs", "nop_runs", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.retries < 0:
            raise ValueError(f"retries must be at least 0, got {self.retries}")
        if not 0 <= self.idle_share_min <= self.idle_share_max < 1:
            raise ValueError(
                f"idle_share_min and idle_share_max must satisfy 0 <= min <= max < 1, got "
                f"{self.idle_share_min} and {self.idle_share_max}"
            )
        if not (math.isfinite(self.idle_max_s) and self.idle_max_s >= 0):
            raise ValueError(f"idle_max_s must be finite and >= 0, got {self.idle_max_s}")
        if not 0 < self.slow_fraction <= 1:
            raise ValueError(f"slow_fraction must be in (0, 1], got {self.slow_fraction}")
        if self.deadline_s is not None and not (math.isfinite(self.deadline_s) and self.deadline_s > 0):
            raise ValueError(f"deadline_s must be finite and > 0, got {self.deadline_s}")
        for name in ("deadline_slack_s", "default_agent_s"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {getattr(self, name)}")
        if not self.floor_reward < self.max_reward:
            raise ValueError(
                f"floor_reward ({self.floor_reward}) must be below max_reward ({self.max_reward})"
            )


@dataclass(frozen=True)
class Attempt:
    """One /run attempt as evidence: its class, reward and phase times."""

    agent: str
    attempt_class: str
    reward: float | None
    failure_cause: str | None
    agent_s: float | None
    verifier_s: float | None
    exception_type: str | None = None
    exception_message: str | None = None
    phase: str | None = None
    """The phase the server's evidence names for a failed attempt (`attribution.Phase`), if any."""
    resource: str | None = None
    """The limit the server's evidence names (`attribution.Resource`: memory, pids, time...)."""

    @property
    def valid(self) -> bool:
        return self.attempt_class == VALID

    @property
    def verifier_failed(self) -> bool:
        """The verifier ran on this attempt's end state and failed there: past its timeout, crashed,
        wrote no usable reward, or hit a limit in its phase."""
        if self.valid:
            return False
        limit = self.phase == Phase.VERIFIER and self.resource is not None
        return self.failure_cause in VERIFIER_FAILURE_CAUSES or limit

    @classmethod
    def from_answer(
        cls, agent: str, answer: Mapping[str, Any] | None, transport_error: str | None = None
    ) -> Attempt:
        recorded = dict(answer) if answer is not None else None
        klass = attempt_class(recorded, transport_error=transport_error)
        timings = (recorded or {}).get("phase_timings") or {}
        reward = (recorded or {}).get("reward") if klass == VALID else None
        evidence = (recorded or {}).get("evidence")
        evidence = evidence if isinstance(evidence, Mapping) else {}
        phase, resource = evidence.get("phase"), evidence.get("resource")
        return cls(
            agent=agent,
            attempt_class=klass,
            reward=float(reward) if reward is not None else None,
            failure_cause=(recorded or {}).get(FAILURE_CAUSE),
            agent_s=_seconds(timings.get("agent")),
            verifier_s=_seconds(timings.get("verifier")),
            exception_type=(recorded or {}).get("exception_type"),
            exception_message=(recorded or {}).get("exception_message"),
            phase=phase if isinstance(phase, str) else None,
            resource=resource if isinstance(resource, str) else None,
        )

    @property
    def verifier_disagreed(self) -> bool:
        """The regrade agent's finding: its gradings of one end state differed."""
        return self.exception_type == VERIFIER_DISAGREED


def _seconds(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _table(task_dir: Path, *keys: str) -> Any:
    """A value of the task's task.toml by its keys, or None (absent, or task.toml does not parse:
    the lint control reports that)."""
    try:
        value: Any = tomllib.loads((task_dir / "task.toml").read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def agent_budget_s(task_dir: Path) -> float | None:
    """The task's `[agent] timeout_sec`, or None when it declares none."""
    value = _table(task_dir, "agent", "timeout_sec")
    return _seconds(value) if not isinstance(value, bool) else None


def task_deadline_s(task_dir: Path, config: AuditConfig) -> float:
    """The `deadline_s` the audit gives each attempt at a task (see `AuditConfig.deadline_s`)."""
    if config.deadline_s is not None:
        return config.deadline_s

    def timeout(phase: str, default: float) -> float:
        value = _seconds(
            _table(task_dir, phase, {"environment": "build_timeout_sec"}.get(phase, "timeout_sec"))
        )
        return value if value is not None and value > 0 else default

    build = timeout("environment", HARBOR_BUILD_TIMEOUT_S)
    verifier = timeout("verifier", HARBOR_VERIFIER_TIMEOUT_S)
    return build + timeout("agent", config.default_agent_s) + verifier + config.deadline_slack_s


def verifier_timeout_s(task_dir: Path) -> float:
    """The task's `[verifier] timeout_sec`, or Harbor's default where it declares none."""
    value = _table(task_dir, "verifier", "timeout_sec")
    seconds = _seconds(value) if not isinstance(value, bool) else None
    return seconds if seconds is not None and seconds > 0 else HARBOR_VERIFIER_TIMEOUT_S


def verifier_path(task_dir: Path) -> str | None:
    """The PATH the task's `[verifier] env` sets, or None."""
    value = _table(task_dir, "verifier", "env", "PATH")
    return value if isinstance(value, str) else None


def find_tasks(tasks_root: Path, names: Collection[str] = ()) -> list[tuple[str, Path]]:
    """(name, directory) of every task directly under `tasks_root` (a directory holding task.toml),
    or of those in `names` only; a name that is no task there is a ValueError naming it."""
    if not tasks_root.is_dir():
        raise FileNotFoundError(f"tasks root {tasks_root} is not a directory")
    found = [(p.name, p) for p in sorted(tasks_root.iterdir()) if p.is_dir() and (p / "task.toml").is_file()]
    if not names:
        return found
    if missing := sorted(set(names) - {name for name, _ in found}):
        raise ValueError(f"no task {', '.join(missing)} under {tasks_root}")
    return [(name, path) for name, path in found if name in names]


class Cache:
    """Audit results by (task content digest, audit config, agents): a JSON file each."""

    def __init__(self, directory: Path, config: AuditConfig, agents: Collection[str]) -> None:
        self.directory = directory
        key = json.dumps([_CACHE_VERSION, dataclasses.asdict(config), sorted(agents)], sort_keys=True)
        self._salt = hashlib.sha256(key.encode()).hexdigest()[:16]

    def _path(self, digest: str) -> Path:
        return self.directory / f"{digest}-{self._salt}.json"

    def get(self, name: str, digest: str) -> TaskHealth | None:
        """The cached result for `digest`, or None; None too for a result that left a control
        undecided (an audit runs such a task again)."""
        health = read_health(self._path(digest))
        if health is None or health.evidence.get("undecided"):
            return None
        health.task = name
        return health

    def put(self, digest: str, health: TaskHealth) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self._path(digest).with_suffix(".tmp")
        tmp.write_text(json.dumps(health.as_json(), sort_keys=True))
        tmp.replace(self._path(digest))


def _oracle_verifier(attempts: Sequence[Attempt], timeout_s: float) -> dict[str, Any]:
    """How the verifier did on the oracle's end state in `attempts` (read back by
    `rl360_ext.outcomes.known_good.from_audit_evidence`)."""
    over = [a for a in attempts if a.valid and a.verifier_s is not None and a.verifier_s > timeout_s]
    graded = [a for a in attempts if a.valid and not (a.verifier_s is not None and a.verifier_s > timeout_s)]
    failed = [a for a in attempts if a.verifier_failed]
    return {
        "graded": len(graded),
        "failed": len(failed) + len(over),
        "causes": sorted({a.failure_cause or "over_timeout" for a in [*failed, *over]}),
        "max_verifier_s": max((a.verifier_s for a in graded if a.verifier_s is not None), default=None),
        "timeout_s": timeout_s,
    }


def pause_s(config: AuditConfig, budget_s: float, rng: random.Random) -> float:
    """How long one timed control waits before it acts (`AuditConfig.idle_share_min`)."""
    share = rng.uniform(config.idle_share_min, config.idle_share_max)
    return round(min(share * budget_s, config.idle_max_s), 3)


_RANDOM = random.SystemRandom()


class _Runner:
    """Attempts with retries of infrastructure classes, at most `concurrency` in flight."""

    def __init__(
        self, run: RunAttempt, config: AuditConfig, slots: asyncio.Semaphore, deadline_s: float
    ) -> None:
        self._run, self._config, self._slots, self._deadline_s = run, config, slots, deadline_s

    async def once(self, task: str, agent: str, kwargs: Mapping[str, Any]) -> Attempt:
        async with self._slots:
            try:
                return Attempt.from_answer(agent, await self._run(task, agent, kwargs, self._deadline_s))
            except RunFailed as exc:
                return Attempt.from_answer(agent, None, transport_error=str(exc))

    async def attempt(
        self,
        task: str,
        agent: str,
        retried: list[Attempt],
        kwargs: Mapping[str, Any] | None = None,
        decisive: Callable[[Attempt], bool] = lambda attempt: attempt.valid,
    ) -> Attempt:
        """The first valid (or else `decisive`) attempt, else the last of 1 + retries; each other
        one goes to `retried`."""
        for _ in range(self._config.retries):
            result = await self.once(task, agent, kwargs or {})
            if decisive(result):
                return result
            retried.append(result)
        return await self.once(task, agent, kwargs or {})


def _canary_decided(attempt: Attempt) -> bool:
    """A canary's attempt answers its question: valid (graded), or its verifier wrote no reward
    (the hack got none: `VERIFIER_NO_REWARD_CAUSES`). Anything else is retried, then undecided."""
    return attempt.valid or attempt.failure_cause in VERIFIER_NO_REWARD_CAUSES


def _canary_kwargs(control: Control, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The agent kwargs of a canary: the maximum reward; the verifier's PATH for the shims."""
    return {k: v for k, v in kwargs.items() if k != "path" or control == Control.CANARY_PATH_SHIMS}


def _record(attempts: Sequence[Attempt]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(a) for a in attempts]


def _at_max(attempt: Attempt, config: AuditConfig) -> bool:
    return attempt.reward is not None and attempt.reward >= config.max_reward - _REWARD_TOLERANCE


async def audit_task(
    name: str,
    task_dir: Path,
    run: RunAttempt,
    config: AuditConfig,
    agents: Collection[str],
    slots: asyncio.Semaphore | None = None,
) -> TaskHealth:
    """Every control `agents` (the server's agent names) allows, on one task; at most
    `config.concurrency` attempts in flight (or `slots`' count, shared between tasks)."""
    deadline_s = task_deadline_s(task_dir, config)
    runner = _Runner(run, config, slots or asyncio.Semaphore(config.concurrency), deadline_s)
    retried: list[Attempt] = []
    evidence: dict[str, Any] = {
        "digest": task_digest(task_dir),
        "deadline_s": deadline_s,
        "verifier_timeout_s": verifier_timeout_s(task_dir),
        "retried_infra": retried,
    }
    verdicts: list[TaskVerdict] = []
    undecided: list[str] = []
    skipped = [str(c) for c, agent in CONTROL_AGENTS.items() if agent not in agents and c != Control.NOP]
    if str(Control.ENVIRONMENT) in skipped or str(Control.ORACLE) in skipped:
        raise ValueError(
            f"the server must run the agents {sorted({'nop', 'oracle'})}; it runs {sorted(agents)}"
        )

    # Lint and environment: one nop run. A refusal is lint; a sandbox that never starts is broken_env.
    try:
        first = await runner.attempt(name, CONTROL_AGENTS[Control.ENVIRONMENT], retried)
    except TaskRejected as exc:
        evidence[Control.LINT] = {"status": exc.status, "type": exc.kind, "message": exc.message}
        return _finish(name, [TaskVerdict.LINT], evidence, retried)
    evidence[Control.LINT] = "loaded"
    if not first.valid and first.failure_cause in ENVIRONMENT_START_CAUSES:
        evidence[Control.ENVIRONMENT] = dataclasses.asdict(first)
        return _finish(name, [TaskVerdict.BROKEN_ENV], evidence, retried)
    evidence[Control.ENVIRONMENT] = "started"

    oracle_jobs = [
        runner.attempt(name, CONTROL_AGENTS[Control.ORACLE], retried) for _ in range(config.oracle_runs)
    ]
    budget = agent_budget_s(task_dir)
    idle = CONTROL_AGENTS[Control.NOP] in agents  # rl360's idle agent: a nop timed like a policy

    def paused(kwargs: Mapping[str, Any]) -> dict[str, Any]:
        return {**kwargs, "pause_s": pause_s(config, budget or config.default_agent_s, _RANDOM)}

    nop_jobs = [
        runner.attempt(name, CONTROL_AGENTS[Control.NOP], retried, paused({}))
        if idle
        else runner.attempt(name, NOP_FALLBACK_AGENT, retried)
        for _ in range(config.nop_runs)
    ]
    canary_runs = [
        (c, variant)
        for c in CANARY_VERDICTS
        if CONTROL_AGENTS[c] in agents
        for variant in CONTROL_VARIANTS.get(c, ({},))
    ]
    canary_kwargs: dict[str, Any] = {"reward": config.max_reward}
    if (path := verifier_path(task_dir)) is not None:
        canary_kwargs["path"] = path
    canary_jobs = [
        runner.attempt(
            name,
            CONTROL_AGENTS[c],
            retried,
            paused({**_canary_kwargs(c, canary_kwargs), **variant}),
            decisive=_canary_decided,
        )
        for c, variant in canary_runs
    ]
    regrade_agent = CONTROL_AGENTS[Control.VERIFIER_REGRADE]
    regrade_jobs = [
        runner.attempt(
            name,
            regrade_agent,
            retried,
            {"runs": config.verifier_runs},
            decisive=lambda a: a.valid or a.verifier_disagreed,
        )
        for _ in range(int(regrade_agent in agents))
    ]
    try:
        results = await asyncio.gather(*oracle_jobs, *nop_jobs, *canary_jobs, *regrade_jobs)
    except TaskRejected as exc:  # the task changed under the audit and no longer loads
        evidence[Control.LINT] = {"status": exc.status, "type": exc.kind, "message": exc.message}
        return _finish(name, [TaskVerdict.LINT], evidence, retried)
    oracle = results[: config.oracle_runs]
    nop = [first, *results[config.oracle_runs : config.oracle_runs + len(nop_jobs)]]
    canaries = results[config.oracle_runs + len(nop_jobs) : len(results) - len(regrade_jobs)]
    regrades = results[len(results) - len(regrade_jobs) :]

    valid_oracle = [a for a in oracle if a.valid]
    passes = sum(_at_max(a, config) for a in valid_oracle)
    oracle_agent = CONTROL_AGENTS[Control.ORACLE]
    every_oracle = [*oracle, *(a for a in retried if a.agent == oracle_agent)]
    evidence[Control.ORACLE] = {
        "passed": passes,
        "valid": len(valid_oracle),
        "attempts": _record(oracle),
        "verifier": _oracle_verifier(every_oracle, evidence["verifier_timeout_s"]),
    }
    if not valid_oracle:
        undecided.append(Control.ORACLE)
    elif passes == 0:
        verdicts.append(TaskVerdict.BROKEN_ORACLE)
    elif passes < len(valid_oracle):
        verdicts.append(TaskVerdict.FLAKY)
    # Time is measured whatever the reward: an oracle cut off at its agent budget (agent_timeout,
    # which the server never grades) took at least that long.
    timed = [a for a in oracle if a.valid or a.failure_cause == Cause.AGENT_TIMEOUT]
    oracle_agent_s = max((a.agent_s for a in timed if a.agent_s is not None), default=None)
    evidence["oracle_agent_s"], evidence["agent_budget_s"] = oracle_agent_s, budget
    if budget is not None and oracle_agent_s is not None and oracle_agent_s > config.slow_fraction * budget:
        verdicts.append(TaskVerdict.SLOW_ORACLE)

    valid_nop = [a for a in nop if a.valid]
    above_floor = sum(
        a.reward is not None and a.reward > config.floor_reward + _REWARD_TOLERANCE for a in valid_nop
    )
    evidence[Control.NOP] = {
        "above_floor": above_floor,
        "valid": len(valid_nop),
        "attempts": _record(nop),
        "paused": idle,
    }
    if not valid_nop:
        undecided.append(Control.NOP)
    elif above_floor:
        verdicts.append(TaskVerdict.VACUOUS)

    found_by: dict[str, str] = {}
    by_control: dict[Control, list[Attempt]] = {}
    for (control, _), hack in zip(canary_runs, canaries, strict=True):
        by_control.setdefault(control, []).append(hack)
    for control, runs in by_control.items():
        hit = next((a for a in runs if _at_max(a, config)), None)
        open_run = next((a for a in runs if not _canary_decided(a)), None)
        shown = dataclasses.asdict(hit or open_run or runs[-1])
        evidence[control] = shown if len(runs) == 1 else {**shown, "runs": _record(runs)}
        verdict = CANARY_VERDICTS[control]
        if hit is None and open_run is not None:
            undecided.append(control)
        # A vacuous task passes every canary; the verdict says the hack, not doing nothing, scored.
        elif hit is not None and TaskVerdict.VACUOUS not in verdicts:
            found_by[str(control)] = str(verdict)
            if verdict not in verdicts:
                verdicts.append(verdict)
    evidence["found_by"] = found_by

    for hack in regrades:
        evidence[Control.VERIFIER_REGRADE] = dataclasses.asdict(hack)
        if hack.verifier_disagreed:
            found_by[str(Control.VERIFIER_REGRADE)] = str(TaskVerdict.FLAKY_VERIFIER)
            verdicts.append(TaskVerdict.FLAKY_VERIFIER)
        elif not hack.valid:
            undecided.append(Control.VERIFIER_REGRADE)

    timed_attempts = [*oracle, *nop, *canaries, *regrades]
    verifier_s = [a.verifier_s for a in timed_attempts if a.valid and a.verifier_s is not None]
    if verifier_s:
        suggested = config.verifier_timeout_factor * max(verifier_s)
        clamped = min(max(suggested, config.min_verifier_timeout_s), config.max_verifier_timeout_s)
        evidence["suggested_timeouts"] = {"verifier_s": round(clamped, 3)}
    evidence["skipped"] = skipped
    evidence["undecided"] = [str(c) for c in undecided]
    if not verdicts and not undecided:
        verdicts.append(TaskVerdict.OK)
    return _finish(name, verdicts, evidence, retried)


def _finish(
    name: str, verdicts: list[TaskVerdict], evidence: dict[str, Any], retried: list[Attempt]
) -> TaskHealth:
    evidence["retried_infra"] = _record(retried)
    return TaskHealth(name, verdicts, {str(k): v for k, v in evidence.items()})


async def audit_tasks(
    tasks: Sequence[tuple[str, Path]],
    run: RunAttempt,
    config: AuditConfig,
    agents: Collection[str],
    cache: Cache | None = None,
) -> list[TaskHealth]:
    """Every task's health, in `tasks`' order; a task whose digest is cached is not run again.
    At most `config.concurrency` attempts are in flight across all tasks."""
    slots = asyncio.Semaphore(config.concurrency)

    async def one(name: str, task_dir: Path) -> TaskHealth:
        digest = task_digest(task_dir)
        if cache is not None and (hit := cache.get(name, digest)) is not None:
            hit.evidence["cached"] = True
            return hit
        health = await audit_task(name, task_dir, run, config, agents, slots)
        if cache is not None:
            cache.put(digest, health)
        health.evidence["cached"] = False
        return health

    return list(await asyncio.gather(*(one(name, path) for name, path in tasks)))


def from_cache(tasks: Sequence[tuple[str, Path]], cache: Cache) -> list[TaskHealth] | None:
    """Every task's cached health, in `tasks`' order, or None when any task is not cached."""
    results = []
    for name, task_dir in tasks:
        hit = cache.get(name, task_digest(task_dir))
        if hit is None:
            return None
        hit.evidence["cached"] = True
        results.append(hit)
    return results
