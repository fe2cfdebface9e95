"""`rl360 templates ...` commands (thin: parse flags, call into rl360_ext.templates)."""

from __future__ import annotations

import typer

app = typer.Typer(help="rl360_ext.templates commands.", no_args_is_help=True)
