"""`rl360 report RUN_DIR [--out report.html]`: a self-contained HTML step report of an rl360 run.

Owns the page: a summary table and six charts (attempt outcomes per step, unfiltered vs kept
reward, phase durations, infrastructure failures by cause, prefix-cache hit rate and routing
bytes, weight pushes) plus, for a run with `eval` lines (`rl360_ext.rollout.eval_metrics`), eval
pass rates beside the training curve with upstream's number dashed and the eval infra rate, and,
for a run that trained (`train` lines, as `rl360 demo` writes them
with the reference trainer), the learning curve against the task's chance level and the trust
metrics of every train step, and, when the samples carried per-token version arrays, the
token-age histogram and the mixed-version, stale-KV and R3-provenance shares per step (no section
at all otherwise; from the train records, else the step records' `miles_metrics`), and the task
health during training (the `tasks/*` metrics per step and the tasks quarantined during the run
with their evidence, `TASK_STEP_SERIES`, `TASK_RUN_SERIES`), and the step gate's verdicts
(`report_gate`, from `gate` lines), each drawn as
inline SVG (charts.py) from the run's metrics JSONL
(report_data.py). The page has no script and loads nothing: its content security policy is
`default-src 'none'`, so it renders the same offline, from a file, or attached to a ticket. A
chart whose data the run does not have says so ("no data in this run: <why>") instead of
drawing an empty axis. It does not compute training metrics (the metrics hook does) or run
anything.

What it reads: RUN_DIR/metrics.jsonl (or, without one, the folder's only *.jsonl; or RUN_DIR
itself when it is a file): `step` and `attempt` lines written by
`rl360_ext.rollout.metrics.log_rollout_metrics`, and `weight_push` lines a driver such as
`rl360 demo` appends, and the `train` lines of its reference trainer. Other *.jsonl files in
the folder are listed on the page as not read.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape
from pathlib import Path

from rl360_ext.diagnostics import page
from rl360_ext.diagnostics.charts import (
    FULL_WIDTH,
    HALF_WIDTH,
    Formatter,
    Series,
    bar_chart,
    format_bytes,
    format_number,
    format_percent,
    format_seconds,
    hbar_chart,
    legend,
    line_chart,
)
from rl360_ext.diagnostics.report_data import (
    OUTCOMES,
    PHASES,
    Attempt,
    Run,
    Summary,
    WeightPushRecord,
    attributions,
    cache_and_routing,
    chance_level,
    eval_metric_series,
    eval_steps,
    infra_causes,
    load_run,
    outcome_counts,
    phase_stats,
    quarantined_during_run,
    slowest_attempts,
    step_counts,
    step_metric_series,
    summary,
    train_metric_series,
    trained_metric_series,
)
from rl360_ext.diagnostics.report_gate import gate_section
from rl360_ext.rollout.occupancy import PHASES as OCCUPANCY_PHASES
from rl360_ext.rollout.occupancy import timeline as occupancy_timeline

REPORT_FILE = "report.html"
SLOWEST_ATTEMPTS = 25
REWARD_TABLE_STEPS = 20
PUSH_TABLE_ROWS = 20  # the most recent pushes; incomplete or failed ones are always listed
MAX_ENGINE_SERIES = 12
STEP_AXIS = "rollout step"

OUTCOME_STYLE = {
    "passed": ("passed (reward > 0)", "#2e7d32"),
    "failed": ("failed (reward ≤ 0)", "#ef6c00"),
    "dropped_all_passed": ("group dropped: all passed", "#a5d6a7"),
    "dropped_all_failed": ("group dropped: all failed", "#ffcc80"),
    "dropped_insufficient_valid": ("group dropped: < 2 valid rewards", "#b0bec5"),
    "dropped_other": ("group dropped: other filter reason", "#78909c"),
    "unused": ("unused (batch already full)", "#81d4fa"),
    "infra": ("infrastructure failure", "#7b1fa2"),
    "unknown": ("unknown (no class or no reward)", "#424242"),
}
PHASE_STYLE = {
    "queue": ("queue", "#90a4ae"),
    "environment_setup": ("sandbox setup", "#8d6e63"),
    "agent_setup": ("agent setup", "#ffb300"),
    "agent": ("agent", "#1e88e5"),
    "verifier": ("verifier", "#43a047"),
}
OCCUPANCY_STYLE = {
    "queue": ("queue", "#90a4ae"),
    "sandbox_setup": ("sandbox setup", "#8d6e63"),
    "model": ("waiting on the model", "#1e88e5"),
    "tools": ("running tools", "#ffb300"),
    "verifier": ("verifier", "#43a047"),
}
TIMELINE_POINTS = 16  # moments of the in-flight timeline: few enough that every time label reads
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#393b79",
    "#ad494a",
)

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: #212121;
       margin: 24px auto; max-width: 1340px; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 0 0 4px; }
.meta { color: #616161; font-size: 13px; margin: 0 0 12px; }
table { border-collapse: collapse; font-size: 13px; margin: 6px 0; }
th, td { border: 1px solid #e0e0e0; padding: 3px 10px; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f5f5f5; font-weight: 600; }
section.chart { border-top: 1px solid #e0e0e0; padding: 14px 0 6px; }
.pair { display: flex; gap: 20px; flex-wrap: wrap; }
.pair > section.chart { flex: 1 1 640px; }
.caption { color: #424242; font-size: 13px; margin: 0 0 6px; max-width: 1200px; }
.no-data { background: #fafafa; border: 1px dashed #bdbdbd; color: #616161; font-style: italic;
           padding: 18px; margin: 6px 0; }
.partial { background: #fafafa; border-left: 3px solid #bdbdbd; color: #616161; padding: 6px 12px;
           margin: 6px 0; }
.empty-ok { background: #f1f8e9; border: 1px solid #c5e1a5; color: #33691e; padding: 18px; margin: 6px 0; }
.notes { background: #fff8e1; border: 1px solid #ffe082; padding: 6px 14px; font-size: 13px; }
ul.legend { list-style: none; display: flex; flex-wrap: wrap; gap: 4px 16px; padding: 0; margin: 4px 0 0;
            font-size: 12px; }
ul.legend li { display: flex; align-items: center; gap: 6px; }
.swatch { display: inline-block; width: 14px; height: 12px; }
.legend-note { color: #757575; }
svg { display: block; font-family: inherit; }
svg text { fill: #424242; }
svg text.total { font-weight: 600; fill: #212121; }
svg text.in-bar { font-size: 10px; }
svg text.axis-title { fill: #616161; font-size: 12px; }
svg line.grid { stroke: #eeeeee; } svg line.axis { stroke: #9e9e9e; }
"""


