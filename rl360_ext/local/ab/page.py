"""The fault A/B's combined report: per fault mode and arm, the figures of every seed's run, their
means with 95 % intervals over seeds, the sentences those intervals support, and the curves.

Owns reading the runs' folders (each an `rl360 demo` output: `metrics.jsonl` with its step,
`train`, `advantage` and `eval` lines), reducing each run to its per-step series and its figures
(`rl360_ext.local.ab.stats.curve_figures`: steps to the goal, area under the learning curve,
final unfiltered mean, eval pass rate when the demo ran eval, gradient scale, advantage shift, and
from the attempt lines the crash-action rate and the pass rate with a crash counted 0: a crash is
an attempt the /run server saw hit its memory limit, `failure_cause` memory_limit_exceeded or
`evidence` naming the memory resource, which in the demo only the quiz agent's crash tool does),
and writing `compare.html` (inline SVG, no script, the step report's style:
`rl360_ext.diagnostics.report`) and `compare.json` (the same numbers, every run's figures and
series). The statistics are the offline A/B's (`ab.stats`: Student-t intervals over seeds,
paired differences against rl360's arm on the same seeds, "no difference detected" when two
intervals overlap); this module adds none.

Per mode, three charts with one line per arm, each point the mean over the arm's seeds:

- learning: `reward/unfiltered_mean` (valid attempts of every group, before the filter), with the
  task's chance level dashed;
- gradient scale: `train/loss_scale`, the scale the pg-loss reducer gave the step's gradient
  relative to a mean over its valid samples (1.0 when nothing is masked or when the reducer
  ignores masked samples; the valid share under Miles' default reducer), on the steps that
  trained on a valid sample (`train/valid_samples` > 0; a step with none moved nothing);
- advantage shift: `advantage/shift` from the `advantage` line the driver writes after the
  reward post-process (`rl360_ext.local.demo.arms.advantage_metrics`): over the step's valid trained
  samples, the mean advantage the arm's hook gave them minus the mean rl360's per-group valid
  baseline gives the same samples. 0 under rl360's rules by construction.

It does not run anything (`rl360_ext.local.ab.compare` runs the arms).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from typing import Any

from rl360_ext.diagnostics import page
from rl360_ext.diagnostics.charts import FULL_WIDTH, HALF_WIDTH, Series, legend, line_chart
from rl360_ext.diagnostics.report_data import load_run
from rl360_ext.diagnostics.report_series import chance_level
from rl360_ext.diagnostics.report_style import CSS, STEP_AXIS
from rl360_ext.local.ab.stats import (
    INTERVAL_NOTE,
    TABLE_COLUMNS,
    curve_figures,
    summarize,
    summary_sentences,
    table_rows,
)
from rl360_ext.local.demo.arms import ADVANTAGE_KIND
from rl360_ext.outcomes.attribution import EVIDENCE, Resource
from rl360_ext.outcomes.causes import Cause
from rl360_ext.outcomes.provenance import VALID
from rl360_ext.rollout.metrics import read_records

COMPARE_HTML = "compare.html"
COMPARE_JSON = "compare.json"
UNFILTERED_MEAN = "reward/unfiltered_mean"
LOSS_SCALE = "train/loss_scale"  # read only for steps that trained on a valid sample
VALID_SAMPLES = "train/valid_samples"
ADVANTAGE_SHIFT = "advantage/shift"
PASS_RATE = "pass_rate"  # eval/<dataset>/pass_rate: valid attempts that pass
ARM_COLORS = ("#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a", "#c62828")


@dataclass(frozen=True)
class RunFolder:
    """One run of the A/B: its fault mode, arm, seed and output folder."""

    mode: str
    arm: str
    seed: int
    path: Path


@dataclass
class ArmCurves:
    """One run's per-step series (keyed by rollout step), or their means over an arm's seeds."""

    name: str
    run_dir: str
    steps: list[int]
    unfiltered_mean: dict[int, float | None]
    loss_scale: dict[int, float | None]
    advantage_shift: dict[int, float | None]
    chance_level: float | None
    eval_pass: float | None  # the last eval of the eval dataset: its pass rate (None: no eval)
    crash_rate: dict[int, float | None] = field(default_factory=dict)  # attempts that crashed their sandbox
    pass_rate: dict[int, float | None] = field(default_factory=dict)  # valid rewards, a masked crash as 0


def is_crash(record: dict[str, Any]) -> bool:
    """Whether an attempt line is a crash of the attempt's own sandbox on its memory limit."""
    evidence = record.get(EVIDENCE)
    memory = isinstance(evidence, dict) and evidence.get("resource") == Resource.MEMORY.value
    return memory or record.get("failure_cause") == Cause.MEMORY_LIMIT_EXCEEDED.value


