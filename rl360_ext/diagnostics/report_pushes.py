"""The step report's weight-push sections: push duration and engine calls per push, the engines
each push reached, and the table of recent pushes (incomplete or failed ones always listed).
"""

from __future__ import annotations

import statistics

from rl360_ext.diagnostics import page
from rl360_ext.diagnostics.charts import (
    FULL_WIDTH,
    HALF_WIDTH,
    Series,
    bar_chart,
    format_seconds,
    legend,
)
from rl360_ext.diagnostics.report_data import Run, WeightPushRecord
from rl360_ext.diagnostics.report_style import PALETTE, empty_note, number_or_na, number_range

PUSH_TABLE_ROWS = 20  # the most recent pushes; incomplete or failed ones are always listed


MAX_ENGINE_SERIES = 12


PUSH_DURATION = (
    "chart-pushes",
    "7a. Weight pushes: duration",
    "Wall time of each push (pause, update, resume, version read-back), coloured by the path it took. "
    "A push that silently takes a slow path shows up here and in the calls per engine.",
)


PUSH_CALLS = (
    "chart-push-calls",
    "7b. Weight pushes: update calls per engine",
    "update_weights calls each engine received per push: one per engine on the direct from-disk path; "
    "hundreds or thousands when weights go tensor by tensor.",
)


PUSH_ENGINES = (
    "chart-push-engines",
    "7c. Weight pushes: engines and stale-served tokens",
    "Per push: the live engines it had to reach (weights/engines_expected), those it reached "
    "(weights/engines_reached), those it fenced for not confirming in time (weights/engines_fenced), "
    "and policy tokens sampled on weights older than the published version since the previous push "
    "(weights/stale_served_tokens). Reached below expected, or any stale-served token, is a push to read.",
)


def _push_metric(push: WeightPushRecord, name: str, fallback: float | None = None) -> float | None:
    value = push.metrics.get(name, fallback)
    return None if value is None or isinstance(value, bool) else float(value)


def _push_engines(run: Run) -> str:
    labels = [p.label for p in run.pushes]
    series = [
        Series(
            "engines expected",
            "#90caf9",
            [_push_metric(p, "weights/engines_expected", p.engines_targeted) for p in run.pushes],
        ),
        Series(
            "engines reached",
            "#1e88e5",
            [_push_metric(p, "weights/engines_reached", p.engines_reached) for p in run.pushes],
        ),
        Series("engines fenced", "#e53935", [_push_metric(p, "weights/engines_fenced") for p in run.pushes]),
        Series(
            "stale-served tokens",
            "#6d4c41",
            [_push_metric(p, "weights/stale_served_tokens") for p in run.pushes],
        ),
    ]
    series = [s for s in series if any(v is not None for v in s.values)]
    body = empty_note(series, "engine counts (engines_targeted, weights/*)") or (
        bar_chart(labels, series, x_label="push", y_label="engines / tokens", stacked=False, width=FULL_WIDTH)
        + legend(series)
    )
    return page.section(*PUSH_ENGINES, body)


def _push_duration(run: Run) -> str:
    labels = [p.label for p in run.pushes]
    paths = sorted({p.path for p in run.pushes})
    series = [
        Series(
            path, PALETTE[i % len(PALETTE)], [p.duration_s if p.path == path else None for p in run.pushes]
        )
        for i, path in enumerate(paths)
    ]
    body = empty_note(series, "push duration (duration_s)") or (
        bar_chart(labels, series, x_label="push", y_label="duration", fmt=format_seconds, width=HALF_WIDTH)
        + legend(series)
    )
    return page.section(*PUSH_DURATION, body)


def _push_calls(run: Run) -> str:
    engines = sorted({engine for p in run.pushes for engine in p.update_calls_per_engine})
    if len(engines) <= MAX_ENGINE_SERIES:
        series = [
            Series(
                engine, PALETTE[i % len(PALETTE)], [p.update_calls_per_engine.get(engine) for p in run.pushes]
            )
            for i, engine in enumerate(engines)
        ]
    else:
        calls = [sorted(p.update_calls_per_engine.values()) for p in run.pushes]
        series = [
            Series("min over engines", "#90caf9", [v[0] if v else None for v in calls]),
            Series("median over engines", "#1e88e5", [statistics.median(v) if v else None for v in calls]),
            Series("max over engines", "#0d47a1", [v[-1] if v else None for v in calls]),
        ]
    labels = [p.label for p in run.pushes]
    body = empty_note(series, "update call count (update_calls_per_engine)") or (
        bar_chart(labels, series, x_label="push", y_label="update calls", stacked=False, width=HALF_WIDTH)
        + legend(series)
    )
    return page.section(*PUSH_CALLS, body)


def _push_table(run: Run) -> str:
    recent = len(run.pushes) - PUSH_TABLE_ROWS
    shown = [p for n, p in enumerate(run.pushes) if n >= recent or p.complete is False or p.failures]
    rows = [
        (
            p.label,
            p.path,
            "n/a" if p.duration_s is None else format_seconds(p.duration_s),
            f"{number_or_na(p.engines_reached)} / {number_or_na(p.engines_targeted)}",
            number_range(list(p.update_calls_per_engine.values())),
            number_range(list(p.control_calls_per_engine.values())),
            {True: "yes", False: "NO", None: "n/a"}[p.complete],
            str(p.failures),
            str(p.metrics.get("weights/reason", "n/a")),
            {True: "YES", False: "no", None: "n/a"}[_degraded(p.metrics.get("weights/degraded"))],
        )
        for p in shown
    ]
    header = (
        "push"
        if len(shown) == len(run.pushes)
        else f"push ({len(shown)} of {len(run.pushes)}: incomplete or recent)",
        "path",
        "duration",
        "engines reached / targeted",
        "update calls per engine",
        "control calls per engine",
        "complete",
        "failures",
        "reason",
        "degraded",
    )
    numeric = (False, False, True, True, True, True, False, True, False, False)
    return f'<section class="table" id="push-table">{page.table(header, rows, numeric)}</section>'


def _degraded(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def push_sections(run: Run) -> str:
    if not run.pushes:
        why = page.no_data(
            "no weight_push records. Miles' own weight sync does not write them (the metrics hook writes "
            "step and attempt lines only); rl360 demo appends one per push."
        )
        return (
            f'<div class="pair">{page.section(*PUSH_DURATION, why)}{page.section(*PUSH_CALLS, why)}</div>'
            + page.section(*PUSH_ENGINES, why)
        )
    pair = f'<div class="pair">{_push_duration(run)}{_push_calls(run)}</div>'
    return pair + _push_engines(run) + _push_table(run)