def _empty_note(series: Sequence[Series], what: str) -> str | None:
    """None when some bar has a positive value; otherwise the note that replaces an empty axis."""
    values = [v for s in series for v in s.values if v is not None]
    if any(v > 0 for v in values):
        return None
    if values:
        return f'<p class="empty-ok">Every {escape(what)} in this run is 0.</p>'
    return page.no_data(f"no record carries a {what}.")


def _optional(value: float | None) -> str:
    return "n/a" if value is None else format_number(value)


def _summary_section(run: Run, facts: Summary) -> str:
    def maybe(value: float | None, fmt: Formatter = format_number) -> str:
        return "n/a" if value is None else fmt(value)

    last = "" if facts.last_step is None else f" (rollout {facts.last_step})"
    steps = str(facts.steps) + (
        "" if facts.first_step is None else f" (rollout {facts.first_step}–{facts.last_step})"
    )
    trained = maybe(facts.trained) + ("" if facts.masked is None else f" ({facts.masked:,} masked)")
    pushes = f"{facts.pushes} ({facts.complete_pushes} complete)" if facts.pushes else "none recorded"
    rows = [
        ("Steps", steps),
        ("Attempts", format_number(facts.attempts)),
        ("Valid fraction", maybe(facts.valid_fraction, format_percent)),
        ("Infrastructure failure rate", maybe(facts.infra_rate, format_percent)),
        ("Kept mean, last step", maybe(facts.kept_mean_last) + last),
        ("Unfiltered mean, last step", maybe(facts.unfiltered_mean_last) + last),
        ("Trained samples", trained),
        ("Dropped groups", maybe(facts.dropped_groups)),
        ("Weight pushes", pushes),
    ]
    table = (
        '<table id="summary">'
        + "".join(f'<tr><th>{escape(k)}</th><td class="num">{escape(v)}</td></tr>' for k, v in rows)
        + "</table>"
    )
    notes = "".join(f"<li>{escape(note)}</li>" for note in run.notes)
    return table + (f'<div class="notes"><ul>{notes}</ul></div>' if notes else "")


def _outcomes_section(run: Run) -> str:
    title = "1. What happened to every attempt, per step"
    caption = (
        "Each attempt the dynamic filter saw, stacked by outcome. <b>passed</b>/<b>failed</b>: valid, in a "
        "group the trainer used, verifier reward &gt; 0 / ≤ 0. <b>group dropped</b>: the valid attempts of "
        "groups the filter dropped: all passed or all failed (zero reward spread), or fewer than two valid "
        "rewards. Infrastructure failures count here whatever happened to their group; they never enter a "
        "reward or a baseline."
    )
    ids = [str(rid) for rid in run.step_ids]
    if run.attempts:
        counts = outcome_counts(run)
        series = [
            Series(OUTCOME_STYLE[o][0], OUTCOME_STYLE[o][1], counts[o]) for o in OUTCOMES if any(counts[o])
        ]
        totals = [f"({sum(counts[o]):,})" for o in OUTCOMES if any(counts[o])]
        chart = bar_chart(ids, series, x_label=STEP_AXIS, y_label="attempts")
        return page.section("chart-outcomes", title, caption, chart + legend(series, totals))
    counted = step_counts(run)
    if not counted:
        return page.section(
            "chart-outcomes",
            title,
            caption,
            page.no_data(
                "the file has no attempt lines and no step carries attempt counts (count/attempts)."
            ),
        )
    valid = [counted[rid].valid if rid in counted else None for rid in run.step_ids]
    infra = [counted[rid].attempts - counted[rid].valid if rid in counted else None for rid in run.step_ids]
    series = [
        Series("valid (pass/fail unknown)", "#607d8b", valid),
        Series(OUTCOME_STYLE["infra"][0], OUTCOME_STYLE["infra"][1], infra),
    ]
    note = (
        '<p class="partial">This run has no attempt lines (written with --no-rl360-metrics-attempts or '
        "RL360_METRICS_ATTEMPTS=0): passed/failed and dropped groups per attempt are unknown; "
        "valid and infrastructure counts come from the step metrics.</p>"
    )
    if empty := _empty_note(series, "attempt count"):
        return page.section("chart-outcomes", title, caption, note + empty)
    chart = bar_chart(ids, series, x_label=STEP_AXIS, y_label="attempts")
    return page.section("chart-outcomes", title, caption, note + chart + legend(series))


