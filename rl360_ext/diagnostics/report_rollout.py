"""The step report's rollout sections: attempt outcomes and rewards per step, phase durations and
the slowest attempts, the session occupancy timeline, infrastructure failures by cause with
their attribution, the task health during training, and the prefix cache and routing bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from rl360_ext.diagnostics import page
from rl360_ext.diagnostics.charts import (
    HALF_WIDTH,
    Series,
    bar_chart,
    format_bytes,
    format_percent,
    format_seconds,
    hbar_chart,
    legend,
    line_chart,
)
from rl360_ext.diagnostics.report_data import OUTCOMES, PHASES, Attempt, Run
from rl360_ext.diagnostics.report_series import (
    attributions,
    cache_and_routing,
    infra_causes,
    outcome_counts,
    phase_stats,
    quarantined_during_run,
    slowest_attempts,
    step_counts,
    step_metric_series,
)
from rl360_ext.diagnostics.report_style import (
    OCCUPANCY_STYLE,
    OUTCOME_STYLE,
    PALETTE,
    PHASE_STYLE,
    STEP_AXIS,
    empty_note,
    number_or_na,
)
from rl360_ext.rollout.occupancy import PHASES as OCCUPANCY_PHASES
from rl360_ext.rollout.occupancy import timeline as occupancy_timeline

SLOWEST_ATTEMPTS = 25


REWARD_TABLE_STEPS = 20


TIMELINE_POINTS = 16  # moments of the in-flight timeline: few enough that every time label reads


def outcomes_section(run: Run) -> str:
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
    if empty := empty_note(series, "attempt count"):
        return page.section("chart-outcomes", title, caption, note + empty)
    chart = bar_chart(ids, series, x_label=STEP_AXIS, y_label="attempts")
    return page.section("chart-outcomes", title, caption, note + chart + legend(series))


def rewards_section(run: Run) -> str:
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
        "chart-rewards", title, caption, notes + chart + legend(drawn) + reward_table(run, series)
    )


def reward_table(run: Run, series: Sequence[Series]) -> str:
    unfiltered, kept, upstream = (s.values for s in series)
    rows = []
    for position in range(max(0, len(run.step_ids) - REWARD_TABLE_STEPS), len(run.step_ids)):
        u, k, up = unfiltered[position], kept[position], upstream[position]
        gap = None if u is None or k is None else k - u
        signed = "n/a" if gap is None else f"{gap:+.3f}"
        rows.append((str(run.step_ids[position]), number_or_na(u), number_or_na(k), signed, number_or_na(up)))
    shown = "" if len(rows) == len(run.step_ids) else f" (last {len(rows)} steps)"
    header = (f"rollout step{shown}", "unfiltered mean", "kept mean", "kept − unfiltered", "upstream logged")
    return page.table(header, rows, (False, True, True, True, True))


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


def phases_section(run: Run) -> str:
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
    if empty := empty_note(series, "phase duration"):
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


def occupancy_section(run: Run) -> str:
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


def infra_section(run: Run) -> str:
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
        '<h3>Who each failure belongs to (attribution/cause)</h3><p class="caption">policy: scored (the '
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


def task_health_section(run: Run) -> str:
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


def cache_sections(run: Run) -> str:
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
        chart = empty_note(series, "routing_bytes value") or bar_chart(
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
