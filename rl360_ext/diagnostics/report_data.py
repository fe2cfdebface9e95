"""The numbers behind `rl360 report`: a run's metrics JSONL, checked and reduced to per-chart series.

Owns finding the metrics file of a run folder, reading it (through
`rl360_ext.rollout.metrics.records_by_kind`, never a second parser, in one pass), checking the
fields the report uses (missing or null means "no data"; a value of the wrong type raises
`ValueError` naming the record and field), into one `Run` of typed records (attempts, steps,
weight pushes, train, gate and eval records). The reductions each chart draws are
`rl360_ext.diagnostics.report_series`. It does not draw (charts.py) or lay out the page
(report.py).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl360_ext.gate.rules import Action
from rl360_ext.outcomes.provenance import INFRA_PREFIX, VALID
from rl360_ext.rollout.audit import GATE_KIND
from rl360_ext.rollout.eval_metrics import EVAL_KIND, EVAL_NOTE_KIND
from rl360_ext.rollout.metrics import records_by_kind

METRICS_FILE = "metrics.jsonl"


WEIGHT_PUSH_KIND = "weight_push"


TRAIN_KIND = "train"  # one per train step: {"kind", "rollout_id", "metrics", "chance_level"?}


PHASES = ("queue", "environment_setup", "agent_setup", "agent", "verifier")


OUTCOMES = (
    "passed",
    "failed",
    "dropped_all_passed",
    "dropped_all_failed",
    "dropped_insufficient_valid",
    "dropped_other",
    "unused",
    "infra",
    "unknown",
)


Number = (int, float)


def find_metrics_file(run_dir: Path) -> tuple[Path, list[Path]]:
    """(the JSONL the report reads, other *.jsonl in the folder it does not read).

    RUN_DIR may be the file itself. In a folder: `metrics.jsonl`, else the only `*.jsonl`.
    """
    run_dir = Path(run_dir)
    if run_dir.is_file():
        return run_dir, []
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no such run folder or metrics file: {run_dir}")
    candidates = sorted(run_dir.glob("*.jsonl"))
    chosen = run_dir / METRICS_FILE
    if not chosen.is_file():
        if len(candidates) != 1:
            names = ", ".join(p.name for p in candidates) or "none"
            raise ValueError(
                f"{run_dir} has no {METRICS_FILE} and {len(candidates)} *.jsonl files ({names}): "
                "pass the file to read"
            )
        chosen = candidates[0]
    return chosen, [p for p in candidates if p != chosen]


def _where(kind: str, number: int, record: Mapping[str, Any]) -> str:
    rollout = record.get("rollout_id")
    return f"{kind} record {number}" + ("" if rollout is None else f" (rollout_id {rollout!r})")


def _checked(record: Mapping[str, Any], name: str, types: tuple[type, ...], where: str) -> Any:
    value = record.get(name)
    if value is None:
        return None
    if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
        expected = " or ".join(t.__name__ for t in types)
        raise ValueError(f"{where}: field {name!r} must be {expected} or null, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _number(record: Mapping[str, Any], name: str, where: str) -> float | None:
    return _checked(record, name, Number, where)


@dataclass
class Attempt:
    rollout_id: int
    group_index: Any
    index: Any
    attempt_class: str | None
    reward: float | None
    filter: str | None
    dropped_reason: str | None
    trained: bool | None
    phases: dict[str, float]
    timings: dict[str, Any]  # phase_timings as recorded (Harbor's phases plus the session's model time)
    started_at: float | None  # unix seconds the Harbor server received the attempt
    cached_tokens: float | None
    prompt_tokens: float | None
    routing_bytes: float | None

    @property
    def cause(self) -> str | None:
        cls = self.attempt_class
        return cls[len(INFRA_PREFIX) :] if cls and cls.startswith(INFRA_PREFIX) else None

    @property
    def outcome(self) -> str:
        if self.cause is not None:
            return "infra"
        if self.attempt_class != VALID or self.reward is None:
            return "unknown"
        passed = self.reward > 0
        verdict = self.filter or ("dropped" if self.trained is False else "kept")
        if verdict == "unused":
            return "unused"
        if verdict != "dropped":
            return "passed" if passed else "failed"
        if self.dropped_reason == "zero_std_valid":
            return "dropped_all_passed" if passed else "dropped_all_failed"
        if self.dropped_reason == "insufficient_valid_rewards":
            return "dropped_insufficient_valid"
        return "dropped_other"


def _attempt(record: Mapping[str, Any], where: str) -> Attempt:
    timings = _checked(record, "phase_timings", (dict,), where) or {}
    phases = {}
    for phase in PHASES:
        value = _number(timings, phase, f"{where} phase_timings")
        if value is not None:
            phases[phase] = value
    return Attempt(
        rollout_id=_checked(record, "rollout_id", (int,), where),
        group_index=record.get("group_index"),
        index=record.get("index"),
        attempt_class=_checked(record, "attempt_class", (str,), where),
        reward=_number(record, "reward", where),
        filter=_checked(record, "filter", (str,), where),
        dropped_reason=_checked(record, "dropped_reason", (str,), where),
        trained=_checked(record, "trained", (bool,), where),
        phases=phases,
        timings=dict(timings),
        started_at=_number(record, "started_at", where),
        cached_tokens=_number(record, "cached_tokens", where),
        prompt_tokens=_number(record, "prompt_tokens", where),
        routing_bytes=_number(record, "routing_bytes", where),
    )


@dataclass
class Step:
    rollout_id: int
    prefilter: str | None
    metrics: dict[str, Any]
    where: str
    miles_metrics: dict[str, Any] = field(default_factory=dict)  # the rollout function's (e.g. a buffer's)
    quarantined: list[QuarantineEvent] = field(default_factory=list)  # tasks quarantined at this step

    def metric(self, name: str) -> float | None:
        """A numeric metric, None when absent or null (checked when read: unused metrics may be anything)."""
        return _number(self.metrics, name, f"{self.where} metrics")

    def miles_metric(self, name: str) -> float | None:
        return _number(self.miles_metrics, name, f"{self.where} miles_metrics")


def _step(record: Mapping[str, Any], where: str) -> Step:
    rollout_id = _checked(record, "rollout_id", (int,), where)
    health = _checked(record, "task_health", (dict,), where) or {}
    entries = _checked(health, "quarantined", (list,), f"{where} task_health") or []
    return Step(
        rollout_id=rollout_id,
        prefilter=_checked(record, "prefilter", (str,), where),
        metrics=_checked(record, "metrics", (dict,), where) or {},
        where=where,
        miles_metrics=_checked(record, "miles_metrics", (dict,), where) or {},
        quarantined=[
            _quarantine_event(entry, rollout_id, f"{where} task_health.quarantined[{n}]")
            for n, entry in enumerate(entries)
        ],
    )


@dataclass
class QuarantineEvent:
    """A task the training-time tracker quarantined (`rl360_ext.tasks.tracker`), as the step
    record's `task_health.quarantined` lists it."""

    rollout_id: int | None
    task: str
    verdicts: list[str]
    evidence: dict[str, Any]


