"""Task health across a training run: per-task accumulation, pass-rate drift and the live quarantine.

Owns `TaskTracker` (per task, over every step: attempts, valid attempts, passes, infrastructure
attempts, the always-pass / always-fail streaks of the steps it appeared in, the vacuous-verifier
signature count, the last `verifier_window` verifier durations, the early-training pass-rate
baseline and the recent window the drift test compares with it), the quarantine decision
(`quarantine_findings`, with `TrackerConfig`'s documented thresholds), and the two files it keeps
next to the audit's quarantine.json:
- `quarantine_live.json`: the tasks quarantined during training, in quarantine.json's format
  (`{"tasks": {NAME: {"verdicts", "undecided", "evidence", "rollout_id"}}}`), written atomically;
  the agent function (`rl360_ext.rollout.agent._quarantined`) honours it like the audit's file:
  an attempt on a listed task is not run and comes back masked (`infra:task_quarantined`), never
  scored 0. An operator clears a task by deleting its entry (or the file): the tracker then
  forgets the evidence that quarantined it, so only fresh evidence quarantines it again;
- `task_health_state.json`: the tracker's state, written atomically after each step and read
  when a process first tracks that directory, so a restarted run keeps its evidence. Each
  rollout id counts once: a step at or below the last one recorded (a run resumed from an earlier
  checkpoint replays its steps) adds nothing; the evidence is about the task, which does not rewind
  with the model.

Which hook (Miles 31f1ca96): the tracker runs in rl360's `--custom-rollout-log-function-path`
hook (`rl360_ext.rollout.metrics.log_rollout_metrics`, called once per step by
`miles/ray/rollout/metrics.py:72-75` `log_rollout_data`, from `miles/ray/rollout/
rollout_manager.py:156`), which sees every group the dynamic filter judged, before it dropped any
(the filter, `miles/rollout/sglang_rollout.py:463-499` `call_dynamic_filter`, sees one group at a
time and no step boundary); the masking happens in the agent function
(`--custom-agent-function-path`, awaited per attempt by
`miles/rollout/generate_hub/agentic_tool_call.py:75-80`), which sees every attempt whichever
generate function runs it. A data source (`--data-source-path`, `miles/ray/rollout/
rollout_manager.py:69`) could skip the task instead, but would change the dataset's order and epoch
accounting. Both hooks run in the RolloutManager process; the file keeps them apart anyway, so
the list survives a restart and an operator can read and edit it.

Memory: per task a fixed number of counters, at most `drift_window` pass flags and
`verifier_window` durations; at most `max_tasks` tasks (the least recently seen is forgotten
first; a quarantined task's entry stays in the live file regardless). Which attempts are valid is
`attempt_class` as recorded (`rl360_ext.outcomes`); what the vacuous signature is, is
`rl360_ext.tasks.signals`'.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import OrderedDict, deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from rl360_ext.outcomes.provenance import VALID
from rl360_ext.tasks.drift import DEFAULT_Z, above_ceiling, drift
from rl360_ext.tasks.signals import (
    MAX_NAMED,
    at_floor,
    p95,
    passed,
    vacuous_signature,
    valid_reward,
    verifier_seconds,
)
from rl360_ext.tasks.verdicts import TaskVerdict

LIVE_QUARANTINE_FILE = "quarantine_live.json"
STATE_FILE = "task_health_state.json"
_STATE_VERSION = 1
_log = logging.getLogger(__name__)


def _doc(help: str, default: Any) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class TrackerConfig:
    """The training-time tracker's thresholds (flags `--rl360-<field>`, or `RL360_<FIELD>`)."""

    quarantine_vacuous_attempts: int = _doc(
        "Quarantine a task (verdict vacuous) once this many of its valid attempts carried the "
        "vacuous-verifier signature (a reward above the floor from an attempt that ended in an "
        "exception); 0: never.",
        3,
    )
    """K: vacuous once K attempts scored above the floor although they ended in an exception."""
    quarantine_verifier_timeout_frac: float = _doc(
        "Quarantine a task (verdict slow_verifier) once the p95 of its last verifier durations is at "
        "or over this fraction of its verifier timeout (from the audit's task_health.jsonl); 0: never.",
        0.95,
    )
    """The p95 over this fraction of the timeout: over 5% of gradings ran into the timeout."""
    quarantine_min_verifier_runs: int = _doc(
        "Verifier durations a task needs before its p95 can quarantine it.", 8
    )
    """The slow-verifier rule needs at least this many timed gradings."""
    verifier_window: int = _doc("Verifier durations kept per task (the most recent).", 64)
    """The p95 is over at most this many of a task's most recent verifier durations."""
    drift_baseline_attempts: int = _doc(
        "Valid attempts of a task that form its pass-rate baseline (its first ones in the run).", 16
    )
    """The baseline: a task's first valid attempts in the run."""
    drift_window: int = _doc(
        "Recent valid attempts of a task compared with its baseline by the drift test.", 16
    )
    """The drift test compares this many most recent valid attempts (after the baseline) with it."""
    drift_z: float = _doc("z of the Wilson intervals of the drift and oracle-ceiling tests.", DEFAULT_Z)
    """2.576: disjoint two-sided 99% intervals."""
    streak_steps: int = _doc(
        "Consecutive steps a task's attempts all pass (or all fail) before it counts in "
        "tasks/always_pass_streak_tasks (tasks/always_fail_streak_tasks).",
        3,
    )
    """Streaks are reported, never a quarantine: a solved or unsolved task is not a broken one."""
    max_tasks: int = _doc("Tasks the tracker keeps (the least recently seen are forgotten first).", 100_000)
    """The memory bound: tasks beyond it are forgotten, least recently seen first."""

    def __post_init__(self) -> None:
        if self.quarantine_vacuous_attempts < 0:
            raise ValueError(
                f"quarantine_vacuous_attempts must be >= 0, got {self.quarantine_vacuous_attempts}"
            )
        for name in (
            "quarantine_min_verifier_runs",
            "verifier_window",
            "drift_baseline_attempts",
            "drift_window",
            "streak_steps",
            "max_tasks",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.quarantine_min_verifier_runs > self.verifier_window:
            raise ValueError(
                f"quarantine_min_verifier_runs ({self.quarantine_min_verifier_runs}) must be at most "
                f"verifier_window ({self.verifier_window})"
            )
        frac = self.quarantine_verifier_timeout_frac
        if not (math.isfinite(frac) and frac >= 0):
            raise ValueError(f"quarantine_verifier_timeout_frac must be finite and >= 0, got {frac}")
        if not (math.isfinite(self.drift_z) and self.drift_z > 0):
            raise ValueError(f"drift_z must be finite and > 0, got {self.drift_z}")


@dataclass
class TaskRecord:
    """One task's accumulated evidence (constant size: the two windows are bounded)."""

    attempts: int = 0
    valid: int = 0
    passes: int = 0
    infra: int = 0
    vacuous_signature: int = 0
    base_n: int = 0
    base_passes: int = 0
    recent: deque[bool] = field(default_factory=deque)
    verifier_s: deque[float] = field(default_factory=deque)
    pass_streak: int = 0
    fail_streak: int = 0
    first_step: int | None = None
    last_step: int | None = None

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["recent"], data["verifier_s"] = [int(p) for p in self.recent], list(self.verifier_s)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any], config: TrackerConfig) -> TaskRecord:
        known = {f.name for f in fields(cls)}
        record = cls(**{k: v for k, v in data.items() if k in known and k not in ("recent", "verifier_s")})
        record.recent = deque((bool(p) for p in data.get("recent", ())), maxlen=config.drift_window)
        record.verifier_s = deque(
            (float(s) for s in data.get("verifier_s", ())), maxlen=config.verifier_window
        )
        return record

    def recent_passes(self) -> int:
        return sum(self.recent)

    def forget_findings(self) -> None:
        """After an operator cleared the task's quarantine: only new evidence may quarantine it."""
        self.vacuous_signature = 0
        self.verifier_s.clear()


