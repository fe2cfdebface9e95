"""HTML building blocks the report pages share (the step report and the compare report).

Owns the markup of a chart section (`section`), a data table (`table`) and the note that stands
in for a chart whose data a run does not have (`no_data`); the classes they use are styled by
`report.CSS`. Text arguments are escaped here; `caption` and `body` are HTML the caller built.
It does not draw charts (`charts.py`) or decide what a page holds (`report.py`,
`ab/page.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape


def section(chart_id: str, title: str, caption: str, body: str) -> str:
    """A `<section class="chart">` with an escaped title, an HTML caption and an HTML body."""
    return (
        f'<section class="chart" id="{chart_id}"><h2>{escape(title)}</h2>'
        f'<p class="caption">{caption}</p>{body}</section>'
    )


def no_data(why: str) -> str:
    """The note that replaces a chart without data: "No data in this run: <why>"."""
    return f'<p class="no-data">No data in this run: {escape(why)}</p>'


def table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[bool]) -> str:
    """A table of escaped cells; `numeric[i]` right-aligns column i (class `num`)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(
            f"<td{' class=num' if num else ''}>{escape(cell)}</td>"
            for cell, num in zip(row, numeric, strict=True)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"