def _quarantine_event(entry: Any, rollout_id: int | None, where: str) -> QuarantineEvent:
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where} must be an object, got {type(entry).__name__}")
    task = _checked(entry, "task", (str,), where)
    if task is None:
        raise ValueError(f"{where}: field 'task' must be str, got null")
    verdicts = _checked(entry, "verdicts", (list,), where) or []
    return QuarantineEvent(
        rollout_id=rollout_id,
        task=task,
        verdicts=[str(v) for v in verdicts],
        evidence=_checked(entry, "evidence", (dict,), where) or {},
    )


@dataclass
class WeightPushRecord:
    rollout_id: int | None
    path: str
    weight_version: str | None
    duration_s: float | None
    engines_targeted: int | None
    engines_reached: int | None
    update_calls_per_engine: dict[str, float]
    control_calls_per_engine: dict[str, float]
    failures: int
    complete: bool | None
    metrics: dict[str, Any] = field(default_factory=dict)  # the push's `weights/*` (rl360 demo)

    @property
    def label(self) -> str:
        """The x label: after <step> → v<version>, or initial → v<version> for a push tied to no step."""
        where = "initial" if self.rollout_id is None else f"after {self.rollout_id}"
        version = "" if self.weight_version is None else f" → v{self.weight_version}"
        return where + version


