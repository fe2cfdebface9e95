"""Inline SVG charts for the step report: bars (stacked or grouped), lines, stacked horizontal bars.

Owns drawing only: each function takes categories and named series of numbers and returns an
SVG string with axes, gridlines, value labels and `<title>` tooltips, plus an HTML legend. No
JavaScript, no external fonts or images, so a page made of these works offline and under a
`default-src 'none'` content security policy. Every drawn data mark carries `class="mark"`
and `data-series` / `data-x` / `data-value` attributes so tests (and scripts) can read the
numbers back from the page. It does not know what the numbers mean (the report does).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

Formatter = Callable[[float], str]

FONT = 11
FULL_WIDTH = 1300
HALF_WIDTH = 640
HEIGHT = 300
MAX_X_LABELS = 40
CHAR_WIDTH = 6.2  # px per character of an 11 px label, for fitting row labels
MIN_LABEL_BAND = 18.0  # px of band width below which per-bar value labels are left to tooltips
MIN_TICK_SPAN = 1e-9  # relative: narrower ranges (e.g. 1e-300 s) get this span, not a zero-width scale
LINE_LABEL_OFFSETS = ((6, -7, "start"), (6, 15, "start"), (-6, 15, "end"))  # per series: dx, dy, anchor


@dataclass
class Series:
    """One named series: a value per category (None: no data for that category)."""

    name: str
    color: str
    values: Sequence[float | None]
    dashed: bool = False


def format_number(value: float) -> str:
    """Readable numbers: integers with thousands separators, others with 3 significant digits."""
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def format_seconds(value: float) -> str:
    if value >= 36000:
        return f"{value / 3600:,.0f} h"
    if value >= 600:
        return f"{value / 60:.3g} min"
    if value >= 1 or value == 0:
        return f"{value:.3g} s"
    return f"{value * 1000:.3g} ms"


def format_bytes(value: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} B"


def format_percent(value: float) -> str:
    return f"{value * 100:.3g}%"


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high] (1-2-5 steps)."""
    if not math.isfinite(low) or not math.isfinite(high):
        raise ValueError(f"tick range must be finite, got {low}..{high}")
    if high <= low:
        high = low + 1.0
    raw = max(high - low, MIN_TICK_SPAN * max(1.0, abs(low), abs(high))) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    start = math.floor(low / step) * step
    if start > low:  # low / step underflowed to -0.0
        start -= step
    ticks = [float(f"{start:.12g}")]
    while ticks[-1] < high or len(ticks) < 2:
        ticks.append(float(f"{start + step * len(ticks):.12g}"))  # 0.30000000000000004 -> 0.3
    return ticks


def _text(x: float, y: float, text: str, *, anchor: str = "middle", size: int = FONT, extra: str = "") -> str:
    position = f'x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"'
    return f"<text {position}{extra}>{escape(text)}</text>"


def _row_label(x: float, y: float, text: str, max_chars: int) -> str:
    """A right-aligned row label, shortened with "…" to fit (the whole text stays in its tooltip)."""
    if len(text) <= max_chars:
        return _text(x, y, text, anchor="end")
    short = escape(text[: max_chars - 1] + "…")
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{FONT}" text-anchor="end">'
        f"<title>{escape(text)}</title>{short}</text>"
    )


