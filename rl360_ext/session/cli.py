"""`rl360 session ...` commands (thin: parse flags, call into rl360_ext.session)."""

from __future__ import annotations

import typer

app = typer.Typer(help="rl360_ext.session commands.", no_args_is_help=True)