def _rewards_section(run: Run) -> str:
    title = "2. Reward: every valid attempt vs the trained batch"
    caption = (
        "<b>unfiltered mean</b> (reward/unfiltered_mean): valid attempts of every group the filter saw, "
        "before dropping. <b>kept mean</b> (reward/kept_mean): valid samples of the trained batch. "
        "Dropping all-pass groups pulls the kept mean away from the unfiltered one. Dashed: what "
        "upstream Miles would log for the trained batch (failures as 0: audit/logged_mean_upstream)."
    )
    series = [
        Series("unfiltered mean", "#1565c0", step_metric_series(run, "reward/unfiltered_mean")),
        Series("kept mean", "#d81b60", step_metric_series(run, "reward/kept_mean")),
        Series(
            "upstream logged mean", "#757575", step_metric_series(run, "audit/logged_mean_upstream"), True
        ),
    ]
    drawn = [s for s in series if any(v is not None for v in s.values)]
    if not drawn:
        why = (
            "no step record carries reward/unfiltered_mean or reward/kept_mean."
            if run.steps
            else ("the file has no step records.")
        )
        return page.section("chart-rewards", title, caption, page.no_data(why))
    notes = ""
    if all(v is None for v in series[0].values):
        prefilters = sorted({s.prefilter or "missing" for s in run.steps.values()})
        notes = (
            '<p class="partial">reward/unfiltered_mean is null in every step (prefilter: '
            f"{escape(', '.join(prefilters))}): a dynamic filter other than rl360's ran, so the "
            "groups it dropped were never seen.</p>"
        )
    chart = line_chart(
        [str(rid) for rid in run.step_ids],
        drawn,
        x_label=STEP_AXIS,
        y_label="mean reward",
        y_range=(0.0, 1.0),
    )
    return page.section(
        "chart-rewards", title, caption, notes + chart + legend(drawn) + _reward_table(run, series)
    )


def _reward_table(run: Run, series: Sequence[Series]) -> str:
    unfiltered, kept, upstream = (s.values for s in series)
    rows = []
    for position in range(max(0, len(run.step_ids) - REWARD_TABLE_STEPS), len(run.step_ids)):
        u, k, up = unfiltered[position], kept[position], upstream[position]
        gap = None if u is None or k is None else k - u
        signed = "n/a" if gap is None else f"{gap:+.3f}"
        rows.append((str(run.step_ids[position]), _optional(u), _optional(k), signed, _optional(up)))
    shown = "" if len(rows) == len(run.step_ids) else f" (last {len(rows)} steps)"
    header = (f"rollout step{shown}", "unfiltered mean", "kept mean", "kept − unfiltered", "upstream logged")
    return page.table(header, rows, (False, True, True, True, True))


TRUST_FRACTIONS = (
    ("routing agreement", "#2e7d32", "train/routing_agreement"),
    ("loss scale", "#6a1b9a", "train/loss_scale"),
    ("pg clipfrac", "#ef6c00", "train/pg_clipfrac"),
    ("TIS clipfrac", "#00838f", "train/tis_clipfrac"),
)
MISMATCH_SERIES = (
    ("|Δ log p| mean", "#1565c0", "train/logprob_abs_diff_mean", False),
    ("|Δ log p| max", "#d81b60", "train/logprob_abs_diff_max", True),
    ("first token of a turn", "#2e7d32", "train/logprob_abs_diff_first_token_mean", False),
)
POLICY_LAG_SERIES = (
    ("lag |Δ log p| mean", "#ef6c00", "train/policy_lag_abs_diff_mean", False),
    ("lag |Δ log p| max", "#6a1b9a", "train/policy_lag_abs_diff_max", True),
    ("lag KL", "#00838f", "train/policy_lag_kl", False),
)
TRUST_TABLE = (
    ("|Δ log p| mean", "train/logprob_abs_diff_mean"),
    ("|Δ log p| max", "train/logprob_abs_diff_max"),
    ("first token", "train/logprob_abs_diff_first_token_mean"),
    ("top-k KL", "train/topk_kl"),
    ("top-k overlap", "train/topk_overlap"),
    ("TV bound max", "train/tv_bound_max"),
    ("routing agreement", "train/routing_agreement"),
    ("lag |Δ log p| mean", "train/policy_lag_abs_diff_mean"),
    ("lag |Δ log p| max", "train/policy_lag_abs_diff_max"),
    ("lag KL", "train/policy_lag_kl"),
    ("pg clipfrac", "train/pg_clipfrac"),
    ("TIS clipfrac", "train/tis_clipfrac"),
    ("grad norm", "train/grad_norm"),
    ("loss scale", "train/loss_scale"),
    ("valid", "train/valid_samples"),
    ("masked", "train/masked_samples"),
    ("train s", "train/time_s"),
)
NO_TRAIN = (
    "no train records. Miles' own trainer does not write them; rl360 demo appends one per step "
    "from the reference trainer."
)


