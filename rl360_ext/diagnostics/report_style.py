"""The step report's look, shared by its sections and by the pages built like it (the A/B
comparison, the task-health page): the stylesheet, the palette and the series styles, the step
axis's label, and the small cells every section writes (`empty_note`, `number_or_na`,
`number_range`).
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from rl360_ext.diagnostics import page
from rl360_ext.diagnostics.charts import (
    Series,
    format_number,
)

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


def empty_note(series: Sequence[Series], what: str) -> str | None:
    """None when some bar has a positive value; otherwise the note that replaces an empty axis."""
    values = [v for s in series for v in s.values if v is not None]
    if any(v > 0 for v in values):
        return None
    if values:
        return f'<p class="empty-ok">Every {escape(what)} in this run is 0.</p>'
    return page.no_data(f"no record carries a {what}.")


def number_or_na(value: float | None) -> str:
    return "n/a" if value is None else format_number(value)


AGE_STYLE = (
    ("0", "#2e7d32"),
    ("1", "#9e9d24"),
    ("2", "#f9a825"),
    ("3", "#ef6c00"),
    ("4+", "#c62828"),
)


def number_range(values: Sequence[float]) -> str:
    if not values:
        return "n/a"
    low, high = min(values), max(values)
    return format_number(low) if low == high else f"{format_number(low)}–{format_number(high)}"
