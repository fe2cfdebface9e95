"""Tables and long lines without a terminal: one plain line per row, nothing cut or wrapped."""

from __future__ import annotations

import io
import string

from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from rich.table import Table

from rl360_ext.util.console import print_table, table_lines

CELL = st.text(alphabet=string.ascii_letters + string.digits + " .:-_/", min_size=1, max_size=40)


def _piped() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, soft_wrap=True), out


def test_a_wide_table_without_a_terminal_is_one_full_line_per_row() -> None:
    table = Table(title="rl360 demo: per step")
    for header in ("step", "mean (all)", "mean (kept)", "weights", "push after"):
        table.add_column(header)
    table.add_row("17", "0.8437500", "0.9062500", "[bold red]17 (expected 16)[/]", "v18 in 0.05 s")
    table.add_row("18", "0.9999999", "1.0000000", "18", "v19 in 12.25 s")
    console, out = _piped()
    assert not console.is_terminal
    print_table(console, table)
    lines = out.getvalue().splitlines()
    assert lines == [
        "rl360 demo: per step: step 17, mean (all) 0.8437500, mean (kept) 0.9062500, "
        "weights 17 (expected 16), push after v18 in 0.05 s",
        "rl360 demo: per step: step 18, mean (all) 0.9999999, mean (kept) 1.0000000, "
        "weights 18, push after v19 in 12.25 s",
    ]
    assert all(len(line) > 80 for line in lines)


def test_emoji_codes_in_a_cell_stay_text() -> None:
    """Found by hypothesis in CI: `:A:` came out as a glyph (rich's emoji codes)."""
    table = Table("task", "answer")
    table.add_row(":A:", "x :thumbs_up: y")
    assert table_lines(table) == ["task :A:, answer x :thumbs_up: y"]


def test_a_terminal_still_gets_rich_table() -> None:
    table = Table("step", "mean")
    table.add_row("0", "0.250")
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=60, color_system=None)
    print_table(console, table)
    assert console.is_terminal
    assert "┃ step ┃ mean  ┃" in out.getvalue()
    assert "│ 0    │ 0.250 │" in out.getvalue()


@given(
    headers=st.lists(CELL, min_size=1, max_size=12),
    rows=st.integers(min_value=0, max_value=5),
    data=st.data(),
)
def test_every_cell_survives_in_full(headers: list[str], rows: int, data: st.DataObject) -> None:
    table = Table(*headers)
    cells = [data.draw(st.lists(CELL, min_size=len(headers), max_size=len(headers))) for _ in range(rows)]
    for row in cells:
        table.add_row(*row)
    lines = table_lines(table)
    assert len(lines) == rows
    for line, row in zip(lines, cells, strict=True):
        assert line == ", ".join(f"{h} {c}" for h, c in zip(headers, row, strict=True))
    console, out = _piped()
    print_table(console, table)
    assert out.getvalue().splitlines() == lines