def _calls(record: Mapping[str, Any], name: str, where: str) -> dict[str, float]:
    calls = _checked(record, name, (dict,), where) or {}
    return {
        str(engine): value
        for engine in calls
        if (value := _number(calls, engine, f"{where} {name}")) is not None
    }


def _push(record: Mapping[str, Any], where: str) -> WeightPushRecord:
    version = record.get("weight_version")
    return WeightPushRecord(
        rollout_id=_checked(record, "rollout_id", (int,), where),
        path=_checked(record, "path", (str,), where) or "unknown",
        weight_version=None if version is None else str(version),
        duration_s=_number(record, "duration_s", where),
        engines_targeted=_checked(record, "engines_targeted", (int,), where),
        engines_reached=_checked(record, "engines_reached", (int,), where),
        update_calls_per_engine=_calls(record, "update_calls_per_engine", where),
        control_calls_per_engine=_calls(record, "control_calls_per_engine", where),
        failures=len(_checked(record, "failures", (list,), where) or []),
        complete=_checked(record, "complete", (bool,), where),
        metrics={
            str(k): v
            for k, v in (_checked(record, "metrics", (dict,), where) or {}).items()
            if str(k).startswith("weights/")
        },
    )


@dataclass
class TrainRecord:
    """One train step's metrics (`train/...`), as the reference trainer's driver writes them."""

    rollout_id: int
    metrics: dict[str, Any]
    chance_level: float | None
    where: str

    def metric(self, name: str) -> float | None:
        return _number(self.metrics, name, f"{self.where} metrics")


def _train(record: Mapping[str, Any], where: str) -> TrainRecord:
    return TrainRecord(
        rollout_id=_checked(record, "rollout_id", (int,), where),
        metrics=_checked(record, "metrics", (dict,), where) or {},
        chance_level=_number(record, "chance_level", where),
        where=where,
    )


@dataclass
class GateReason:
    """A gate rule that fired on a step: its rule, metric, the value seen, the bound, how they compare."""

    rule: str
    metric: str
    value: float | None
    bound: float | None
    op: str
    hard: bool


@dataclass
class GateRecord:
    """The step gate's verdict on one step (`GateVerdict.record`: the Miles hook's and the demo's line)."""

    rollout_id: int
    action: str  # train | skip | stop
    reasons: list[GateReason]
    unavailable: int  # evidence items the rules could not read this step
    where: str


def _gate(record: Mapping[str, Any], where: str) -> GateRecord:
    action = _checked(record, "action", (str,), where)
    if action not in {a.value for a in Action}:
        raise ValueError(f"{where}: field 'action' must be one of train, skip, stop, got {action!r}")
    reasons = []
    for number, entry in enumerate(_checked(record, "reasons", (list,), where) or []):
        at = f"{where} reasons[{number}]"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{at}: must be an object, got {type(entry).__name__}")
        reasons.append(
            GateReason(
                rule=str(_checked(entry, "rule", (str,), at)),
                metric=str(_checked(entry, "metric", (str,), at)),
                value=_number(entry, "value", at),
                bound=_number(entry, "bound", at),
                op=str(_checked(entry, "op", (str,), at) or ""),
                hard=bool(_checked(entry, "hard", (bool,), at)),
            )
        )
    return GateRecord(
        rollout_id=_checked(record, "rollout_id", (int,), where),
        action=action,
        reasons=reasons,
        unavailable=len(_checked(record, "unavailable", (list,), where) or []),
        where=where,
    )


