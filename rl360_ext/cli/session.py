"""`rl360 session ...` commands (thin: flags derived from `ServiceOptions`, call into rl360_ext.session).

Every `serve` flag but --host and --port is a `ServiceOptions` field: its name (or the `flag`
in the field's metadata), its default, its lower bound (`min`) and its help (the field's
docstring) come from there, so a default is written once.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any

import typer

from rl360_ext.session.options import ServiceOptions
from rl360_ext.util.fielddocs import field_docs

app = typer.Typer(help="The delta-R3 token-in/token-out session server.", no_args_is_help=True)


def _keyword(name: str, default: Any, annotation: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def _option_parameters(cls: type) -> list[inspect.Parameter]:
    """One keyword parameter per dataclass field, annotated with its typer.Option."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    params = []
    for spec in dataclasses.fields(cls):
        flag = spec.metadata.get("flag", "--" + spec.name.replace("_", "-"))
        required = spec.default is dataclasses.MISSING
        default = ... if required else spec.default
        kwargs: dict[str, Any] = {"help": docs.get(spec.name, "")}
        if "min" in spec.metadata:
            kwargs["min"] = spec.metadata["min"]
        option = typer.Option(flag, **kwargs)
        annotation = Annotated[hints[spec.name], option]  # type: ignore[valid-type]
        params.append(
            inspect.Parameter(
                spec.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
            )
        )
    return params


def _with_options(
    cls: type, extra: list[inspect.Parameter]
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command the flags of `cls` (plus `extra`); it receives `options=cls(...)` and the extras."""

    def wrap(command: Callable[..., None]) -> Callable[..., None]:
        names = {spec.name for spec in dataclasses.fields(cls)}

        def run(**values: Any) -> None:
            fields = {k: v for k, v in values.items() if k in names}
            try:
                options = cls(**fields)
            except ValueError as exc:
                raise typer.BadParameter(str(exc)) from None
            command(options=options, **{k: v for k, v in values.items() if k not in names})

        params = [*extra, *_option_parameters(cls)]
        run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        run.__doc__ = command.__doc__
        run.__name__ = command.__name__
        return run

    return wrap


_SERVE_EXTRA = [
    _keyword("host", "127.0.0.1", Annotated[str, typer.Option(help="Bind address.")]),
    _keyword("port", 8100, Annotated[int, typer.Option(help="Port.")]),
]


@app.command()
@_with_options(ServiceOptions, _SERVE_EXTRA)
def serve(options: ServiceOptions, host: str, port: int) -> None:
    """Serve token-in/token-out chat sessions in front of an SGLang engine or gateway."""
    from rl360_ext.session.service import ServiceStartupError
    from rl360_ext.session.service import serve as run

    try:
        run(options, host, port)
    except ServiceStartupError as exc:
        typer.echo(f"rl360 session serve: {exc}", err=True)
        raise typer.Exit(2) from None
