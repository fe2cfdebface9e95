"""The shared HTML pieces escape their text and keep columns aligned with their flags."""

from __future__ import annotations

import pytest

from rl360_ext.diagnostics import page


def test_section_escapes_the_title_and_keeps_caption_and_body_html() -> None:
    html = page.section("chart-x", "a < b", "<b>cap</b>", "<svg></svg>")
    assert html == (
        '<section class="chart" id="chart-x"><h2>a &lt; b</h2>'
        '<p class="caption"><b>cap</b></p><svg></svg></section>'
    )


def test_no_data_says_why_escaped() -> None:
    assert (
        page.no_data("no <step> lines") == '<p class="no-data">No data in this run: no &lt;step&gt; lines</p>'
    )


def test_table_marks_numeric_columns_and_escapes_cells() -> None:
    html = page.table(("name", "n"), [("a&b", "1"), ("c", "2")], (False, True))
    assert html == (
        "<table><tr><th>name</th><th>n</th></tr>"
        "<tr><td>a&amp;b</td><td class=num>1</td></tr><tr><td>c</td><td class=num>2</td></tr></table>"
    )


def test_table_refuses_a_row_of_another_width() -> None:
    with pytest.raises(ValueError):
        page.table(("a", "b"), [("1",)], (False, True))
