"""`rl360 session ...` commands (thin: flags derived from `SessionServerConfig`, call into rl360_ext.session).

Every `serve` flag but --host and --port is a `SessionServerConfig` field (derived by
`rl360_ext.cli.fields`): its name (or the `flag` in the field's metadata), its default, its lower
bound (`min`) and its help (the field's docstring) come from there, so a default is written once.
"""

from __future__ import annotations

import inspect

import typer

from rl360_ext.cli.fields import config_command
from rl360_ext.session.options import SessionServerConfig

app = typer.Typer(help="The delta-R3 token-in/token-out session server.", no_args_is_help=True)


_SERVE_EXTRA = [
    inspect.Parameter(
        "host",
        inspect.Parameter.KEYWORD_ONLY,
        default=typer.Option("127.0.0.1", help="Bind address."),
        annotation=str,
    ),
    inspect.Parameter(
        "port", inspect.Parameter.KEYWORD_ONLY, default=typer.Option(8100, help="Port."), annotation=int
    ),
]


def serve(options: SessionServerConfig, host: str, port: int) -> None:
    """Serve token-in/token-out chat sessions in front of an SGLang engine or gateway."""
    from rl360_ext.session.service import ServiceStartupError
    from rl360_ext.session.service import serve as run

    try:
        run(options, host, port)
    except ServiceStartupError as exc:
        typer.echo(f"rl360 session serve: {exc}", err=True)
        raise typer.Exit(2) from None


app.command("serve")(config_command(SessionServerConfig, serve, extra=_SERVE_EXTRA))