def quarantine_findings(
    record: TaskRecord, verifier_timeout_s: float | None, config: TrackerConfig
) -> dict[str, dict[str, Any]]:
    """The verdicts (with their evidence) a task's accumulated record earns; {} for none.

    - `vacuous`: at least `quarantine_vacuous_attempts` (> 0) attempts with the signature;
    - `slow_verifier`: at least `quarantine_min_verifier_runs` timed gradings, and the p95 of the
      kept ones at or over `quarantine_verifier_timeout_frac` (> 0) of the task's verifier timeout
      (known only from the audit's task_health.jsonl: no timeout, no finding).
    """
    found: dict[str, dict[str, Any]] = {}
    k = config.quarantine_vacuous_attempts
    if k and record.vacuous_signature >= k:
        found[str(TaskVerdict.VACUOUS)] = {
            "vacuous_signature_attempts": record.vacuous_signature,
            "valid_attempts": record.valid,
            "threshold": k,
        }
    frac = config.quarantine_verifier_timeout_frac
    runs = len(record.verifier_s)
    if frac and verifier_timeout_s and runs >= config.quarantine_min_verifier_runs:
        worst = p95(list(record.verifier_s))
        if worst is not None and worst >= frac * verifier_timeout_s:
            found[str(TaskVerdict.SLOW_VERIFIER)] = {
                "verifier_p95_s": round(worst, 3),
                "verifier_timeout_s": verifier_timeout_s,
                "verifier_runs": runs,
                "threshold_frac": frac,
            }
    return found


