"""The task audit's HTML page: `task_health.html`, which `rl360 tasks audit` writes next to
task_health.jsonl, in the step report's style (`report.CSS`, `page`'s table and section).

Owns the page: how many tasks got each verdict (and what the verdict means), then one row per
task: its verdicts and undecided controls, the oracle's and nop's tallies, the oracle's slowest
agent phase against its budget, the verifier timeout the task declares and the one the audit
suggests, and what the controls behind its findings saw (the evidence's `found_by`). It decides
nothing: verdicts and evidence are `rl360_ext.tasks.audit`'s, read as the audit recorded them.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from typing import Any

from rl360_ext.diagnostics import page
from rl360_ext.diagnostics.report_style import CSS
from rl360_ext.tasks.health import TaskHealth
from rl360_ext.tasks.verdicts import Control, TaskVerdict

TASK_HEALTH_PAGE = "task_health.html"
MEANINGS: dict[str, str] = {
    TaskVerdict.LINT: "the server refused to load the task",
    TaskVerdict.BROKEN_ENV: "the sandbox never started",
    TaskVerdict.BROKEN_ORACLE: "the reference solution never reached the maximum",
    TaskVerdict.FLAKY: "the reference solution reached the maximum in some runs only",
    TaskVerdict.VACUOUS: "doing nothing scored above the floor",
    TaskVerdict.FLAKY_VERIFIER: "the verifier graded one end state with different rewards",
    TaskVerdict.INSENSITIVE: "the reference solution with its work undone still scored the maximum",
    TaskVerdict.HACKABLE: "a model-free hack (reward file, PATH shim, conftest.py) scored the maximum",
    TaskVerdict.LEAKY: "the answer was readable from the agent's sandbox",
    TaskVerdict.SLOW_ORACLE: "the reference solution took over half the agent budget",
    TaskVerdict.SLOW_VERIFIER: "during training, the verifier's p95 reached its timeout",
    TaskVerdict.OK: "no finding",
    "undecided": "a control no valid attempt could decide (infrastructure failures only): quarantined",
}
_MESSAGE_LIMIT = 300


def _seconds(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, int | float) else "-"


def _tally(entry: Any, hits: str) -> str:
    return f"{entry[hits]}/{entry['valid']}" if isinstance(entry, Mapping) else "-"


def _findings(health: TaskHealth) -> str:
    """What the controls behind the task's findings saw, in one line."""
    ev, seen = health.evidence, []
    if isinstance(lint := ev.get(Control.LINT), Mapping):
        seen.append(f"lint: {lint.get('type')}: {lint.get('message')}")
    if isinstance(env := ev.get(Control.ENVIRONMENT), Mapping):
        seen.append(f"environment: {env.get('failure_cause')}")
    for control in ev.get("found_by") or {}:
        attempt = ev.get(control)
        if not isinstance(attempt, Mapping):
            continue
        if control == Control.VERIFIER_REGRADE:
            seen.append(f"{control}: {attempt.get('exception_message')}")
        elif attempt.get("reward") is not None:
            seen.append(f"{control}: reward {attempt['reward']:g}")
    text = "; ".join(seen) or "-"
    return text if len(text) <= _MESSAGE_LIMIT else text[: _MESSAGE_LIMIT - 3] + "..."


def _verdict_counts(results: Sequence[TaskHealth]) -> str:
    counts = Counter(str(v) for r in results for v in r.verdicts)
    counts.update("undecided" for r in results if r.evidence.get("undecided"))
    rows = [[name, str(counts[name]), MEANINGS[name]] for name in MEANINGS if counts[name]]
    caption = (
        f"{len(results)} tasks; every task that is not a clean <code>ok</code> is in quarantine.json. "
        "A task can have several verdicts."
    )
    return page.section(
        "verdicts",
        "Verdicts",
        caption,
        page.table(["verdict", "tasks", "meaning"], rows, [False, True, False]),
    )


def _task_table(results: Sequence[TaskHealth]) -> str:
    header = [
        "task",
        "verdicts",
        "undecided",
        "oracle at max",
        "nop above floor",
        "oracle agent s",
        "agent budget s",
        "verifier timeout s",
        "suggested verifier s",
        "what the controls saw",
    ]
    rows = []
    for r in sorted(results, key=lambda r: (r.verdicts == [TaskVerdict.OK], r.task)):
        ev = r.evidence
        rows.append(
            [
                r.task,
                ", ".join(r.verdicts) or "-",
                ", ".join(ev.get("undecided") or []) or "-",
                _tally(ev.get(Control.ORACLE), "passed"),
                _tally(ev.get(Control.NOP), "above_floor"),
                _seconds(ev.get("oracle_agent_s")),
                _seconds(ev.get("agent_budget_s")),
                _seconds(ev.get("verifier_timeout_s")),
                _seconds((ev.get("suggested_timeouts") or {}).get("verifier_s")),
                _findings(r),
            ]
        )
    caption = (
        "Tasks with a finding first. Oracle and nop: runs at the maximum (above the floor) of the "
        "valid runs; infrastructure attempts were retried and never counted. The suggested verifier "
        "timeout is 3&times; the longest verifier phase observed, clamped."
    )
    numeric = [False, False, False, True, True, True, True, True, True, False]
    return page.section("tasks", "Tasks", caption, page.table(header, rows, numeric))


def render_task_health(results: Sequence[TaskHealth], source: str) -> str:
    """The whole page for an audit's results; `source` names what was audited."""
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    cached = sum(bool(r.evidence.get("cached")) for r in results)
    meta = f"Source: {source} ({len(results)} tasks, {cached} from the cache). Generated {generated}."
    body = "".join(
        (
            "<h1>rl360 task health</h1>",
            f'<p class="meta">{escape(meta)}</p>',
            _verdict_counts(results),
            _task_table(results),
        )
    )
    csp = "default-src 'none'; style-src 'unsafe-inline'"
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        f"<title>rl360 task health: {escape(source)}</title><style>{CSS}</style></head>"
        f"<body>{body}</body></html>\n"
    )


def write_task_health_page(results: Sequence[TaskHealth], out_dir: Path, source: str) -> Path:
    """OUT/task_health.html, replaced whole."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / TASK_HEALTH_PAGE
    partial = target.with_name(f".{target.name}.partial")
    partial.write_text(render_task_health(results, source), encoding="utf-8")
    os.replace(partial, target)
    return target
