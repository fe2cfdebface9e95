"""`rl360 harbor ...` commands (thin: parse flags, call into rl360_ext.harbor)."""

from __future__ import annotations

import typer

app = typer.Typer(help="rl360_ext.harbor commands.", no_args_is_help=True)