@dataclass
class StepHealth:
    """What one step adds to the step record: `tasks/*` metrics and the tasks behind them."""

    metrics: dict[str, int]
    quarantined: list[dict[str, Any]]  # tasks quarantined at this step: task, verdicts, evidence
    drift_down: list[str]
    drift_up: list[str]
    above_oracle: list[str]
    replayed: bool = False  # the rollout id was already counted (a resumed run)

    def record(self) -> dict[str, Any]:
        """The step record's `task_health` field."""
        return {
            "quarantined": self.quarantined,
            "drift_down_tasks": self.drift_down,
            "drift_up_tasks": self.drift_up,
            "above_oracle_tasks": self.above_oracle,
            "replayed": self.replayed,
        }


class TaskTracker:
    """Every task's evidence over the run (see the module docstring). Not thread-safe: one caller,
    the once-per-step log hook."""

    def __init__(self, config: TrackerConfig) -> None:
        self.config = config
        self.tasks: OrderedDict[str, TaskRecord] = OrderedDict()
        self.quarantined: set[str] = set()  # the tasks this tracker put on the live list
        self.last_rollout_id: int | None = None

    # ---- one step ------------------------------------------------------------------------------

    def observe(
        self,
        rollout_id: int,
        attempts: Iterable[Mapping[str, Any]],
        verifier_timeouts: Mapping[str, float],
        oracle: Mapping[str, tuple[int, int]],
        live: Collection[str] | None = None,
        decide: bool = True,
    ) -> StepHealth:
        """Add one step's attempt summaries (`task`, `attempt_class`, `reward`, `exception_type`,
        `phase_timings`) and, with `decide`, quarantine. `live`: the tasks on the live list now (an
        entry the tracker made that is gone was cleared by an operator); None: not known, nothing
        cleared."""
        live = self.quarantined if live is None else live
        for cleared in self.quarantined - set(live):
            self.quarantined.discard(cleared)
            if cleared in self.tasks:
                self.tasks[cleared].forget_findings()
        replayed = self.last_rollout_id is not None and rollout_id <= self.last_rollout_id
        if not replayed:
            self._add(rollout_id, attempts)
            self.last_rollout_id = rollout_id
        new = self._decide(rollout_id, verifier_timeouts, live) if decide and not replayed else []
        return self._health(new, oracle, replayed)

    def _add(self, rollout_id: int, attempts: Iterable[Mapping[str, Any]]) -> None:
        rewards: dict[str, list[float]] = {}
        for attempt in attempts:
            task = attempt.get("task")
            if task is None:
                continue
            record = self._record(str(task), rollout_id)
            record.attempts += 1
            seconds = verifier_seconds(attempt)
            if seconds is not None:
                record.verifier_s.append(seconds)
            reward = valid_reward(attempt)
            if reward is None:
                record.infra += attempt.get("attempt_class") != VALID
                continue
            won = passed(reward)
            record.valid += 1
            record.passes += won
            record.vacuous_signature += vacuous_signature(attempt)
            if record.base_n < self.config.drift_baseline_attempts:
                record.base_n += 1
                record.base_passes += won
            else:
                record.recent.append(won)
            rewards.setdefault(str(task), []).append(reward)
        for task, step_rewards in rewards.items():
            if len(step_rewards) < 2:
                continue
            record = self.tasks[task]
            every_pass = all(passed(r) for r in step_rewards)
            every_fail = all(at_floor(r) for r in step_rewards)
            record.pass_streak = record.pass_streak + 1 if every_pass else 0
            record.fail_streak = record.fail_streak + 1 if every_fail else 0

    def _record(self, task: str, rollout_id: int) -> TaskRecord:
        record = self.tasks.get(task)
        if record is None:
            record = TaskRecord(
                recent=deque(maxlen=self.config.drift_window),
                verifier_s=deque(maxlen=self.config.verifier_window),
                first_step=rollout_id,
            )
            self.tasks[task] = record
            while len(self.tasks) > self.config.max_tasks:
                self.tasks.popitem(last=False)
        else:
            self.tasks.move_to_end(task)
        record.last_step = rollout_id
        return record

    def _decide(
        self, rollout_id: int, verifier_timeouts: Mapping[str, float], live: Collection[str]
    ) -> list[dict[str, Any]]:
        new = []
        for task, record in self.tasks.items():
            if task in self.quarantined or task in live or record.last_step != rollout_id:
                continue
            found = quarantine_findings(record, verifier_timeouts.get(task), self.config)
            if found:
                self.quarantined.add(task)
                evidence = {
                    **found,
                    "attempts": record.attempts,
                    "valid": record.valid,
                    "passes": record.passes,
                    "first_step": record.first_step,
                }
                new.append(
                    {"task": task, "verdicts": sorted(found), "evidence": evidence, "rollout_id": rollout_id}
                )
        return new

    def _health(
        self, new: list[dict[str, Any]], oracle: Mapping[str, tuple[int, int]], replayed: bool
    ) -> StepHealth:
        config = self.config
        down: list[str] = []
        up: list[str] = []
        above: list[str] = []
        tested = pass_streaks = fail_streaks = 0
        for task, record in self.tasks.items():
            if record.base_n >= config.drift_baseline_attempts and len(record.recent) >= config.drift_window:
                tested += 1
                moved = drift(
                    record.base_passes,
                    record.base_n,
                    record.recent_passes(),
                    len(record.recent),
                    config.drift_z,
                )
                if moved < 0:
                    down.append(task)
                elif moved > 0:
                    up.append(task)
            if task in oracle and above_ceiling(record.passes, record.valid, *oracle[task], config.drift_z):
                above.append(task)
            pass_streaks += record.pass_streak >= config.streak_steps
            fail_streaks += record.fail_streak >= config.streak_steps
        metrics = {
            "tasks/tracked_tasks": len(self.tasks),
            "tasks/drift_tested_tasks": tested,
            "tasks/drift_down_tasks": len(down),
            "tasks/drift_up_tasks": len(up),
            "tasks/above_oracle_tasks": len(above),
            "tasks/always_pass_streak_tasks": pass_streaks,
            "tasks/always_fail_streak_tasks": fail_streaks,
            "tasks/quarantined_live": len(self.quarantined),
            "tasks/quarantined_new": len(new),
        }
        return StepHealth(
            metrics,
            new,
            sorted(down)[:MAX_NAMED],
            sorted(up)[:MAX_NAMED],
            sorted(above)[:MAX_NAMED],
            replayed,
        )

    # ---- state -------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {
            "version": _STATE_VERSION,
            "last_rollout_id": self.last_rollout_id,
            "quarantined": sorted(self.quarantined),
            "tasks": {task: record.as_json() for task, record in self.tasks.items()},
        }

    @classmethod
    def from_state(cls, data: Mapping[str, Any], config: TrackerConfig) -> TaskTracker:
        """A tracker from `state()`; a document that is not one is a ValueError naming the field."""
        if data.get("version") != _STATE_VERSION:
            raise ValueError(f"state version must be {_STATE_VERSION}, got {data.get('version')!r}")
        tracker = cls(config)
        last = data.get("last_rollout_id")
        if last is not None and not isinstance(last, int):
            raise ValueError(f"last_rollout_id must be an int or null, got {last!r}")
        tracker.last_rollout_id = last
        tracker.quarantined = {str(t) for t in data.get("quarantined", ())}
        tasks = data.get("tasks")
        if not isinstance(tasks, Mapping):
            raise ValueError(f"tasks must be an object, got {type(tasks).__name__}")
        for task, record in tasks.items():
            tracker.tasks[str(task)] = TaskRecord.from_json(record, config)
        while len(tracker.tasks) > config.max_tasks:
            tracker.tasks.popitem(last=False)
        return tracker


