"""The step gate's lane of `rl360 report`: its verdict on every step, which rule fired, the value, the bound.

Owns `gate_section(run)`: a bar per step coloured by the verdict (train, skip, stop), the rules that
fired per step, and a table of every rule that fired (step, verdict, rule, metric, value, bound),
from the run's `"kind": "gate"` lines (`report_data.GateRecord`; the Miles hook and `rl360 demo`
write them). A run without them has no such section (as the staleness sections: a Miles run without
the gate hook is the common case). It does not judge anything (`rl360_ext.gate.rules`).
"""

from __future__ import annotations

from rl360_ext.diagnostics import page
from rl360_ext.diagnostics.charts import Series, bar_chart, format_number, legend
from rl360_ext.diagnostics.report_data import Run

ACTION_STYLE = (("train", "#2e7d32"), ("skip", "#f9a825"), ("stop", "#c62828"))
RULE_COLORS = ("#6a1b9a", "#1565c0", "#00838f", "#ef6c00", "#ad1457", "#5d4037", "#455a64", "#9e9d24")
TITLE = "Step gate: the verdict on every step"
CAPTION = (
    "Before each update the step gate (rl360_ext.gate, docs/gate.md) reads the step's evidence "
    "(parity, provenance, task health, weights, templates, staleness) and answers <b>train</b>, "
    "<b>skip</b> (the update is dropped, the rollout's metrics stay logged) or <b>stop</b> (the run "
    "ends). Top: the verdict per step; below: the rules that fired; the table lists each with the "
    "value seen and its bound. Evidence a run does not produce never fires a rule."
)


def _number(value: float | None) -> str:
    return "-" if value is None else format_number(value)


def gate_section(run: Run) -> str:
    """The gate's section, or "" for a run without gate lines."""
    if not run.gates:
        return ""
    steps = sorted(run.gates)
    categories = [str(step) for step in steps]
    verdicts = [
        Series(action, color, [1.0 if run.gates[step].action == action else None for step in steps])
        for action, color in ACTION_STYLE
    ]
    body = bar_chart(categories, verdicts, x_label="rollout step", y_label="verdict") + legend(verdicts)
    rules = sorted({reason.rule for gate in run.gates.values() for reason in gate.reasons})
    if rules:
        fired = [
            Series(
                rule,
                RULE_COLORS[position % len(RULE_COLORS)],
                [1.0 if any(r.rule == rule for r in run.gates[step].reasons) else None for step in steps],
            )
            for position, rule in enumerate(rules)
        ]
        body += bar_chart(categories, fired, x_label="rollout step", y_label="rules fired") + legend(fired)
    rows = [
        (
            str(step),
            gate.action,
            reason.rule + (" (hard)" if reason.hard else ""),
            reason.metric,
            _number(reason.value),
            f"{reason.op} {_number(reason.bound)}",
        )
        for step in steps
        for gate in (run.gates[step],)
        for reason in gate.reasons
    ]
    counts = {action: sum(g.action == action for g in run.gates.values()) for action, _ in ACTION_STYLE}
    summary = (
        f'<p class="meta">{len(steps)} steps judged: {counts["train"]} train, {counts["skip"]} skip, '
        f"{counts['stop']} stop.</p>"
    )
    table = (
        page.table(
            ("rollout step", "verdict", "rule", "metric", "value", "fired when"),
            rows,
            (False, False, False, False, True, False),
        )
        if rows
        else '<p class="empty-ok">No rule fired on any step.</p>'
    )
    return page.section("chart-gate", TITLE, CAPTION, body + summary + table)