def _learning_section(run: Run) -> str:
    title = "Learning: every valid attempt's mean reward per step, against chance"
    level = chance_level(run)
    caption = (
        "<b>unfiltered mean</b> (reward/unfiltered_mean): valid attempts of every group, before the "
        "filter, so it measures the policy, not the batch. Dashed: the task's chance level"
        + ("" if level is None else f" ({format_number(level)})")
        + ", declared by the driver in its train records."
    )
    values = step_metric_series(run, "reward/unfiltered_mean")
    if not any(v is not None for v in values):
        return page.section(
            "chart-learning", title, caption, page.no_data("no step record carries reward/unfiltered_mean.")
        )
    series = [Series("unfiltered mean", "#1565c0", values)]
    if level is not None:
        series.append(Series("chance", "#757575", [level] * len(values), True))
    note = "" if run.train else f'<p class="partial">{escape(NO_TRAIN)}</p>'
    chart = line_chart(
        [str(rid) for rid in run.step_ids],
        series,
        x_label=STEP_AXIS,
        y_label="mean reward",
        y_range=(0.0, 1.0),
    )
    return page.section("chart-learning", title, caption, note + chart + legend(series))


def _eval_section(run: Run) -> str:
    """Eval beside training (only for a run with eval records: no section otherwise)."""
    if not run.evals:
        return ""
    steps = eval_steps(run)
    datasets = sorted({e.dataset for e in run.evals})
    title = "Eval beside training: pass rate over valid attempts, infra rate beside it"
    caption = (
        "<b>training</b>: the unfiltered mean reward of the step's training attempts. Per eval "
        "dataset: <b>pass rate</b> (passes over valid attempts, "
        "<code>eval/&lt;name&gt;/pass_rate</code>) and, dashed, <b>upstream</b> (Miles' "
        "<code>eval/&lt;name&gt;</code>: mean reward with every infra attempt scored 0). Below: "
        "the share of each dataset's eval attempts lost to infrastructure."
    )
    if run.eval_notes:
        caption += (
            "<ul>"
            + "".join(
                f"<li><b>{escape(name)}</b>: {escape(note)}</li>"
                for name, note in sorted(run.eval_notes.items())
            )
            + "</ul>"
        )
    training = [
        None if (step := run.steps.get(rid)) is None else step.metric("reward/unfiltered_mean")
        for rid in steps
    ]
    series = [Series("training (unfiltered mean)", "#1565c0", training)]
    infra = []
    for number, dataset in enumerate(datasets):
        color = PALETTE[(number + 1) % len(PALETTE)]
        series.append(
            Series(f"{dataset} pass rate", color, eval_metric_series(run, dataset, "pass_rate", steps))
        )
        series.append(
            Series(f"{dataset} upstream", color, eval_metric_series(run, dataset, "upstream", steps), True)
        )
        infra.append(
            Series(f"{dataset} infra rate", color, eval_metric_series(run, dataset, "infra_rate", steps))
        )
    categories = [str(rid) for rid in steps]
    rates = line_chart(categories, series, x_label=STEP_AXIS, y_label="rate", y_range=(0.0, 1.0))
    lost = line_chart(
        categories, infra, x_label=STEP_AXIS, y_label="infra share", fmt=format_percent, y_range=(0.0, 1.0)
    )
    return page.section("chart-eval", title, caption, rates + legend(series)) + page.section(
        "chart-eval-infra", "Eval attempts lost to infrastructure", "", lost + legend(infra)
    )


