"""The fault A/B's combined report: every arm's curves on one page, and what they show in words.

Owns reading the arms' run folders (each an `rl360 demo` output: `metrics.jsonl` with its step,
attempt, `train` and `advantage` lines), reducing them to per-step series and writing
`compare.html` (inline SVG, no script, the step report's style: `rl360_ext.diagnostics.report`)
and `compare.json` (the same numbers). Three charts, one line per arm:

- learning: `reward/unfiltered_mean` (valid attempts of every group, before the filter), with the
  task's chance level dashed;
- gradient scale: `train/loss_scale`, the scale the pg-loss reducer gave the step's gradient
  relative to a mean over its valid samples (1.0 when nothing is masked or when the reducer
  ignores masked samples; the valid share under Miles' default reducer);
- advantage shift: `advantage/shift` from the `advantage` line the driver writes after the
  reward post-process (`rl360_ext.local.arms.advantage_metrics`): over the step's valid trained
  samples, the mean advantage the arm's hook gave them minus the mean rl360's per-group valid
  baseline gives the same samples. 0 under rl360's rules by construction; positive when a rule
  scores failures 0 and so lowers the baseline every valid sibling is measured against.

The text summary is computed from the same numbers: per arm the first, last and late mean (the
last third of the steps, with its standard error over the valid attempts' rewards), the mean
and lowest gradient scale, the mean and largest advantage shift; per other arm its late-mean
difference from the first arm in standard errors. It does not run anything
(`rl360_ext.local.compare` runs the arms).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from typing import Any

from rl360_ext.diagnostics import page
from rl360_ext.diagnostics.charts import FULL_WIDTH, HALF_WIDTH, Series, legend, line_chart
from rl360_ext.diagnostics.report import CSS, STEP_AXIS
from rl360_ext.diagnostics.report_data import chance_level, load_run
from rl360_ext.outcomes.provenance import VALID
from rl360_ext.rollout.metrics import records_by_kind

ADVANTAGE_KIND = "advantage"  # one per step: {"kind", "rollout_id", "metrics": {"advantage/...": x}}
COMPARE_HTML = "compare.html"
COMPARE_JSON = "compare.json"
UNFILTERED_MEAN = "reward/unfiltered_mean"
LOSS_SCALE = "train/loss_scale"
MASKED_SAMPLES = "train/masked_samples"
ADVANTAGE_SHIFT = "advantage/shift"
LATE_FRACTION = 3  # the late mean covers the last third of the steps
NOISE_STANDARD_ERRORS = 2.0  # a late-mean difference within this many standard errors reads as noise
ARM_COLORS = ("#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a", "#c62828")


@dataclass
class ArmCurves:
    """One arm's per-step series (keyed by rollout step) and the rewards behind its late mean."""

    name: str
    run_dir: str
    steps: list[int]
    unfiltered_mean: dict[int, float | None]
    loss_scale: dict[int, float | None]
    masked_samples: dict[int, float | None]
    advantage_shift: dict[int, float | None]
    valid_rewards: dict[int, list[float]]
    chance_level: float | None


def load_arm(name: str, run_dir: Path) -> ArmCurves:
    """An arm's curves from its run folder (a ValueError names a record with a wrong-typed field)."""
    run = load_run(run_dir)
    steps = run.step_ids
    shift: dict[int, float | None] = {step: None for step in steps}
    for record in records_by_kind(run.source).get(ADVANTAGE_KIND, []):
        rollout_id, metrics = record.get("rollout_id"), record.get("metrics")
        if not isinstance(rollout_id, int) or not isinstance(metrics, dict):
            raise ValueError(
                f"{run.source}: an advantage line needs an integer rollout_id and a metrics object"
            )
        value = metrics.get(ADVANTAGE_SHIFT)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"{run.source}: advantage line {rollout_id}: {ADVANTAGE_SHIFT} is not a number")
        shift[rollout_id] = None if value is None else float(value)
    rewards: dict[int, list[float]] = {step: [] for step in steps}
    for attempt in run.attempts:
        if attempt.attempt_class == VALID and attempt.reward is not None:
            rewards[attempt.rollout_id].append(attempt.reward)

    def step_metric(name: str) -> dict[int, float | None]:
        return {s: None if (step := run.steps.get(s)) is None else step.metric(name) for s in steps}

    def train_metric(name: str) -> dict[int, float | None]:
        return {s: None if (rec := run.train.get(s)) is None else rec.metric(name) for s in steps}

    return ArmCurves(
        name=name,
        run_dir=str(run_dir),
        steps=steps,
        unfiltered_mean=step_metric(UNFILTERED_MEAN),
        loss_scale=train_metric(LOSS_SCALE),
        masked_samples=train_metric(MASKED_SAMPLES),
        advantage_shift=shift,
        valid_rewards=rewards,
        chance_level=chance_level(run),
    )