@dataclass
class EvalRecord:
    """One eval dataset at one rollout step (`rl360_ext.rollout.eval_metrics.log_eval_metrics`):
    its metrics without the `eval/<dataset>/` prefix."""

    rollout_id: int
    dataset: str
    metrics: dict[str, Any]
    where: str

    def metric(self, name: str) -> float | None:
        return _number(self.metrics, name, f"{self.where} metrics")


def _eval(record: Mapping[str, Any], where: str) -> EvalRecord:
    return EvalRecord(
        rollout_id=_checked(record, "rollout_id", (int,), where),
        dataset=str(_checked(record, "dataset", (str,), where)),
        metrics=_checked(record, "metrics", (dict,), where) or {},
        where=where,
    )


@dataclass
class Run:
    source: Path
    ignored_files: list[Path] = field(default_factory=list)
    steps: dict[int, Step] = field(default_factory=dict)
    attempts: list[Attempt] = field(default_factory=list)
    pushes: list[WeightPushRecord] = field(default_factory=list)
    train: dict[int, TrainRecord] = field(default_factory=dict)
    evals: list[EvalRecord] = field(default_factory=list)
    gates: dict[int, GateRecord] = field(default_factory=dict)  # the step gate's verdicts
    eval_notes: dict[str, str] = field(default_factory=dict)  # what each eval dataset holds (a driver's)
    notes: list[str] = field(default_factory=list)

    @property
    def step_ids(self) -> list[int]:
        return sorted({*self.steps, *(a.rollout_id for a in self.attempts)})

    def attempts_by_step(self) -> dict[int, list[Attempt]]:
        grouped: dict[int, list[Attempt]] = {rid: [] for rid in self.step_ids}
        for attempt in self.attempts:
            grouped[attempt.rollout_id].append(attempt)
        return grouped


def load_run(run_dir: Path) -> Run:
    """Read a run folder (or one metrics JSONL) into checked records, with notes on what was skipped."""
    source, ignored = find_metrics_file(run_dir)
    records = records_by_kind(source)
    step_records, attempt_records = records.get("step", []), records.get("attempt", [])
    run = Run(source=source, ignored_files=ignored)
    repeated: Counter[int] = Counter()
    unplaced = 0
    for number, record in enumerate(step_records, start=1):
        step = _step(record, _where("step", number, record))
        if step.rollout_id is None:
            unplaced += 1
            continue
        if step.rollout_id in run.steps:
            repeated[step.rollout_id] += 1
        run.steps[step.rollout_id] = step
    for number, record in enumerate(attempt_records, start=1):
        attempt = _attempt(record, _where("attempt", number, record))
        if attempt.rollout_id is None:
            unplaced += 1
            continue
        run.attempts.append(attempt)
    for number, record in enumerate(records.get(WEIGHT_PUSH_KIND, []), start=1):
        run.pushes.append(_push(record, _where(WEIGHT_PUSH_KIND, number, record)))
    for number, record in enumerate(records.get(TRAIN_KIND, []), start=1):
        train = _train(record, _where(TRAIN_KIND, number, record))
        if train.rollout_id is not None:
            run.train[train.rollout_id] = train
    for number, record in enumerate(records.get(GATE_KIND, []), start=1):
        gate = _gate(record, _where(GATE_KIND, number, record))
        if gate.rollout_id is not None:
            run.gates[gate.rollout_id] = gate
    for number, record in enumerate(records.get(EVAL_KIND, []), start=1):
        evaluated = _eval(record, _where(EVAL_KIND, number, record))
        if evaluated.rollout_id is not None and evaluated.dataset:
            run.evals.append(evaluated)
    for record in records.get(EVAL_NOTE_KIND, []):
        datasets = record.get("datasets")
        if isinstance(datasets, dict):
            run.eval_notes.update({str(k): str(v) for k, v in datasets.items()})
    if unplaced:
        run.notes.append(
            f"{unplaced} step/attempt record(s) without a rollout_id were left out of the charts."
        )
    for rollout_id, extra in sorted(repeated.items()):
        run.notes.append(
            f"rollout_id {rollout_id} has {extra + 1} step records (a resumed run appending to the same "
            "file?): the last one is shown, and its attempts include every attempt line with that id."
        )
    return run