def _trust_section(run: Run) -> str:
    title = "Trust: the trainer against the sampler, every train step"
    caption = (
        "Before each update, two families kept apart. <b>Mismatch</b>: the trainer at the weights "
        "that sampled each token against the rollout's recorded log-probs, |Δ log p| over "
        "loss-masked-in tokens of valid samples (mean, max, and the mean over each turn's first "
        "generated token), routing agreement (share of (token, layer) rows where the trainer's "
        "own top-k at the row's version equals the replayed one), and where the engine returned "
        "its top-k log-probs the top-k KL (both directions, renormalised on the engine's top-k), "
        "the top-k overlap and an upper bound on the total variation between the full "
        "distributions. <b>Policy lag</b>: the current weights against the sampling version on "
        "the same tokens (|Δ log p| mean and max, KL(behaviour || current) by Miles' low_var_kl): "
        "the staleness PPO's ratio measures under --keep-old-actor. During the update: the share "
        "of tokens PPO clipped and TIS clamped, the gradient norm before clipping, and the loss "
        "scale (the gradient scale the pg-loss reducer applied relative to a mean over valid "
        "samples: 1.0 when nothing is masked, or when the reducer ignores masked samples)."
    )
    if not run.train:
        return page.section("chart-trust", title, caption, page.no_data(NO_TRAIN))
    categories = [str(rid) for rid in run.step_ids]
    fractions = [Series(n, c, train_metric_series(run, m)) for n, c, m in TRUST_FRACTIONS]
    fractions = [s for s in fractions if any(v is not None for v in s.values)]
    charts = ""
    if fractions:
        charts += line_chart(categories, fractions, x_label=STEP_AXIS, y_label="fraction", y_range=(0.0, 1.0))
        charts += legend(fractions)
    for family, label in ((MISMATCH_SERIES, "mismatch |Δ log p|"), (POLICY_LAG_SERIES, "policy lag")):
        series = [Series(n, c, train_metric_series(run, m), dashed) for n, c, m, dashed in family]
        series = [s for s in series if any(v is not None for v in s.values)]
        if series:
            charts += line_chart(categories, series, x_label=STEP_AXIS, y_label=label)
            charts += legend(series)
    columns = [train_metric_series(run, metric) for _, metric in TRUST_TABLE]
    rows = [
        (str(rid), *(_optional(column[position]) for column in columns))
        for position, rid in enumerate(run.step_ids)
        if rid in run.train
    ]
    table = page.table(
        ("rollout step", *(name for name, _ in TRUST_TABLE)), rows, (False, *[True] * len(TRUST_TABLE))
    )
    return page.section("chart-trust", title, caption, charts + table)


AGE_STYLE = (
    ("0", "#2e7d32"),
    ("1", "#9e9d24"),
    ("2", "#f9a825"),
    ("3", "#ef6c00"),
    ("4+", "#c62828"),
)
STALENESS_SHARES = (
    ("mixed-version samples", "#6a1b9a", "staleness/mixed_version_frac"),
    ("stale KV context", "#1565c0", "kv/stale_prefix_tokens_frac"),
    ("R3 rows from a later prefill", "#00838f", "r3/rows_from_later_prefill_frac"),
    ("… next turn's cache hit", "#4db6ac", "r3/rows_from_later_prefill_frac/cache_hit"),
    ("… next turn's cache miss", "#ff7043", "r3/rows_from_later_prefill_frac/cache_miss"),
)
STALENESS_TABLE = (
    ("age mean", "staleness/token_age_mean"),
    ("age p90", "staleness/token_age_p90"),
    ("age max", "staleness/token_age_max"),
    ("group spread max", "staleness/group_version_spread_max"),
    ("aged tokens", "staleness/aged_tokens"),
    ("unversioned tokens", "staleness/unversioned_tokens"),
)


def _staleness_sections(run: Run) -> str:
    """Token ages and the version-mix shares per train step; nothing when no step carries them
    (a run without per-token version arrays)."""
    categories = [str(rid) for rid in run.step_ids]
    ages = [
        Series(f"age {label}", color, trained_metric_series(run, f"staleness/token_age_hist/{label}"))
        for label, color in AGE_STYLE
    ]
    shares = [Series(n, c, trained_metric_series(run, m)) for n, c, m in STALENESS_SHARES]
    shares = [s for s in shares if any(v is not None for v in s.values)]
    html = ""
    if any(v is not None for s in ages for v in s.values):
        caption = (
            "Token age = the trainer's policy version minus the version that sampled the token, over "
            "loss-masked-in tokens of valid samples (staleness/token_age_hist/*: each bucket's share of "
            "the tokens with a version; unversioned tokens are counted apart). One-step-off training "
            "puts every token at age 1; in-flight updates spread it."
        )
        columns = [trained_metric_series(run, metric) for _, metric in STALENESS_TABLE]
        rows = [
            (rid, *(_optional(column[position]) for column in columns))
            for position, rid in enumerate(categories)
            if any(column[position] is not None for column in columns)
        ]
        table = page.table(
            ("rollout step", *(name for name, _ in STALENESS_TABLE)),
            rows,
            (False, *[True] * len(STALENESS_TABLE)),
        )
        chart = bar_chart(categories, ages, x_label=STEP_AXIS, y_label="share of tokens", fmt=format_percent)
        html += page.section(
            "chart-staleness-age",
            "Staleness: token age per train step",
            caption,
            chart + legend(ages) + table,
        )
    if shares:
        caption = (
            "<b>mixed-version samples</b> (staleness/mixed_version_frac): valid samples whose trained "
            "tokens carry more than one version. <b>stale KV context</b> (kv/stale_prefix_tokens_frac): "
            "of the context positions each turn read (known KV versions), the share written by a policy "
            "older than the turn's first forward. <b>R3 rows from a later prefill</b> "
            "(r3/rows_from_later_prefill_frac): the share of trained tokens whose kept routing a later "
            "prefill recorded, split by whether the next turn read the token from the prefix cache."
        )
        chart = line_chart(categories, shares, x_label=STEP_AXIS, y_label="share", y_range=(0.0, 1.0))
        html += page.section(
            "chart-staleness-shares",
            "Staleness: version mix, stale KV, R3 provenance",
            caption,
            chart + legend(shares),
        )
    return html


