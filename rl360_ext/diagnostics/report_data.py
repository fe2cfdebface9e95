"""The numbers behind `rl360 report`: a run's metrics JSONL, checked and reduced to per-chart series.

Owns finding the metrics file of a run folder, reading it (through
`rl360_ext.rollout.metrics.records_by_kind`, never a second parser, in one pass), checking the
fields the report uses (missing or null means "no data"; a value of the wrong type raises
`ValueError` naming the record and field), and the pure reductions each chart draws: attempt
outcomes, reward means, phase durations, infrastructure causes, prefix-cache hit rate, routing
bytes, weight pushes, the trainer's per-step trust metrics, the tasks the training-time tracker
quarantined (each step record's `task_health`) and the summary. It does not draw
(charts.py) or lay out the page (report.py).

An attempt's outcome, one per attempt (the stacking order of chart 1):
passed / failed: valid, in a group the trainer used, reward > 0 / reward <= 0;
dropped_all_passed / dropped_all_failed: valid, group dropped as `zero_std_valid` with every valid
reward > 0 / <= 0 (zero std: they are all equal); dropped_insufficient_valid: valid, group dropped
as `insufficient_valid_rewards`; dropped_other: valid, dropped for another filter's reason; unused:
valid, group kept by the filter but not needed (batch full); infra: an infrastructure failure,
whatever happened to its group; unknown: no class, or a valid attempt without a reward.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
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


def quarantined_during_run(run: Run) -> list[QuarantineEvent]:
    """Every task quarantined during the run, in step order."""
    return [event for rid in sorted(run.steps) for event in run.steps[rid].quarantined]


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


# ---- per-chart reductions -----------------------------------------------------------------------


@dataclass
class StepCounts:
    """Attempts per step: from step metrics (every attempt the filter saw) or, failing that, attempt lines."""

    attempts: int
    valid: int
    source: str  # "step metrics" | "attempt lines"


def step_counts(run: Run) -> dict[int, StepCounts]:
    by_step = run.attempts_by_step()
    counts: dict[int, StepCounts] = {}
    for rollout_id in run.step_ids:
        step = run.steps.get(rollout_id)
        total = None if step is None else step.metric("count/attempts")
        valid = None if step is None else step.metric("count/valid")
        if total is not None and valid is not None:
            counts[rollout_id] = StepCounts(int(total), int(valid), "step metrics")
        elif by_step[rollout_id]:
            attempts = by_step[rollout_id]
            counts[rollout_id] = StepCounts(
                len(attempts), sum(1 for a in attempts if a.attempt_class == VALID), "attempt lines"
            )
    return counts


def outcome_counts(run: Run) -> dict[str, list[int]]:
    """Attempts per outcome (OUTCOMES order) per step (run.step_ids order), from attempt lines."""
    by_step = run.attempts_by_step()
    counts = {outcome: [] for outcome in OUTCOMES}
    for rollout_id in run.step_ids:
        tally = Counter(a.outcome for a in by_step[rollout_id])
        for outcome in OUTCOMES:
            counts[outcome].append(tally[outcome])
    return counts


def step_metric_series(run: Run, name: str) -> list[float | None]:
    return [None if (step := run.steps.get(rid)) is None else step.metric(name) for rid in run.step_ids]


def eval_steps(run: Run) -> list[int]:
    """Every rollout step a step or an eval record names, in order (the eval chart's x axis)."""
    return sorted({*run.step_ids, *(e.rollout_id for e in run.evals)})


def eval_metric_series(run: Run, dataset: str, name: str, steps: Sequence[int]) -> list[float | None]:
    """One eval metric of one dataset per step of `steps` (None where it was not evaluated; the
    last record wins when a step was evaluated twice)."""
    by_step = {e.rollout_id: e.metric(name) for e in run.evals if e.dataset == dataset}
    return [by_step.get(step) for step in steps]


def train_metric_series(run: Run, name: str) -> list[float | None]:
    """A trainer metric per step (None for steps without a train record or without the metric)."""
    return [None if (rec := run.train.get(rid)) is None else rec.metric(name) for rid in run.step_ids]


def trained_metric_series(run: Run, name: str) -> list[float | None]:
    """A train-time metric per step: the train record's, else the step record's `miles_metrics`
    (where Miles' rollout function puts its buffer's metrics, e.g. rl360's version-aware buffer)."""
    values = []
    for rid in run.step_ids:
        rec, step = run.train.get(rid), run.steps.get(rid)
        value = None if rec is None else rec.metric(name)
        if value is None and step is not None:
            value = step.miles_metric(name)
        values.append(value)
    return values


def chance_level(run: Run) -> float | None:
    """The chance level the driver declared for the task (the same in every train record), if any."""
    levels = {rec.chance_level for rec in run.train.values() if rec.chance_level is not None}
    return levels.pop() if len(levels) == 1 else None


def infra_causes(run: Run) -> tuple[dict[str, list[int]], list[int]]:
    """({cause: count per step}, steps counted from attempt lines because step metrics lacked the counts)."""
    by_step = run.attempts_by_step()
    per_step: list[Counter[str]] = []
    from_lines: list[int] = []
    for rollout_id in run.step_ids:
        step = run.steps.get(rollout_id)
        if step is not None and step.metric("count/infra") is not None:
            per_step.append(
                Counter(
                    {
                        name[len("count/infra/") :]: int(value)
                        for name in step.metrics
                        if name.startswith("count/infra/") and (value := step.metric(name))
                    }
                )
            )
            continue
        causes = Counter(a.cause for a in by_step[rollout_id] if a.cause is not None)
        if by_step[rollout_id]:
            from_lines.append(rollout_id)
        per_step.append(causes)
    names = sorted({cause for counter in per_step for cause in counter})
    return {cause: [counter[cause] for counter in per_step] for cause in names}, from_lines


def attributions(run: Run) -> dict[str, list[int]]:
    """{"<who>/<cause>": count per step} of the failed attempts, from the step metrics
    (`count/attribution/<who>/<cause>`, rl360_ext.rollout.metrics.attribution_metrics)."""
    prefix = "count/attribution/"
    per_step = []
    for rollout_id in run.step_ids:
        step = run.steps.get(rollout_id)
        names = [] if step is None else [name for name in step.metrics if name.startswith(prefix)]
        per_step.append({name[len(prefix) :]: int(step.metric(name) or 0) for name in names})  # type: ignore[union-attr]
    keys = sorted({key for counts in per_step for key in counts})
    return {key: [counts.get(key, 0) for counts in per_step] for key in keys}


@dataclass
class CacheStep:
    hit_rate: float | None
    attempts: int  # attempts with both counts known
    routing_bytes: float | None
    routing_attempts: int


def cache_and_routing(run: Run) -> list[CacheStep]:
    """Per step: sum(cached_tokens) / sum(prompt_tokens) over attempts with both, and summed routing bytes."""
    rows = []
    for attempts in run.attempts_by_step().values():
        counted = [a for a in attempts if a.cached_tokens is not None and a.prompt_tokens is not None]
        prompt = sum(a.prompt_tokens for a in counted)  # type: ignore[misc]
        routed = [a.routing_bytes for a in attempts if a.routing_bytes is not None]
        rows.append(
            CacheStep(
                hit_rate=sum(a.cached_tokens for a in counted) / prompt if prompt > 0 else None,  # type: ignore[misc]
                attempts=len(counted),
                routing_bytes=sum(routed) if routed else None,
                routing_attempts=len(routed),
            )
        )
    return rows


@dataclass
class PhaseStats:
    phase: str
    attempts: int
    median: float
    p90: float
    maximum: float
    share: float  # of all phase time in the run


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def phase_stats(run: Run) -> list[PhaseStats]:
    values = {phase: [a.phases[phase] for a in run.attempts if phase in a.phases] for phase in PHASES}
    grand = sum(sum(v) for v in values.values())
    return [
        PhaseStats(
            phase=phase,
            attempts=len(v),
            median=_quantile(v, 0.5),
            p90=_quantile(v, 0.9),
            maximum=max(v),
            share=sum(v) / grand if grand > 0 else 0.0,
        )
        for phase, v in values.items()
        if v
    ]


def slowest_attempts(run: Run, limit: int) -> list[Attempt]:
    timed = [a for a in run.attempts if a.phases]
    return sorted(timed, key=lambda a: sum(a.phases.values()), reverse=True)[:limit]


@dataclass
class Summary:
    steps: int
    first_step: int | None
    last_step: int | None
    attempts: int
    valid: int
    kept_mean_last: float | None
    unfiltered_mean_last: float | None
    trained: int | None
    masked: int | None
    dropped_groups: int | None
    pushes: int
    complete_pushes: int

    @property
    def valid_fraction(self) -> float | None:
        return self.valid / self.attempts if self.attempts else None

    @property
    def infra_rate(self) -> float | None:
        return (self.attempts - self.valid) / self.attempts if self.attempts else None


def _total(run: Run, name: str) -> int | None:
    values = [v for step in run.steps.values() if (v := step.metric(name)) is not None]
    return int(sum(values)) if values else None


def summary(run: Run) -> Summary:
    ids = run.step_ids
    counts = step_counts(run).values()
    last = run.steps.get(ids[-1]) if ids else None
    return Summary(
        steps=len(ids),
        first_step=ids[0] if ids else None,
        last_step=ids[-1] if ids else None,
        attempts=sum(c.attempts for c in counts),
        valid=sum(c.valid for c in counts),
        kept_mean_last=None if last is None else last.metric("reward/kept_mean"),
        unfiltered_mean_last=None if last is None else last.metric("reward/unfiltered_mean"),
        trained=_total(run, "count/trained"),
        masked=_total(run, "count/masked"),
        dropped_groups=_total(run, "count/dropped_groups"),
        pushes=len(run.pushes),
        complete_pushes=sum(1 for p in run.pushes if p.complete),
    )