def crash_series(
    attempts: Sequence[dict[str, Any]], steps: Sequence[int]
) -> tuple[dict[int, float | None], dict[int, float | None]]:
    """Per step, from its attempt lines: the share that crashed, and the pass rate of the attempts
    not masked as infrastructure with a masked crash counted 0 (None: no attempt line)."""
    crash: dict[int, float | None] = dict.fromkeys(steps)
    passed: dict[int, float | None] = dict.fromkeys(steps)
    by_step: dict[int, list[dict[str, Any]]] = {}
    for record in attempts:
        if isinstance(record.get("rollout_id"), int):
            by_step.setdefault(record["rollout_id"], []).append(record)
    for step, records in by_step.items():
        crashes = [r for r in records if is_crash(r)]
        valid = [r for r in records if r.get("attempt_class") == VALID]
        scored = [float(r.get("reward") or 0.0) for r in valid]
        scored += [0.0 for r in crashes if r.get("attempt_class") != VALID]
        crash[step] = len(crashes) / len(records)
        passed[step] = sum(scored) / len(scored) if scored else None
    return crash, passed


def load_arm(name: str, run_dir: Path, eval_dataset: str | None = None) -> ArmCurves:
    """A run's curves from its folder (a ValueError names a record with a wrong-typed field);
    `eval_pass` is `eval_dataset`'s pass rate at its last eval, when there is one."""
    run = load_run(run_dir)
    steps = run.step_ids
    shift: dict[int, float | None] = {step: None for step in steps}
    for record in read_records(run.source, ADVANTAGE_KIND):
        rollout_id, metrics = record.get("rollout_id"), record.get("metrics")
        if not isinstance(rollout_id, int) or not isinstance(metrics, dict):
            raise ValueError(
                f"{run.source}: an advantage line needs an integer rollout_id and a metrics object"
            )
        value = metrics.get(ADVANTAGE_SHIFT)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"{run.source}: advantage line {rollout_id}: {ADVANTAGE_SHIFT} is not a number")
        shift[rollout_id] = None if value is None else float(value)
    evals = sorted((e for e in run.evals if e.dataset == eval_dataset), key=lambda e: e.rollout_id)
    eval_pass = evals[-1].metric(PASS_RATE) if evals else None

    def step_metric(name: str) -> dict[int, float | None]:
        return {s: None if (step := run.steps.get(s)) is None else step.metric(name) for s in steps}

    def train_metric(name: str) -> dict[int, float | None]:
        return {s: None if (rec := run.train.get(s)) is None else rec.metric(name) for s in steps}

    trained = train_metric(VALID_SAMPLES)
    scales = {s: v if trained[s] else None for s, v in train_metric(LOSS_SCALE).items()}
    crash, passed = crash_series(read_records(run.source, "attempt"), steps)
    return ArmCurves(
        name=name,
        run_dir=str(run_dir),
        steps=steps,
        unfiltered_mean=step_metric(UNFILTERED_MEAN),
        loss_scale=scales,
        advantage_shift=shift,
        chance_level=chance_level(run),
        eval_pass=eval_pass,
        crash_rate=crash,
        pass_rate=passed,
    )