SHORT_OUTCOME = {
    "passed": "passed",
    "failed": "failed",
    "dropped_all_passed": "dropped, all passed",
    "dropped_all_failed": "dropped, all failed",
    "dropped_insufficient_valid": "dropped, < 2 valid",
    "dropped_other": "dropped, other reason",
    "unused": "unused",
    "unknown": "unknown",
}


def _attempt_label(a: Attempt) -> str:
    outcome = f"infra: {a.cause}" if a.cause is not None else SHORT_OUTCOME[a.outcome]
    return f"step {a.rollout_id} · group {a.group_index} · #{a.index} · {outcome}"


def _phases_section(run: Run) -> str:
    title = "3. Phase durations per attempt"
    slowest = slowest_attempts(run, SLOWEST_ATTEMPTS)
    timed = sum(1 for a in run.attempts if a.phases)
    caption = (
        "Per attempt, stacked by phase: queue (waiting for a sandbox slot), sandbox setup, agent setup, "
        "agent, verifier, as the Harbor /run server reported them."
    )
    if slowest:
        caption += (
            f" The {len(slowest)} slowest of {timed:,} timed attempts (sum of phases); the table summarizes "
            "every attempt."
        )
    if not run.attempts:
        return page.section("chart-phases", title, caption, page.no_data("the file has no attempt lines."))
    if not slowest:
        return page.section(
            "chart-phases",
            title,
            caption,
            page.no_data(
                "no attempt carries phase_timings (the generate hook copies Harbor's phase timings)."
            ),
        )
    series = [
        Series(PHASE_STYLE[p][0], PHASE_STYLE[p][1], [a.phases.get(p) for a in slowest])
        for p in PHASES
        if any(p in a.phases for a in slowest)
    ]
    if empty := _empty_note(series, "phase duration"):
        return page.section("chart-phases", title, caption, empty)
    chart = hbar_chart([_attempt_label(a) for a in slowest], series, x_label="seconds", fmt=format_seconds)
    rows = [
        (
            PHASE_STYLE[s.phase][0],
            f"{s.attempts:,}",
            format_seconds(s.median),
            format_seconds(s.p90),
            format_seconds(s.maximum),
            format_percent(s.share),
        )
        for s in phase_stats(run)
    ]
    table = page.table(
        ("phase", "attempts", "median", "p90", "max", "share of time"), rows, (False, *[True] * 5)
    )
    return page.section("chart-phases", title, caption, chart + legend(series) + table)


def _occupancy_section(run: Run) -> str:
    title = "4. Where in-flight trajectories spend their time"
    caption = (
        "Per step, the share of all in-flight trajectory-time in each phase (occupancy/<phase>): queue, "
        "sandbox setup (environment and agent setup), waiting on the model (each turn's engine time, "
        "measured by the session server), running tools (the rest of the agent phase) and the verifier. "
        "Below: how many trajectories were in each phase over the last timed step."
    )
    shares = {p: step_metric_series(run, f"occupancy/{p}") for p in OCCUPANCY_PHASES}
    if not any(v is not None for values in shares.values() for v in values):
        return page.section(
            "chart-occupancy",
            title,
            caption,
            page.no_data("no step carries occupancy/* metrics (the generate hook records phase timings)."),
        )
    series = [Series(OCCUPANCY_STYLE[p][0], OCCUPANCY_STYLE[p][1], shares[p]) for p in OCCUPANCY_PHASES]
    chart = bar_chart(
        [str(s) for s in run.step_ids], series, x_label=STEP_AXIS, y_label="share", fmt=format_percent
    )
    body = chart + legend(series)
    timed = [a for a in run.attempts if a.started_at is not None and a.timings]
    if timed:
        last = max(a.rollout_id for a in timed)
        rows = occupancy_timeline(
            [(a.started_at, a.timings) for a in timed if a.rollout_id == last], TIMELINE_POINTS
        )
        if rows:
            lines = [
                Series(OCCUPANCY_STYLE[p][0], OCCUPANCY_STYLE[p][1], [row[p] for row in rows])
                for p in OCCUPANCY_PHASES
            ]
            body += f"<h3>Trajectories in flight by phase, step {last}</h3>" + line_chart(
                [format_seconds(row["t"]) for row in rows],
                lines,
                x_label="time since the step's first attempt arrived",
                y_label="trajectories",
            )
    return page.section("chart-occupancy", title, caption, body)


