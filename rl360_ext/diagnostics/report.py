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
(report_data.py, reduced by report_series.py). This module lays out the page; the sections are
report_rollout.py, report_training.py, report_pushes.py and report_gate.py, their look
report_style.py. The page has no script and loads nothing: its content security policy is
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
from datetime import UTC, datetime
from html import escape
from pathlib import Path

from rl360_ext.diagnostics.charts import (
    FULL_WIDTH,
    Formatter,
    format_number,
    format_percent,
)
from rl360_ext.diagnostics.report_data import Run, load_run
from rl360_ext.diagnostics.report_gate import gate_section
from rl360_ext.diagnostics.report_pushes import push_sections
from rl360_ext.diagnostics.report_rollout import (
    cache_sections,
    infra_section,
    occupancy_section,
    outcomes_section,
    phases_section,
    rewards_section,
    task_health_section,
)
from rl360_ext.diagnostics.report_series import Summary, summary
from rl360_ext.diagnostics.report_style import CSS
from rl360_ext.diagnostics.report_training import (
    eval_section,
    learning_section,
    staleness_sections,
    trust_section,
)

REPORT_FILE = "report.html"


def summary_section(run: Run, facts: Summary) -> str:
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
            summary_section(run, facts),
            outcomes_section(run),
            rewards_section(run),
            learning_section(run),
            eval_section(run),
            trust_section(run),
            gate_section(run),
            staleness_sections(run),
            phases_section(run),
            occupancy_section(run),
            infra_section(run),
            task_health_section(run),
            cache_sections(run),
            push_sections(run),
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
