"""The fault A/B's statistics over seeds, shared by the offline A/B (`rl360 ab`,
`rl360_ext.local.ab.offline`) and the live one (`rl360 demo --compare`, `ab.page`).

Owns the figures of one run from its per-step series (`curve_figures`: steps to the goal,
right-censored at the step count; area under the learning curve; final mean over the last third;
eval pass rate; mean gradient scale; mean advantage shift; where the run records them, the share
of attempts that took the crash action, over the run and over the last third, and the final pass
rate with a crash counted 0), per-step intervals of a series (`step_intervals`), the mean and
two-sided 95 %
Student-t interval over seeds (`interval`), paired differences against the reference arm on the
same seeds (`paired_interval`), the per-mode, per-arm table (`summarize`), the summary sentences
read from the intervals ("no difference detected" when two arms' intervals overlap) and the rich
table that prints them. It runs nothing and reads no file.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

REFERENCE_ARM = "rl360"  # the arm every other arm is compared with (rl360_ext.local.ab.config.RL360)
CONFIDENCE = 0.95
METRICS = ("steps_to_goal", "auc", "final_mean", "eval_pass", "gradient_scale", "advantage_shift")
METRICS += ("crash_rate", "final_crash_rate", "final_pass")
METRIC_NAMES = {
    "steps_to_goal": "steps to goal",
    "auc": "area under the curve",
    "final_mean": "final unfiltered mean",
    "eval_pass": "eval pass rate (greedy)",
    "gradient_scale": "gradient scale",
    "advantage_shift": "advantage shift",
    "crash_rate": "crash-action rate",
    "final_crash_rate": "final crash-action rate",
    "final_pass": "final pass rate (a crash counts 0)",
}
# lower is better for steps to goal; for the others higher reads as "learned more", and for the
# gradient scale, the advantage shift and the crash rates the sentence names the direction only
LOWER_IS_BETTER = {"steps_to_goal"}
INTERVAL_NOTE = "two-sided 95% Student t over seeds; paired differences vs rl360 over the same seeds"

# two-sided 95 % Student-t quantiles t(0.975, df)
_T975 = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
    10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
    18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060,
    26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980,
}  # fmt: skip
_Z975 = 1.959964


def t_quantile(df: int) -> float:
    """t(0.975, df), the two-sided 95 % quantile: tabled to df 30, then 40/60/120 (interpolated in
    1/df, exact to 3 decimals), the normal's beyond."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if df in _T975:
        return _T975[df]
    points = [(1 / d, q) for d, q in sorted(_T975.items()) if d >= 30] + [(0.0, _Z975)]
    x = 1 / df
    for (x0, q0), (x1, q1) in itertools.pairwise(points):
        if x1 <= x <= x0:
            return q1 + (q0 - q1) * (x - x1) / (x0 - x1)
    return _Z975


@dataclass(frozen=True)
class Interval:
    """Mean and two-sided 95 % Student-t interval of `n` values (a point when n is 1)."""

    mean: float
    low: float
    high: float
    n: int
    sd: float

    def overlaps(self, other: Interval) -> bool:
        return self.low <= other.high and other.low <= self.high

    def text(self, spec: str = ".3f") -> str:
        return f"{format(self.mean, spec)} [{format(self.low, spec)}, {format(self.high, spec)}]"


def interval(values: Sequence[float]) -> Interval:
    """The mean and 95 % t-interval of the finite `values`; ValueError when there is none."""
    finite = np.asarray([v for v in values if math.isfinite(v)], dtype=np.float64)
    if finite.size == 0:
        raise ValueError("no finite value to summarize")
    mean = float(finite.mean())
    if finite.size == 1:
        return Interval(mean, mean, mean, 1, 0.0)
    sd = float(finite.std(ddof=1))
    half = t_quantile(finite.size - 1) * sd / math.sqrt(finite.size)
    return Interval(mean, mean - half, mean + half, int(finite.size), sd)


def paired_interval(values: Sequence[float], reference: Sequence[float]) -> Interval:
    """The t-interval of the per-seed differences values - reference (same seeds, in order)."""
    if len(values) != len(reference):
        raise ValueError(f"{len(values)} values but {len(reference)} reference values")
    return interval([a - b for a, b in zip(values, reference, strict=True)])


