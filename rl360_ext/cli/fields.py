"""Typer commands derived from a config dataclass: one flag per field, the config built from them.

Owns `config_command(cls, run, ...)`, the one way the `serve` commands (tiny engine, session
server, Harbor server) get their flags: each field of `cls` becomes a keyword option whose name,
default, lower bound and help come from the field (its docstring, read by
`rl360_ext.util.fielddocs`), and the command receives `cls(...)` built from the parsed values, a
`ValueError` from the dataclass becoming typer's usage error. The field metadata it reads:

- `flag`: the flag's name when it differs from the field's (`--<flag>`, underscores as dashes);
- `min`: the option's lower bound;
- `parse`: a function from the flag's text to the field's value (structured values such as
  `--faults k=v,...`); its `ValueError` names the flag;
- `path`: the field is a path given as text (the option is a `Path`, the field gets `str`);
- `repeatable`: the flag may repeat (the field gets a tuple);
- `envvar`: an environment variable the option also reads.

A field declared with `repr=False` (a secret) never shows its default in `--help`.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import typer

from rl360_ext.util.fielddocs import field_docs, flag_of


def _parameter(
    spec: dataclasses.Field[Any], hint: Any, docs: dict[str, str], optional: bool
) -> inspect.Parameter:
    meta = spec.metadata
    repeatable = bool(meta.get("repeatable"))
    default: Any = spec.default
    if "parse" in meta:
        hint, default = str, ""
    elif meta.get("path"):
        hint, default = Path | None, None
    elif repeatable:
        hint, default = list[str] | None, None
    elif optional:
        hint, default = hint | None, None
    elif default is dataclasses.MISSING:
        default = ...
    option = typer.Option(
        default,
        flag_of(spec),
        help=docs.get(spec.name, ""),
        min=meta.get("min"),
        envvar=meta.get("envvar"),
        show_default=spec.repr and not repeatable,
    )
    return inspect.Parameter(spec.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=hint)


def field_parameters(cls: type, optional: Iterable[str] = ()) -> list[inspect.Parameter]:
    """One keyword parameter per field of `cls`, annotated with its typer option. Fields named in
    `optional` are required by `cls` but defaulted by the command itself (their flag may be omitted)."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    loose = set(optional)
    return [_parameter(spec, hints[spec.name], docs, spec.name in loose) for spec in dataclasses.fields(cls)]


def field_values(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """The parsed flags of `cls`' fields as the values its constructor takes."""
    kwargs: dict[str, Any] = {}
    for spec in dataclasses.fields(cls):
        value = values[spec.name]
        meta = spec.metadata
        if "parse" in meta:
            try:
                value = meta["parse"](value)
            except ValueError as err:
                raise typer.BadParameter(str(err), param_hint=flag_of(spec)) from None
        elif meta.get("path") and value is not None:
            value = str(value)
        elif meta.get("repeatable"):
            value = tuple(value or ())
        kwargs[spec.name] = value
    return kwargs


def build_config(cls: type, values: dict[str, Any]) -> Any:
    """`cls(**values)`, its `ValueError` as typer's usage error."""
    try:
        return cls(**values)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


def fields_command(
    cls: type,
    run: Callable[..., None],
    *,
    extra: Sequence[inspect.Parameter] = (),
    optional: Iterable[str] = (),
) -> Callable[..., None]:
    """A typer command with `extra`'s parameters and one flag per field of `cls`; it calls
    `run(values, **extras)` with the fields' values ready for `cls(**values)`, for a command that
    completes them before building its config."""
    names = {spec.name for spec in dataclasses.fields(cls)}

    def command(**values: Any) -> None:
        own = field_values(cls, {k: v for k, v in values.items() if k in names})
        run(own, **{k: v for k, v in values.items() if k not in names})

    params = [*extra, *field_parameters(cls, optional)]
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = run.__doc__
    command.__name__ = run.__name__
    return command


def config_command(
    cls: type, run: Callable[..., None], *, extra: Sequence[inspect.Parameter] = ()
) -> Callable[..., None]:
    """A typer command with `extra`'s parameters and one flag per field of `cls`; it calls
    `run(config, **extras)` with `config = cls(...)` built from the flags."""

    def build(values: dict[str, Any], **extras: Any) -> None:
        run(build_config(cls, values), **extras)

    build.__doc__, build.__name__ = run.__doc__, run.__name__
    return fields_command(cls, build, extra=extra)