def _infra_section(run: Run) -> str:
    title = "5. Infrastructure failures by cause"
    caption = (
        "Attempts per step whose environment, not the policy, failed (class infra:&lt;cause&gt;, see "
        "docs/hooks.md). They are masked out of the loss and out of every baseline, never scored 0."
    )
    if not run.step_ids:
        return page.section(
            "chart-infra", title, caption, page.no_data("the file has no step or attempt records.")
        )
    causes, from_lines = infra_causes(run)
    counted = step_counts(run)
    if not causes:
        if not counted:
            return page.section(
                "chart-infra",
                title,
                caption,
                page.no_data("no step carries infra counts (count/infra) and there are no attempt lines."),
            )
        attempts = sum(c.attempts for c in counted.values())
        message = f"No infrastructure failures in {attempts:,} attempts over {len(counted)} steps."
        return page.section("chart-infra", title, caption, f'<p class="empty-ok">{escape(message)}</p>')
    series = [
        Series(cause, PALETTE[i % len(PALETTE)], counts) for i, (cause, counts) in enumerate(causes.items())
    ]
    totals = [f"({sum(counts):,})" for counts in causes.values()]
    note = ""
    if from_lines:
        note = (
            '<p class="caption">Steps '
            + escape(", ".join(map(str, from_lines)))
            + " lack pre-filter counts (another dynamic filter): counted from their attempt lines, "
            "which cover the trained batch only.</p>"
        )
    chart = bar_chart([str(r) for r in run.step_ids], series, x_label=STEP_AXIS, y_label="attempts")
    body = note + chart + legend(series, totals) + _attribution(run)
    return page.section("chart-infra", title, caption, body)


def _attribution(run: Run) -> str:
    """Who each failed attempt belongs to (policy: scored; infrastructure and task: masked), per step."""
    counts = attributions(run)
    if not counts:
        return ""
    series = [Series(key, PALETTE[i % len(PALETTE)], per) for i, (key, per) in enumerate(counts.items())]
    totals = [f"({sum(per):,})" for per in counts.values()]
    chart = bar_chart([str(r) for r in run.step_ids], series, x_label=STEP_AXIS, y_label="attempts")
    return (
        "<h3>Who each failure belongs to (attribution/cause)</h3><p class=\"caption\">policy: scored (the "
        "verifier's grade, or the task's floor); infrastructure and task: masked (docs/harbor.md).</p>"
        + chart
        + legend(series, totals)
    )


TASK_STEP_SERIES = (
    ("always-pass groups", "#2e7d32", "tasks/always_pass_groups"),
    ("always-fail groups", "#c62828", "tasks/always_fail_groups"),
    ("vacuous-signature attempts", "#6a1b9a", "tasks/vacuous_signature_attempts"),
    ("tasks near their verifier timeout", "#ef6c00", "tasks/verifier_near_timeout_tasks"),
)
TASK_RUN_SERIES = (
    ("pass rate drifted down", "#c62828", "tasks/drift_down_tasks"),
    ("pass rate drifted up", "#2e7d32", "tasks/drift_up_tasks"),
    ("above the oracle", "#6a1b9a", "tasks/above_oracle_tasks"),
    ("always-pass streak", "#9e9d24", "tasks/always_pass_streak_tasks"),
    ("always-fail streak", "#ef6c00", "tasks/always_fail_streak_tasks"),
    ("quarantined (live list)", "#212121", "tasks/quarantined_live"),
)


def _evidence(evidence: dict[str, object]) -> str:
    """One line of a quarantine's evidence: `verdict: key=value, ...; count=value`."""
    parts = []
    for key, value in evidence.items():
        if isinstance(value, dict):
            parts.append(f"{key}: " + ", ".join(f"{k}={v}" for k, v in value.items()))
        else:
            parts.append(f"{key}={value}")
    return "; ".join(parts)


def _task_health_section(run: Run) -> str:
    title = "Task health during training"
    caption = (
        "From the policy's own attempts (rl360_ext.tasks, docs/tasks.md). <b>This step</b>: groups "
        "whose valid attempts all passed or all failed (the filter drops both, so they vanish from "
        "the reward curves), valid attempts above the floor that ended in an exception (the "
        "vacuous-verifier signature), tasks whose verifier p95 is over half their timeout. "
        "<b>Over the run</b> (the training-time tracker, with --rl360-quarantine-file): tasks whose "
        "recent pass rate left their early-training baseline (disjoint Wilson intervals), tasks "
        "passing more often than the audit's oracle, tasks in an always-pass or always-fail streak, "
        "and the tasks on the live quarantine list. Below: each task quarantined during the run and "
        "the evidence that did it; its attempts are masked from then on, never scored 0."
    )
    categories = [str(rid) for rid in run.step_ids]
    body = ""
    for family, label in ((TASK_STEP_SERIES, "this step"), (TASK_RUN_SERIES, "over the run")):
        series = [Series(name, color, step_metric_series(run, metric)) for name, color, metric in family]
        series = [s for s in series if any(v is not None for v in s.values)]
        if series:
            body += f"<h3>{escape(label)}</h3>"
            body += line_chart(categories, series, x_label=STEP_AXIS, y_label="count") + legend(series)
    if not body:
        return page.section(
            "chart-task-health", title, caption, page.no_data("no step record carries tasks/* metrics.")
        )
    events = quarantined_during_run(run)
    if events:
        rows = [
            (
                "" if e.rollout_id is None else str(e.rollout_id),
                e.task,
                ", ".join(e.verdicts),
                _evidence(e.evidence),
            )
            for e in events
        ]
        body += "<h3>Quarantined during the run</h3>" + page.table(
            ("rollout step", "task", "verdicts", "evidence"), rows, (True, False, False, False)
        )
    elif any(v is not None for v in step_metric_series(run, "tasks/quarantined_live")):
        body += '<p class="empty-ok">No task was quarantined during the run.</p>'
    return page.section("chart-task-health", title, caption, body)