def run_figures(curves: ArmCurves, total_steps: int, goal: float) -> dict[str, float]:
    """The run's figures (`ab.stats.curve_figures`; NaN eval pass rate when it has no eval)."""
    return curve_figures(
        sorted(curves.unfiltered_mean.items()),
        [curves.loss_scale[s] for s in curves.steps],
        [curves.advantage_shift[s] for s in curves.steps],
        math.nan if curves.eval_pass is None else curves.eval_pass,
        total_steps,
        goal,
        crash_rates=[curves.crash_rate.get(s) for s in curves.steps],
        pass_rates=[curves.pass_rate.get(s) for s in curves.steps],
    )


def _step_means(runs: Sequence[ArmCurves], pick: str, steps: Sequence[int]) -> dict[int, float | None]:
    out: dict[int, float | None] = {}
    for step in steps:
        values = [v for run in runs if (v := getattr(run, pick).get(step)) is not None]
        out[step] = sum(values) / len(values) if values else None
    return out


def mean_curves(name: str, runs: Sequence[ArmCurves]) -> ArmCurves:
    """One arm's curves averaged over its seeds' runs, step by step (a step no run has a value
    for stays None)."""
    steps = sorted({step for run in runs for step in run.steps})
    levels = {run.chance_level for run in runs if run.chance_level is not None}
    passes = [run.eval_pass for run in runs if run.eval_pass is not None]
    return ArmCurves(
        name=name,
        run_dir=", ".join(run.run_dir for run in runs),
        steps=steps,
        unfiltered_mean=_step_means(runs, "unfiltered_mean", steps),
        loss_scale=_step_means(runs, "loss_scale", steps),
        advantage_shift=_step_means(runs, "advantage_shift", steps),
        chance_level=levels.pop() if len(levels) == 1 else None,
        eval_pass=sum(passes) / len(passes) if passes else None,
        crash_rate=_step_means(runs, "crash_rate", steps),
        pass_rate=_step_means(runs, "pass_rate", steps),
    )


# ---- the page -------------------------------------------------------------------------------------


def _categories(arms: Sequence[ArmCurves]) -> list[int]:
    return sorted({step for arm in arms for step in arm.steps})


def _series(arms: Sequence[ArmCurves], pick: str) -> list[Series]:
    steps = _categories(arms)
    return [
        Series(arm.name, ARM_COLORS[number % len(ARM_COLORS)], [getattr(arm, pick).get(s) for s in steps])
        for number, arm in enumerate(arms)
    ]


def _chart(
    arms: Sequence[ArmCurves], pick: str, y_label: str, extra: Sequence[Series] = (), **kwargs: Any
) -> tuple[str, list[Series]]:
    """A line per arm (plus `extra` lines); "" when no arm has a value."""
    series = _series(arms, pick)
    if not any(v is not None for s in series for v in s.values):
        return "", series
    series = [*series, *extra]
    categories = [str(s) for s in _categories(arms)]
    return line_chart(categories, series, x_label=STEP_AXIS, y_label=y_label, **kwargs), series


def _learning(mode: str, arms: Sequence[ArmCurves]) -> str:
    title = f"{mode}: learning, unfiltered valid mean per step (mean over seeds)"
    caption = (
        "Each arm's <b>reward/unfiltered_mean</b>: valid attempts of every group, before the filter, "
        "averaged over the arm's seeds. Dashed: the task's chance level."
    )
    levels = {arm.chance_level for arm in arms if arm.chance_level is not None}
    steps = len(_categories(arms))
    chance = [Series("chance", "#757575", [levels.pop()] * steps, True)] if len(levels) == 1 else []
    chart, series = _chart(arms, "unfiltered_mean", "mean reward", chance, y_range=(0.0, 1.0))
    body = chart + legend(series) if chart else page.no_data("no arm has reward/unfiltered_mean.")
    return page.section(f"chart-compare-learning-{mode}", title, caption, body)


def _scale(mode: str, arms: Sequence[ArmCurves]) -> str:
    title = f"{mode}: gradient scale per step (train/loss_scale)"
    caption = (
        "The scale the pg-loss reducer gave the step's gradient relative to a mean over its valid samples: "
        "1.0 when nothing is masked or the reducer ignores masked samples (rl360's valid_sample_mean); the "
        "valid share under Miles' default reducer, which counts masked samples in the denominator."
    )
    chart, series = _chart(arms, "loss_scale", "gradient scale", width=HALF_WIDTH)
    body = chart + legend(series) if chart else page.no_data("no arm has train/loss_scale.")
    return page.section(f"chart-compare-scale-{mode}", title, caption, body)


