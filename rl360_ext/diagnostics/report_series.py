"""The pure reductions each chart of `rl360 report` draws from a loaded `Run`: attempt outcomes,
reward means, phase durations, infrastructure causes and attributions, prefix-cache hit rate and
routing bytes, the trainer's and the evals' per-step series, the tasks the training-time tracker
quarantined (each step record's `task_health`) and the summary.

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
from collections.abc import Sequence
from dataclasses import dataclass

from rl360_ext.diagnostics.report_data import OUTCOMES, PHASES, Attempt, QuarantineEvent, Run
from rl360_ext.outcomes.provenance import VALID


def quarantined_during_run(run: Run) -> list[QuarantineEvent]:
    """Every task quarantined during the run, in step order."""
    return [event for rid in sorted(run.steps) for event in run.steps[rid].quarantined]


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