# ---- the numbers the summary states ----------------------------------------------------------------


@dataclass
class ArmFacts:
    """What the summary says about one arm."""

    name: str
    first_step: int | None
    first_mean: float | None
    last_step: int | None
    last_mean: float | None
    late_steps: list[int]
    late_mean: float | None
    late_standard_error: float | None
    late_valid_attempts: int
    loss_scale_mean: float | None
    loss_scale_min: float | None
    masked_samples: int
    shift_mean: float | None
    shift_max: float | None
    shift_max_step: int | None


def _present(series: dict[int, float | None]) -> list[tuple[int, float]]:
    return [(step, value) for step, value in sorted(series.items()) if value is not None]


def arm_facts(arm: ArmCurves) -> ArmFacts:
    means = _present(arm.unfiltered_mean)
    late = arm.steps[-max(1, len(arm.steps) // LATE_FRACTION) :] if arm.steps else []
    rewards = [r for step in late for r in arm.valid_rewards.get(step, [])]
    late_mean = sum(rewards) / len(rewards) if rewards else None
    error = None
    if late_mean is not None and len(rewards) > 1:
        variance = sum((r - late_mean) ** 2 for r in rewards) / (len(rewards) - 1)
        error = math.sqrt(variance / len(rewards))
    scales = [v for _, v in _present(arm.loss_scale)]
    shifts = _present(arm.advantage_shift)
    top = max(shifts, key=lambda item: item[1]) if shifts else None
    return ArmFacts(
        name=arm.name,
        first_step=means[0][0] if means else None,
        first_mean=means[0][1] if means else None,
        last_step=means[-1][0] if means else None,
        last_mean=means[-1][1] if means else None,
        late_steps=list(late),
        late_mean=late_mean,
        late_standard_error=error,
        late_valid_attempts=len(rewards),
        loss_scale_mean=sum(scales) / len(scales) if scales else None,
        loss_scale_min=min(scales) if scales else None,
        masked_samples=int(sum(v for _, v in _present(arm.masked_samples))),
        shift_mean=sum(v for _, v in shifts) / len(shifts) if shifts else None,
        shift_max=None if top is None else top[1],
        shift_max_step=None if top is None else top[0],
    )


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "n/a" if value is None else format(value, spec)


def _span(steps: Sequence[int]) -> str:
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"


def arm_sentence(facts: ArmFacts) -> str:
    if facts.first_mean is None:
        return f"{facts.name}: no step had a valid attempt."
    late = (
        f"mean over {_span(facts.late_steps)} {_fmt(facts.late_mean)}"
        + ("" if facts.late_standard_error is None else f" ± {_fmt(facts.late_standard_error)} (1 s.e.)")
        + f" from {facts.late_valid_attempts} valid attempts"
    )
    scale = (
        "no train step"
        if facts.loss_scale_mean is None
        else f"gradient scale {_fmt(facts.loss_scale_mean, '.2f')} on average, lowest "
        f"{_fmt(facts.loss_scale_min, '.2f')} ({facts.masked_samples} masked samples in its trained batches)"
    )
    shift = (
        "no advantage line"
        if facts.shift_mean is None
        else f"advantage shift {_fmt(facts.shift_mean, '+.3f')} on average, largest "
        f"{_fmt(facts.shift_max, '+.3f')} (step {facts.shift_max_step})"
    )
    return (
        f"{facts.name}: unfiltered mean {_fmt(facts.first_mean)} (step {facts.first_step}) -> "
        f"{_fmt(facts.last_mean)} (step {facts.last_step}), {late}; {scale}; {shift}."
    )


def difference_sentence(arm: ArmFacts, reference: ArmFacts) -> str | None:
    """How `arm`'s late mean compares with `reference`'s, in standard errors of the difference."""
    if arm.late_mean is None or reference.late_mean is None:
        return None
    delta = arm.late_mean - reference.late_mean
    errors = [e for e in (arm.late_standard_error, reference.late_standard_error) if e is not None]
    combined = math.sqrt(sum(e * e for e in errors)) if errors else 0.0
    if combined == 0:
        verdict = "no spread to judge it against"
    else:
        ratio = abs(delta) / combined
        verdict = f"{ratio:.1f} standard errors: " + (
            "within noise" if ratio < NOISE_STANDARD_ERRORS else f"beyond {NOISE_STANDARD_ERRORS:g}"
        )
    direction = "above" if delta > 0 else "below" if delta < 0 else "level with"
    return (
        f"{arm.name} vs {reference.name}, late mean: {delta:+.3f} ({direction} {reference.name}; {verdict})."
    )


def summary_lines(arms: Sequence[ArmCurves]) -> list[str]:
    """The computed text summary: one sentence per arm, then each other arm against the first."""
    facts = [arm_facts(arm) for arm in arms]
    lines = [arm_sentence(f) for f in facts]
    for other in facts[1:]:
        if (line := difference_sentence(other, facts[0])) is not None:
            lines.append(line)
    return lines


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


def _learning(arms: Sequence[ArmCurves]) -> str:
    title = "Learning: unfiltered valid mean per step, every arm"
    caption = (
        "Each arm's <b>reward/unfiltered_mean</b>: valid attempts of every group, before the filter. "
        "Dashed: the task's chance level."
    )
    levels = {arm.chance_level for arm in arms if arm.chance_level is not None}
    steps = len(_categories(arms))
    chance = [Series("chance", "#757575", [levels.pop()] * steps, True)] if len(levels) == 1 else []
    chart, series = _chart(arms, "unfiltered_mean", "mean reward", chance, y_range=(0.0, 1.0))
    if not chart:
        return page.section(
            "chart-compare-learning", title, caption, page.no_data("no arm has reward/unfiltered_mean.")
        )
    return page.section("chart-compare-learning", title, caption, chart + legend(series))


def _scale(arms: Sequence[ArmCurves]) -> str:
    title = "Gradient scale per step (train/loss_scale)"
    caption = (
        "The scale the pg-loss reducer gave the step's gradient relative to a mean over its valid samples: "
        "1.0 when nothing is masked or the reducer ignores masked samples (rl360's valid_sample_mean); the "
        "valid share under Miles' default reducer, which counts masked samples in the denominator."
    )
    chart, series = _chart(arms, "loss_scale", "gradient scale", width=HALF_WIDTH)
    body = chart + legend(series) if chart else page.no_data("no arm has train/loss_scale.")
    return page.section("chart-compare-scale", title, caption, body)


def _shift(arms: Sequence[ArmCurves]) -> str:
    title = "Advantage shift per step (advantage/shift)"
    caption = (
        "Over the step's valid trained samples: the mean advantage the arm's reward post-process gave "
        "them minus the mean rl360's per-group valid baseline gives the same samples (0 under rl360's "
        "rules by construction). Positive: scoring failures 0 lowered the baseline, so every valid "
        "sibling of a failure is pushed up, right or wrong."
    )
    chart, series = _chart(arms, "advantage_shift", "advantage shift", width=HALF_WIDTH)
    body = chart + legend(series) if chart else page.no_data("no arm has advantage lines.")
    return page.section("chart-compare-shift", title, caption, body)


def _arm_table(arms: Sequence[ArmCurves]) -> str:
    rows = []
    for arm in arms:
        facts = arm_facts(arm)
        rows.append(
            (
                arm.name,
                arm.run_dir,
                str(len(arm.steps)),
                _fmt(facts.first_mean),
                _fmt(facts.last_mean),
                _fmt(facts.late_mean),
                _fmt(facts.late_standard_error),
                _fmt(facts.loss_scale_mean, ".2f"),
                _fmt(facts.shift_mean, "+.3f"),
            )
        )
    header = ("arm", "run", "steps", "first mean", "last mean", "late mean", "late s.e.", "scale", "shift")
    return page.table(header, rows, (False, False, True, True, True, True, True, True, True))


def render_compare(arms: Sequence[ArmCurves]) -> str:
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    summary = "".join(f"<li>{escape(line)}</li>" for line in summary_lines(arms))
    body = "".join(
        (
            "<h1>rl360 fault A/B</h1>",
            f'<p class="meta">{escape(", ".join(a.name for a in arms))}: one run folder each. '
            f"Generated {generated}.</p>",
            '<section class="chart" id="compare-summary"><h2>What the curves show</h2>',
            f'<ul class="notes">{summary}</ul>{_arm_table(arms)}</section>',
            _learning(arms),
            f'<div class="pair">{_scale(arms)}{_shift(arms)}</div>',
        )
    )
    csp = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        f'<meta name="viewport" content="width={FULL_WIDTH + 40}">'
        f"<title>rl360 fault A/B</title><style>{CSS}</style></head><body>{body}</body></html>\n"
    )


def compare_json(arms: Sequence[ArmCurves]) -> dict[str, Any]:
    return {
        "arms": [asdict(arm) for arm in arms],
        "facts": [asdict(arm_facts(arm)) for arm in arms],
        "summary": summary_lines(arms),
    }


def _replace(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def write_compare(out: Path, arms: Sequence[tuple[str, Path]]) -> tuple[Path, Path, list[str]]:
    """Read every (name, run folder) arm, write `compare.html` and `compare.json` in `out`; the
    paths and the summary lines."""
    curves = [load_arm(name, run_dir) for name, run_dir in arms]
    out.mkdir(parents=True, exist_ok=True)
    page, numbers = out / COMPARE_HTML, out / COMPARE_JSON
    _replace(page, render_compare(curves))
    _replace(numbers, json.dumps(compare_json(curves), indent=2) + "\n")
    return page, numbers, summary_lines(curves)