def _ink(color: str) -> str:
    """Dark text on light fills, white on dark ones (and on colours not written "#rrggbb")."""
    if len(color) != 7 or not color.startswith("#"):
        return "#ffffff"
    red, green, blue = (int(color[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return "#212121" if 0.299 * red + 0.587 * green + 0.114 * blue > 0.6 else "#ffffff"


def _mark_attrs(series: str, x: str, value: float) -> str:
    return f'class="mark" data-series="{escape(series)}" data-x="{escape(x)}" data-value="{value!r}"'


def _svg(width: int, height: int, body: list[str], label: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}">' + "".join(body) + "</svg>"
    )


@dataclass
class _Frame:
    """Plot area inside an SVG with a linear y scale and a categorical x axis."""

    width: int
    height: int
    left: float
    right: float
    top: float
    bottom: float
    y_low: float
    y_high: float
    n: int

    @property
    def plot_width(self) -> float:
        return self.width - self.left - self.right

    @property
    def plot_height(self) -> float:
        return self.height - self.top - self.bottom

    @property
    def band(self) -> float:
        return self.plot_width / max(self.n, 1)

    def y(self, value: float) -> float:
        span = self.y_high - self.y_low
        clamped = min(max(value, self.y_low), self.y_high)
        return self.top + self.plot_height * (1 - (clamped - self.y_low) / span)

    def x_center(self, index: int) -> float:
        return self.left + self.band * (index + 0.5)


def _axes(
    frame: _Frame, ticks: list[float], categories: Sequence[str], fmt: Formatter, x_label: str, y_label: str
) -> list[str]:
    parts: list[str] = []
    for tick in ticks:
        y = frame.y(tick)
        parts.append(
            f'<line x1="{frame.left:.1f}" x2="{frame.width - frame.right:.1f}" y1="{y:.1f}" y2="{y:.1f}" '
            f'class="grid"/>'
        )
        parts.append(_text(frame.left - 6, y + 4, fmt(tick), anchor="end"))
    base = frame.y(max(frame.y_low, min(0.0, frame.y_high)))
    parts.append(
        f'<line x1="{frame.left:.1f}" x2="{frame.width - frame.right:.1f}" y1="{base:.1f}" y2="{base:.1f}" '
        f'class="axis"/>'
    )
    every = max(1, math.ceil(len(categories) / MAX_X_LABELS))
    label_y = frame.height - frame.bottom + 15
    for index, category in enumerate(categories):
        if index % every == 0:
            parts.append(_text(frame.x_center(index), label_y, category))
    parts.append(
        _text(frame.left + frame.plot_width / 2, frame.height - 6, x_label, extra=' class="axis-title"')
    )
    mid = frame.top + frame.plot_height / 2
    parts.append(_text(14, mid, y_label, extra=f' class="axis-title" transform="rotate(-90 14 {mid:.1f})"'))
    return parts


def _frame(width: int, height: int, n: int, low: float, high: float) -> tuple[_Frame, list[float]]:
    ticks = nice_ticks(low, high)
    frame = _Frame(width, height, left=64, right=16, top=24, bottom=44, y_low=ticks[0], y_high=ticks[-1], n=n)
    return frame, ticks


def bar_chart(
    categories: Sequence[str],
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    fmt: Formatter = format_number,
    stacked: bool = True,
    width: int = FULL_WIDTH,
    height: int = HEIGHT,
) -> str:
    """Vertical bars per category: stacked (with a total above each bar) or grouped side by side."""
    sums = [
        sum(max(s.values[i] or 0.0, 0.0) for s in series)
        if stacked
        else max((max(s.values[i] or 0.0, 0.0) for s in series), default=0.0)
        for i in range(len(categories))
    ]
    frame, ticks = _frame(width, height, len(categories), 0.0, max(sums, default=0.0))
    parts = _axes(frame, ticks, categories, fmt, x_label, y_label)
    bar_width = frame.band * 0.72
    slot = bar_width if stacked else bar_width / max(len(series), 1)
    for index, category in enumerate(categories):
        left = frame.x_center(index) - bar_width / 2
        level = 0.0
        for position, s in enumerate(series):
            value = s.values[index]
            if value is None or value <= 0:
                continue
            low, high = (level, level + value) if stacked else (0.0, value)
            x = left if stacked else left + slot * position
            top, bottom = frame.y(high), frame.y(low)
            parts.append(
                f'<rect {_mark_attrs(s.name, category, value)} x="{x:.1f}" y="{top:.1f}" '
                f'width="{max(slot - 1, 1):.1f}" height="{max(bottom - top, 0.5):.1f}" fill="{s.color}">'
                f"<title>{escape(f'{x_label} {category} · {s.name}: {fmt(value)}')}</title></rect>"
            )
            if stacked and len(series) > 1 and bottom - top >= FONT + 3 and slot >= MIN_LABEL_BAND:
                ink = f' class="in-bar" style="fill: {_ink(s.color)}"'
                parts.append(_text(x + slot / 2, (top + bottom) / 2 + 4, fmt(value), extra=ink))
            if not stacked and slot >= MIN_LABEL_BAND:
                parts.append(_text(x + slot / 2, top - 3, fmt(value), size=FONT - 1))
            level = high
        if stacked and level > 0 and frame.band >= MIN_LABEL_BAND:
            parts.append(_text(frame.x_center(index), frame.y(level) - 4, fmt(level), extra=' class="total"'))
    return _svg(width, height, parts, f"{y_label} per {x_label}")


def line_chart(
    categories: Sequence[str],
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    fmt: Formatter = format_number,
    y_range: tuple[float, float] | None = None,
    width: int = FULL_WIDTH,
    height: int = HEIGHT,
) -> str:
    """One line per series across the categories; gaps where a value is None; labelled points."""
    values = [v for s in series for v in s.values if v is not None]
    low, high = y_range or (min([0.0, *values]), max([0.0, *values]))
    low, high = min([low, *values]), max([high, *values])
    frame, ticks = _frame(width, height, len(categories), low, high)
    parts = _axes(frame, ticks, categories, fmt, x_label, y_label)
    label_points = frame.band >= 28
    for number, s in enumerate(series):
        dx, dy, anchor = LINE_LABEL_OFFSETS[number % len(LINE_LABEL_OFFSETS)]
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        run: list[str] = []
        for index, value in enumerate([*s.values, None]):
            if value is not None:
                run.append(f"{frame.x_center(index):.1f},{frame.y(value):.1f}")
                continue
            if len(run) > 1:
                stroke = f'fill="none" stroke="{s.color}" stroke-width="2"{dash}'
                parts.append(f'<polyline points="{" ".join(run)}" {stroke}/>')
            run = []
        for index, value in enumerate(s.values):
            if value is None:
                continue
            x, y = frame.x_center(index), frame.y(value)
            parts.append(
                f'<circle {_mark_attrs(s.name, categories[index], value)} cx="{x:.1f}" cy="{y:.1f}" r="4" '
                f'fill="{s.color}"><title>{escape(f"{x_label} {categories[index]} · {s.name}: {fmt(value)}")}'
                "</title></circle>"
            )
            if label_points:
                parts.append(_text(x + dx, y + dy, fmt(value), anchor=anchor, extra=f' fill="{s.color}"'))
    return _svg(width, height, parts, f"{y_label} per {x_label}")


def hbar_chart(
    rows: Sequence[str],
    series: Sequence[Series],
    *,
    x_label: str,
    fmt: Formatter = format_number,
    width: int = FULL_WIDTH,
    row_height: int = 20,
) -> str:
    """Stacked horizontal bars, one row per label, with the row total at the end of each bar."""
    totals = [sum(max(s.values[i] or 0.0, 0.0) for s in series) for i in range(len(rows))]
    ticks = nice_ticks(0.0, max(totals, default=0.0))
    left, right, top, bottom = 360.0, 70.0, 10.0, 40.0
    height = int(top + bottom + row_height * len(rows))
    plot_width = width - left - right

    def x_of(value: float) -> float:
        return left + plot_width * min(max(value, 0.0), ticks[-1]) / ticks[-1]

    parts: list[str] = []
    for tick in ticks:
        x = x_of(tick)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top:.1f}" y2="{height - bottom:.1f}" class="grid"/>'
        )
        parts.append(_text(x, height - bottom + 15, fmt(tick)))
    parts.append(_text(left + plot_width / 2, height - 6, x_label, extra=' class="axis-title"'))
    for index, row in enumerate(rows):
        y = top + row_height * index
        parts.append(
            _row_label(left - 8, y + row_height / 2 + 4, row, max_chars=int((left - 12) / CHAR_WIDTH))
        )
        level = 0.0
        for s in series:
            value = s.values[index]
            if value is None or value <= 0:
                continue
            x0, x1 = x_of(level), x_of(level + value)
            parts.append(
                f'<rect {_mark_attrs(s.name, row, value)} x="{x0:.1f}" y="{y + 3:.1f}" '
                f'width="{max(x1 - x0, 0.5):.1f}" height="{row_height - 6}" fill="{s.color}">'
                f"<title>{escape(f'{row} · {s.name}: {fmt(value)}')}</title></rect>"
            )
            level += value
        parts.append(_text(x_of(level) + 4, y + row_height / 2 + 4, fmt(level), anchor="start"))
    return _svg(width, height, parts, f"{x_label} per row")


def legend(series: Sequence[Series], notes: Sequence[str] | None = None) -> str:
    """An HTML legend: a swatch per series, each optionally followed by a note (e.g. a total)."""
    items = []
    for index, s in enumerate(series):
        note = f' <span class="legend-note">{escape(notes[index])}</span>' if notes and notes[index] else ""
        style = f"border-top: 3px dashed {s.color}; height: 0" if s.dashed else f"background: {s.color}"
        items.append(f'<li><span class="swatch" style="{style}"></span>{escape(s.name)}{note}</li>')
    return '<ul class="legend">' + "".join(items) + "</ul>"
