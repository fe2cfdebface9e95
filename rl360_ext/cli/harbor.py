"""`rl360 harbor ...` commands (thin: flags come from `ServerSettings`' fields, then call into
rl360_ext.harbor)."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import os
import tempfile
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from rl360_ext.harbor.settings import ServerSettings, flag_name
from rl360_ext.util.fielddocs import field_docs

app = typer.Typer(
    help="The Harbor /run server (one deadline, waves, reservations, pinning) and example tasks.",
    no_args_is_help=True,
)

_OPTIONAL_AT_THE_FLAG = ("tasks_root", "trials_dir")  # required settings the CLI defaults itself


def _option(item: dataclasses.Field[Any], hints: dict[str, Any]) -> inspect.Parameter:
    """One typer option for one settings field: its flag name, help (the field's docstring),
    default, `min`, repeatability and environment variable."""
    annotation = hints[item.name]
    repeatable = bool(item.metadata.get("repeatable"))
    if repeatable:
        annotation, default = list[str] | None, None
    elif item.name in _OPTIONAL_AT_THE_FLAG:
        annotation, default = annotation | None, None
    else:
        default = item.default
    option = typer.Option(
        default,
        f"--{flag_name(item.name)}",
        help=field_docs(ServerSettings)[item.name],
        min=item.metadata.get("min"),
        envvar=item.metadata.get("envvar"),
        show_default=not repeatable and item.name != "token",
    )
    return inspect.Parameter(item.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)


def _settings_command(run: Callable[[dict[str, Any]], None]) -> Callable[..., None]:
    """A function whose signature is one keyword option per ServerSettings field."""
    hints = typing.get_type_hints(ServerSettings)

    def command(**values: Any) -> None:
        run(values)

    command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [_option(item, hints) for item in dataclasses.fields(ServerSettings)]
    )
    command.__doc__ = "Serve POST /run, POST /flush, GET /health, GET /metrics for Harbor trials."
    return command


def _serve(values: dict[str, Any]) -> None:
    from rl360_ext.harbor.app import serve
    from rl360_ext.harbor.runner import TrialRunner
    from rl360_ext.local.fixtures import tasks_root as example_tasks_root
    from rl360_ext.util.prereqs import bwrap_problem, require

    for item in dataclasses.fields(ServerSettings):
        if item.metadata.get("repeatable"):
            values[item.name] = tuple(values[item.name] or ())
    values["tasks_root"] = values["tasks_root"] or example_tasks_root()
    # Without --trials-dir, trial directories live in a temporary directory removed at exit.
    scratch = (
        None
        if values["trials_dir"]
        else tempfile.TemporaryDirectory(prefix="rl360-trials-", ignore_cleanup_errors=True)
    )
    if scratch is not None:
        values["trials_dir"] = Path(scratch.name)
    # The token is read; no child process (agents, sandboxes) inherits it from our environment.
    os.environ.pop("RL360_HARBOR_TOKEN", None)
    try:
        settings = ServerSettings(**values)
        token = settings.bearer_token()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    if settings.env == "bwrap":
        require("rl360 harbor serve --env bwrap", [bwrap_problem()])
    logging.getLogger("harbor").setLevel(logging.WARNING)
    # LiteLLM (terminus-2) otherwise fetches its model price map from the internet in every process.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    with scratch or contextlib.nullcontext():
        try:
            runner = TrialRunner(settings)
        except (ValueError, FileNotFoundError) as exc:
            raise typer.BadParameter(str(exc)) from exc
        # On SIGTERM every in-flight /run answers `failure_cause: cancelled`, then the server exits.
        serve(runner, token, settings.host, settings.port, settings.log_level)


app.command("serve")(_settings_command(_serve))


@app.command("example-tasks")
def example_tasks() -> None:
    """Print the directory of rl360's example tasks and their names."""
    from rl360_ext.local.fixtures import tasks_root as example_tasks_root

    root = example_tasks_root()
    typer.echo(str(root))
    for task in sorted(p.name for p in root.iterdir() if (p / "task.toml").is_file()):
        typer.echo(f"  {task}")
