"""`rl360 engine ...` commands (thin: parse flags, call into rl360_ext.engine)."""

from __future__ import annotations

import typer

app = typer.Typer(help="rl360_ext.engine commands.", no_args_is_help=True)
