"""Console output that reads well both at a terminal and in a log with no terminal behind it.

Owns one thing: how a command's tables and long lines reach stdout. At a terminal a table is
rich's table and lines wrap to the window. Without one (CI logs, pipes, `| tee`), rich would
render at 80 columns, cutting numbers (`0.8…`) and folding a cell over several lines; there
`print_table` prints a plain line per row (every cell in full, `header value` pairs) and
`make_console` returns a console that never wraps a line. Nothing else is decided here.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text


def make_console() -> Console:
    """stdout's console: rich at a terminal, lines never wrapped or cut where there is none."""
    console = Console()
    if not console.is_terminal:
        console = Console(soft_wrap=True)
    return console


def _plain(cell: object) -> str:
    """A cell's text without rich markup (`[bold red]v3[/]` -> `v3`); emoji codes such as `:A:`
    stay as written (a task name or a value is text, not a glyph)."""
    if isinstance(cell, Text):
        return cell.plain
    return Text.from_markup(str(cell), emoji=False).plain


def table_lines(table: Table) -> list[str]:
    """The table as one plain line per row: `TITLE: HEADER CELL, HEADER CELL, ...` (no cell cut)."""
    headers = [_plain(column.header) for column in table.columns]
    columns = [[_plain(cell) for cell in column.cells] for column in table.columns]
    title = f"{_plain(table.title)}: " if table.title else ""
    return [
        title + ", ".join(f"{header} {column[row]}" for header, column in zip(headers, columns, strict=True))
        for row in range(table.row_count)
    ]


def print_table(console: Console, table: Table) -> None:
    """rich's table at a terminal; elsewhere a plain line per row, never wrapped or truncated."""
    if console.is_terminal:
        console.print(table)
        return
    for line in table_lines(table):
        console.out(line, highlight=False)