def _cache_sections(run: Run) -> str:
    rows = cache_and_routing(run)
    ids = [str(rid) for rid in run.step_ids]
    cache_title, routing_title = "6a. Prefix-cache hit rate per step", "6b. Routing-replay bytes per step"
    cache_caption = (
        "sum(cached_tokens) / sum(prompt_tokens) over the step's attempts that report both (all classes: "
        "caching is the engines' business). Sticky routing (X-SMG-Routing-Key) keeps a trajectory's turns "
        "on the engine that holds its prefix."
    )
    routing_caption = (
        "Sum of routing_bytes (routing-replay / R3 data, written from metadata['routing_bytes']) "
        "over the step's attempts."
    )
    if not run.attempts:
        cache = page.section(
            "chart-cache", cache_title, cache_caption, page.no_data("the file has no attempt lines.")
        )
        routing = page.section(
            "chart-routing", routing_title, routing_caption, page.no_data("the file has no attempt lines.")
        )
        return f'<div class="pair">{cache}{routing}</div>'
    if any(r.hit_rate is not None for r in rows):
        series = [Series("prefix-cache hit rate", "#00897b", [r.hit_rate for r in rows])]
        chart = line_chart(
            ids,
            series,
            x_label=STEP_AXIS,
            y_label="hit rate",
            fmt=format_percent,
            y_range=(0.0, 1.0),
            width=HALF_WIDTH,
        )
        counted = sum(r.attempts for r in rows)
        cache = page.section(
            "chart-cache", cache_title, cache_caption + f" {counted:,} attempts report token counts.", chart
        )
    else:
        cache = page.section(
            "chart-cache",
            cache_title,
            cache_caption,
            page.no_data("no attempt carries both cached_tokens and prompt_tokens."),
        )
    if any(r.routing_bytes is not None for r in rows):
        series = [Series("routing bytes", "#5e35b1", [r.routing_bytes for r in rows])]
        chart = _empty_note(series, "routing_bytes value") or bar_chart(
            ids, series, x_label=STEP_AXIS, y_label="bytes", fmt=format_bytes, width=HALF_WIDTH
        )
        routing = page.section("chart-routing", routing_title, routing_caption, chart)
    else:
        routing = page.section(
            "chart-routing",
            routing_title,
            routing_caption,
            page.no_data(
                "no attempt carries routing_bytes (written when the generate hook collects routing replay, "
                "i.e. --use-rollout-routing-replay)."
            ),
        )
    return f'<div class="pair">{cache}{routing}</div>'


def _range(values: Sequence[float]) -> str:
    if not values:
        return "n/a"
    low, high = min(values), max(values)
    return format_number(low) if low == high else f"{format_number(low)}–{format_number(high)}"


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
    body = _empty_note(series, "engine counts (engines_targeted, weights/*)") or (
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
    body = _empty_note(series, "push duration (duration_s)") or (
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
    body = _empty_note(series, "update call count (update_calls_per_engine)") or (
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
            f"{_optional(p.engines_reached)} / {_optional(p.engines_targeted)}",
            _range(list(p.update_calls_per_engine.values())),
            _range(list(p.control_calls_per_engine.values())),
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


def _push_sections(run: Run) -> str:
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


def render_report(run: Run) -> str:
    """The whole page for a loaded run."""
    facts = summary(run)
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    ignored = ""
    if run.ignored_files:
        ignored = " Not read: " + ", ".join(p.name for p in run.ignored_files) + "."
    meta = (
        f"Source: {run.source} ({len(run.steps)} step records, {len(run.attempts):,} attempt lines, "
        f"{len(run.pushes)} weight pushes). Generated {generated}.{ignored}"
    )
    body = "".join(
        (
            "<h1>rl360 step report</h1>",
            f'<p class="meta">{escape(meta)}</p>',
            _summary_section(run, facts),
            _outcomes_section(run),
            _rewards_section(run),
            _learning_section(run),
            _eval_section(run),
            _trust_section(run),
            gate_section(run),
            _staleness_sections(run),
            _phases_section(run),
            _occupancy_section(run),
            _infra_section(run),
            _task_health_section(run),
            _cache_sections(run),
            _push_sections(run),
        )
    )
    csp = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        f'<meta name="viewport" content="width={FULL_WIDTH + 40}">'
        f"<title>rl360 report: {escape(run.source.name)}</title><style>{CSS}</style></head>"
        f"<body>{body}</body></html>\n"
    )


def default_output(run_dir: Path) -> Path:
    """RUN_DIR/report.html, or report.html next to RUN_DIR when it is a file."""
    run_dir = Path(run_dir)
    return (run_dir.parent if run_dir.is_file() else run_dir) / REPORT_FILE


def main(run_dir: Path, out: Path | None) -> None:
    """`rl360 report RUN_DIR [--out PATH]`: write the page and say where."""
    run = load_run(run_dir)
    target = Path(out) if out is not None else default_output(run_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    partial.write_text(render_report(run), encoding="utf-8")
    os.replace(partial, target)
    print(
        f"wrote {target} ({len(run.step_ids)} steps, {len(run.attempts):,} attempt lines, "
        f"{len(run.pushes)} weight pushes)"
    )