# ---- the files next to quarantine.json ---------------------------------------------------------


def write_json_atomically(path: Path, document: Mapping[str, Any]) -> None:
    """Write a JSON document so that a reader sees the old file or the new one, never a part."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    os.replace(partial, path)


def read_live(path: Path) -> dict[str, Any]:
    """The live quarantine's entries by task ({} without the file; a file that is not one is a
    ValueError naming it)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    try:
        tasks = json.loads(text)["tasks"]
        if not isinstance(tasks, dict):
            raise TypeError(f"'tasks' is a {type(tasks).__name__}, not an object")
        return tasks
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a live quarantine list of rl360: {exc!r}") from exc


def add_to_live(path: Path, entries: Sequence[Mapping[str, Any]]) -> None:
    """Add tasks to the live quarantine list (re-read first, so an operator's edits stay)."""
    tasks = read_live(path)
    for entry in entries:
        tasks[entry["task"]] = {
            "verdicts": list(entry["verdicts"]),
            "undecided": [],
            "evidence": entry["evidence"],
            "rollout_id": entry["rollout_id"],
        }
    write_json_atomically(path, {"tasks": tasks})


_trackers: dict[Path, TaskTracker] = {}  # per-process state of each directory tracked


def tracker_for(directory: Path, config: TrackerConfig) -> TaskTracker:
    """This process's tracker of a directory: loaded from its state file the first time (a state
    file that cannot be read is logged and started over, never a stopped run)."""
    directory = Path(directory)
    tracker = _trackers.get(directory)
    if tracker is not None and tracker.config == config:
        return tracker
    state_path = directory / STATE_FILE
    tracker = TaskTracker(config)
    if state_path.exists():
        try:
            tracker = TaskTracker.from_state(json.loads(state_path.read_text()), config)
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            _log.warning(
                "rl360 task health: %s is unreadable (%r); starting the evidence over", state_path, exc
            )
    _trackers[directory] = tracker
    return tracker