def _shift(mode: str, arms: Sequence[ArmCurves]) -> str:
    title = f"{mode}: advantage shift per step (advantage/shift)"
    caption = (
        "Over the step's valid trained samples: the mean advantage the arm's reward post-process gave "
        "them minus the mean rl360's per-group valid baseline gives the same samples (0 under rl360's "
        "rules by construction). Positive: scoring failures 0 lowered the baseline, so every valid "
        "sibling of a failure is pushed up, right or wrong."
    )
    chart, series = _chart(arms, "advantage_shift", "advantage shift", width=HALF_WIDTH)
    body = chart + legend(series) if chart else page.no_data("no arm has advantage lines.")
    return page.section(f"chart-compare-shift-{mode}", title, caption, body)


def render_compare(
    table: dict[str, dict[str, dict[str, Any]]],
    summary: Sequence[str],
    curves: dict[str, list[ArmCurves]],
    goal: float,
) -> str:
    """The page: the summary sentences and the interval table, then each mode's three charts."""
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = "".join(f"<li>{escape(line)}</li>" for line in summary)
    header = [column.replace("goal", f"{goal:g}") for column in TABLE_COLUMNS]
    numeric = [False, False, *[True] * (len(header) - 2)]
    charts = "".join(
        _learning(mode, arms) + f'<div class="pair">{_scale(mode, arms)}{_shift(mode, arms)}</div>'
        for mode, arms in curves.items()
    )
    body = "".join(
        (
            "<h1>rl360 fault A/B</h1>",
            f'<p class="meta">modes {escape(", ".join(curves))}; each cell: mean [95% interval] over '
            f"seeds ({escape(INTERVAL_NOTE)}). Generated {generated}.</p>",
            '<section class="chart" id="compare-summary"><h2>What the intervals show</h2>',
            f'<ul class="notes">{lines}</ul>{page.table(header, table_rows(table), numeric)}</section>',
            charts,
        )
    )
    csp = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        f'<meta name="viewport" content="width={FULL_WIDTH + 40}">'
        f"<title>rl360 fault A/B</title><style>{CSS}</style></head><body>{body}</body></html>\n"
    )


def _replace(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def _json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def write_compare(
    out: Path,
    runs: Sequence[RunFolder],
    steps: int,
    goal: float,
    eval_dataset: str | None = None,
) -> tuple[Path, Path, dict[str, Any]]:
    """Read every run, write `compare.html` and `compare.json` in `out`; the two paths and the
    document compare.json holds (its "table" and "summary" among it)."""
    records = []
    grouped: dict[str, dict[str, list[ArmCurves]]] = {}
    for run in runs:
        curves = load_arm(run.arm, run.path, eval_dataset)
        figures = run_figures(curves, steps, goal)
        grouped.setdefault(run.mode, {}).setdefault(run.arm, []).append(curves)
        records.append(
            {
                "mode": run.mode,
                "arm": run.arm,
                "seed": run.seed,
                "run_dir": str(run.path),
                "figures": figures,
                "curves": asdict(curves),
            }
        )
    table = summarize(records)
    summary = summary_sentences(table)
    means = {mode: [mean_curves(arm, runs) for arm, runs in arms.items()] for mode, arms in grouped.items()}
    document = {
        "settings": {"steps": steps, "goal": goal, "eval_dataset": eval_dataset},
        "interval": INTERVAL_NOTE,
        "censoring": f"a run that never reaches {goal:g} counts as {steps} steps",
        "table": table,
        "summary": summary,
        "runs": [{**r, "figures": {k: _json_number(v) for k, v in r["figures"].items()}} for r in records],
    }
    out.mkdir(parents=True, exist_ok=True)
    html, numbers = out / COMPARE_HTML, out / COMPARE_JSON
    _replace(html, render_compare(table, summary, means, goal))
    _replace(numbers, json.dumps(document, indent=2) + "\n")
    return html, numbers, document
