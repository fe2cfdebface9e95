"""The report's SVG primitives: tick ranges, number formats, and marks that carry exactly the data."""

from __future__ import annotations

import itertools
import math
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.diagnostics.charts import (
    Series,
    bar_chart,
    format_bytes,
    format_number,
    format_percent,
    format_seconds,
    hbar_chart,
    legend,
    line_chart,
    nice_ticks,
)

SVG = "{http://www.w3.org/2000/svg}"


def marks(svg: str) -> list[dict[str, str]]:
    root = ET.fromstring(svg)  # the SVG must be well-formed XML, not just tag soup
    return [dict(e.attrib) for e in root.iter() if e.get("class") == "mark"]


@settings(max_examples=200, deadline=None)
@given(
    low=st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    span=st.floats(min_value=0, max_value=1e9, allow_nan=False),
)
def test_ticks_cover_the_range_in_even_round_steps(low: float, span: float) -> None:
    high = low + span
    ticks = nice_ticks(low, high)
    assert ticks[0] <= low and ticks[-1] >= high
    assert 2 <= len(ticks) <= 12
    steps = [b - a for a, b in itertools.pairwise(ticks)]
    assert all(s > 0 for s in steps)
    assert max(steps) - min(steps) <= 1e-6 * max(steps)
    mantissa = steps[0] / 10 ** math.floor(math.log10(steps[0]))
    assert any(math.isclose(mantissa, m, rel_tol=1e-6) for m in (1, 2, 2.5, 5, 10))


def test_ticks_refuse_non_finite_ranges() -> None:
    with pytest.raises(ValueError, match="finite"):
        nice_ticks(0.0, math.inf)


@pytest.mark.parametrize(
    ("fmt", "value", "text"),
    [
        (format_number, 1234567, "1,234,567"),
        (format_number, 0.61234, "0.612"),
        (format_number, 812.4, "812"),
        (format_seconds, 0.25, "250 ms"),
        (format_seconds, 12.04, "12 s"),
        (format_seconds, 125.0, "125 s"),
        (format_seconds, 3600.0, "60 min"),
        (format_seconds, 90000.0, "25 h"),
        (format_bytes, 152_000_000, "152 MB"),
        (format_bytes, 512, "512 B"),
        (format_percent, 0.2, "20%"),
        (format_percent, 0.4612, "46.1%"),
    ],
)
def test_number_formats(fmt: object, value: float, text: str) -> None:
    assert fmt(value) == text  # type: ignore[operator]


def test_stacked_bars_draw_each_positive_value_once_and_total_it() -> None:
    svg = bar_chart(
        ["0", "1", "2"],
        [Series("a", "#111111", [3, 0, None]), Series("b & <c>", "#222222", [2, 5, None])],
        x_label="step",
        y_label="attempts",
    )
    drawn = {(m["data-x"], m["data-series"]): float(m["data-value"]) for m in marks(svg)}
    assert drawn == {("0", "a"): 3.0, ("0", "b & <c>"): 2.0, ("1", "b & <c>"): 5.0}
    texts = [t.text for t in ET.fromstring(svg).iter(f"{SVG}text") if t.get("class") == "total"]
    assert texts == ["5", "5"]
    heights = {m["data-x"] + m["data-series"]: float(m["height"]) for m in marks(svg)}
    assert heights["1b & <c>"] == pytest.approx(heights["0a"] + heights["0b & <c>"], rel=0.02)


def test_grouped_bars_sit_side_by_side() -> None:
    svg = bar_chart(
        ["push 1"],
        [Series("e1", "#111", [1]), Series("e2", "#222", [40])],
        x_label="p",
        y_label="c",
        stacked=False,
    )
    first, second = marks(svg)
    assert float(first["x"]) < float(second["x"])
    assert float(second["height"]) > 30 * float(first["height"])


def test_lines_break_at_missing_values() -> None:
    series = [Series("m", "#333", [0.1, 0.2, None, 0.4, 0.5])]
    svg = line_chart(["0", "1", "2", "3", "4"], series, x_label="s", y_label="r", y_range=(0.0, 1.0))
    root = ET.fromstring(svg)
    assert len(list(root.iter(f"{SVG}polyline"))) == 2
    assert [m["data-x"] for m in marks(svg)] == ["0", "1", "3", "4"]
    ys = {m["data-x"]: float(m["cy"]) for m in marks(svg)}
    assert ys["0"] > ys["1"] > ys["3"] > ys["4"], "higher values sit higher on the page"


def test_horizontal_bars_stack_each_row_and_label_its_total() -> None:
    svg = hbar_chart(
        ["slow", "fast"],
        [Series("agent", "#1", [100.0, 4.0]), Series("verifier", "#2", [20.0, None])],
        x_label="seconds",
        fmt=format_seconds,
    )
    by_row = {}
    for m in marks(svg):
        by_row.setdefault(m["data-x"], []).append(float(m["data-value"]))
    assert by_row == {"slow": [100.0, 20.0], "fast": [4.0]}
    texts = [t.text for t in ET.fromstring(svg).iter(f"{SVG}text")]
    assert "120 s" in texts and "4 s" in texts


def test_legend_escapes_names_and_shows_notes() -> None:
    html = legend([Series("<b>", "#000", [1])], ["(3)"])
    assert "&lt;b&gt;" in html and "(3)" in html


def test_long_row_labels_are_shortened_with_the_whole_label_in_a_tooltip() -> None:
    long = "step 12345 · group 678 · #9999999 · infra: environment_start_timeout " * 2
    svg = hbar_chart([long, "short"], [Series("agent", "#1", [1.0, 2.0])], x_label="seconds")
    texts = list(ET.fromstring(svg).iter(f"{SVG}text"))
    assert "short" in [t.text for t in texts]
    (shortened,) = [t for t in texts if t.find(f"{SVG}title") is not None]
    assert shortened.findtext(f"{SVG}title") == long
    visible = shortened.find(f"{SVG}title").tail or ""
    assert visible.endswith("…") and long.startswith(visible[:-1]) and len(visible) < len(long)