def interval_dict(values: Sequence[float]) -> dict[str, Any] | None:
    """`interval(values)` as a JSON-ready dict; None when no value is finite."""
    try:
        return dataclasses.asdict(interval(values))
    except ValueError:
        return None


def as_interval(value: Mapping[str, Any] | None) -> Interval | None:
    return None if value is None else Interval(**value)


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if values else None


def curve_figures(
    curve: Sequence[tuple[int, float | None]],
    loss_scales: Sequence[float | None],
    advantage_shifts: Sequence[float | None],
    eval_pass: float,
    total_steps: int,
    goal: float,
    *,
    crash_rates: Sequence[float | None] = (),
    pass_rates: Sequence[float | None] = (),
) -> dict[str, float]:
    """One run's figures from its per-step unfiltered means `curve` ((step, mean or None)), its
    trained steps' gradient scales and advantage shifts (None: the step has none) and its eval pass
    rate (NaN: no eval): steps to goal (the first step whose mean is >= `goal`; `total_steps`,
    censored, when none is), area under the learning curve (mean of the per-step means, steps
    without a valid attempt left out), final mean (last third of the steps), eval pass rate, mean
    gradient scale and mean advantage shift (NaN when the run has none). With `crash_rates` and
    `pass_rates` (per step, in `curve`'s order: the share of attempts that took the crash action;
    the pass rate of the attempts no infrastructure fault hit, a crash counted 0): the crash rate
    over the run and over the last third, and the final pass rate (last third); NaN without."""
    present = [(step, mean) for step, mean in curve if mean is not None]
    reached = next((step for step, mean in present if mean >= goal), None)
    first_late = total_steps - max(1, total_steps // 3)
    late = [m for step, m in present if step >= first_late]
    scales = [s for s in loss_scales if s is not None]
    shifts = [s for s in advantage_shifts if s is not None]

    def series(values: Sequence[float | None], late_only: bool) -> float:
        steps = [step for step, _ in curve]
        kept = [
            v
            for step, v in zip(steps, values, strict=True)
            if v is not None and (not late_only or step >= first_late)
        ]
        return float(np.mean(kept)) if kept else math.nan

    return {
        "steps_to_goal": float(total_steps if reached is None else reached),
        "censored": float(reached is None),
        "auc": _mean([m for _, m in present]) or 0.0,
        "final_mean": _mean(late) or 0.0,
        "eval_pass": eval_pass,
        "gradient_scale": _mean(scales) if scales else math.nan,
        "advantage_shift": _mean(shifts) if shifts else math.nan,
        "crash_rate": series(crash_rates, False) if crash_rates else math.nan,
        "final_crash_rate": series(crash_rates, True) if crash_rates else math.nan,
        "final_pass": series(pass_rates, True) if pass_rates else math.nan,
    }


def step_intervals(
    records: Sequence[Mapping[str, Any]], key: str
) -> dict[str, dict[str, list[dict[str, Any] | None]]]:
    """Per mode and arm, per step: the interval over seeds of the per-step series `key` of each
    record (a list, one value or None per step); records without `key` are left out."""
    series: dict[tuple[str, str], list[Sequence[float | None]]] = {}
    for record in records:
        if record.get(key) is not None:
            series.setdefault((record["mode"], record["arm"]), []).append(record[key])
    out: dict[str, dict[str, list[dict[str, Any] | None]]] = {}
    for (mode, arm), runs in series.items():
        steps = max(len(run) for run in runs)
        out.setdefault(mode, {})[arm] = [
            interval_dict([run[step] for run in runs if step < len(run) and run[step] is not None])
            for step in range(steps)
        ]
    return out


def comparison_sentence(metric: str, arm: str, reference: str, a: Interval, b: Interval) -> str:
    """One sentence from two arms' intervals: "no difference detected" when they overlap, else
    which arm is higher (and, for steps to goal, which is faster); with fewer than two values on
    either side there is no interval, and the sentence says so instead of comparing."""
    name = METRIC_NAMES.get(metric, metric)
    if min(a.n, b.n) < 2:
        return f"{name}: no interval from one seed ({arm} {a.mean:.3g}, {reference} {b.mean:.3g})"
    if a.overlaps(b):
        return f"{name}: no difference detected between {arm} and {reference} (95% intervals overlap)"
    higher, lower = (arm, reference) if a.mean > b.mean else (reference, arm)
    if metric in LOWER_IS_BETTER:
        return f"{name}: {lower} reaches the goal sooner than {higher} (95% intervals do not overlap)"
    return f"{name}: {higher} is higher than {lower} (95% intervals do not overlap)"


def summarize(
    records: Sequence[Mapping[str, Any]], reference: str = REFERENCE_ARM
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per mode and arm: each metric's interval over seeds, the censored count, and the paired
    difference from the `reference` arm (same seeds) when it ran. Each record is one run:
    {"mode", "arm", "seed", "figures": `curve_figures`}."""
    table: dict[str, dict[str, dict[str, Any]]] = {}
    figures: dict[tuple[str, str], dict[int, dict[str, float]]] = {}
    for record in records:
        figures.setdefault((record["mode"], record["arm"]), {})[record["seed"]] = record["figures"]
    for (mode, arm), by_seed in figures.items():
        seeds = sorted(by_seed)
        entry: dict[str, Any] = {
            "seeds": len(seeds),
            "censored": int(sum(by_seed[s]["censored"] for s in seeds)),
        }
        base = figures.get((mode, reference))
        for metric in METRICS:
            values = [by_seed[s][metric] for s in seeds]
            entry[metric] = interval_dict(values)
            if base is not None and arm != reference and all(s in base for s in seeds):
                pairs = [(v, base[s][metric]) for v, s in zip(values, seeds, strict=True)]
                pairs = [(v, r) for v, r in pairs if math.isfinite(v) and math.isfinite(r)]
                if pairs:
                    diff = paired_interval([v for v, _ in pairs], [r for _, r in pairs])
                    entry[f"{metric}_minus_{reference}"] = dataclasses.asdict(diff)
        table.setdefault(mode, {})[arm] = entry
    return table


def summary_sentences(
    table: Mapping[str, Mapping[str, Mapping[str, Any]]], reference: str = REFERENCE_ARM
) -> list[str]:
    """Per mode, each arm against the `reference` arm on every metric, from the intervals."""
    lines = []
    for mode, arms in table.items():
        if reference not in arms:
            continue
        for arm, entry in arms.items():
            if arm == reference:
                continue
            parts = []
            for metric in METRICS:
                a, b = as_interval(entry.get(metric)), as_interval(arms[reference].get(metric))
                if a is not None and b is not None:
                    parts.append(comparison_sentence(metric, arm, reference, a, b))
            lines.append(f"{mode}, {arm} vs {reference}: " + "; ".join(parts) + ".")
    return lines


TABLE_COLUMNS = ("mode", "arm", "seeds", "steps to goal (censored)", "AUC", "final mean", "eval pass")
TABLE_COLUMNS += ("grad scale", "adv shift", "crash rate", "final crash rate", "final pass (crash 0)")


def table_rows(table: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> list[tuple[str, ...]]:
    """Per mode and arm (`summarize`'s table): each metric as "mean [low, high]" ("-": none)."""
    rows = []
    for mode, arms in table.items():
        for arm, entry in arms.items():

            def cell(metric: str, spec: str = ".3f", entry: Mapping[str, Any] = entry) -> str:
                value = as_interval(entry.get(metric))
                return "-" if value is None else value.text(spec)

            rows.append(
                (
                    mode,
                    arm,
                    str(entry["seeds"]),
                    f"{cell('steps_to_goal', '.1f')} ({entry['censored']})",
                    cell("auc"),
                    cell("final_mean"),
                    cell("eval_pass", ".2f"),
                    cell("gradient_scale", ".2f"),
                    cell("advantage_shift"),
                    cell("crash_rate"),
                    cell("final_crash_rate"),
                    cell("final_pass"),
                )
            )
    return rows


def results_table(table: Mapping[str, Mapping[str, Mapping[str, Any]]], title: str, goal: float) -> Any:
    """The rich table of `table_rows`, "steps to goal" naming `goal`."""
    from rich.table import Table

    rich_table = Table(title=title)
    for column in TABLE_COLUMNS:
        rich_table.add_column(column.replace("goal", f"{goal:g}"))
    for row in table_rows(table):
        rich_table.add_row(*row)
    return rich_table