def track_step(
    directory: Path,
    config: TrackerConfig,
    rollout_id: int,
    attempts: Iterable[Mapping[str, Any]],
    verifier_timeouts: Mapping[str, float],
    oracle: Mapping[str, tuple[int, int]],
) -> StepHealth:
    """One step through `directory`'s tracker: observe, add new quarantines to the live list, save
    the state. The live list is read here (an operator's deletion clears a task)."""
    tracker = tracker_for(directory, config)
    live_path = directory / LIVE_QUARANTINE_FILE
    try:
        live: set[str] | None = set(read_live(live_path))
    except (OSError, ValueError) as exc:
        _log.warning("rl360 task health: %r; nothing is added to it until it is fixed", exc)
        live = None
    # Without a readable list nothing is decided: the task is decided when it next appears.
    health = tracker.observe(rollout_id, attempts, verifier_timeouts, oracle, live, decide=live is not None)
    if health.quarantined:
        add_to_live(live_path, health.quarantined)
    for entry in health.quarantined:
        _log.warning(
            "rl360 task health: task %s quarantined at step %s (%s); its attempts are masked",
            entry["task"],
            rollout_id,
            ", ".join(entry["verdicts"]),
        )
    if not health.replayed:
        write_json_atomically(directory / STATE_FILE, tracker.state())
    return health
