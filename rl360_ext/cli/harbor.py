"""`rl360 harbor ...` commands (thin: flags come from `HarborServerConfig`' fields through
`rl360_ext.cli.fields`, then call into rl360_ext.harbor)."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import typer

from rl360_ext.cli.fields import fields_command
from rl360_ext.harbor.settings import HarborServerConfig

app = typer.Typer(
    help="The Harbor /run server (one deadline, waves, reservations, pinning) and example tasks.",
    no_args_is_help=True,
)

_OPTIONAL_AT_THE_FLAG = ("tasks_root", "trials_dir")  # required settings the CLI defaults itself


def _serve(values: dict[str, Any]) -> None:
    """Serve POST /run, POST /flush, GET /health, GET /metrics for Harbor trials."""
    from rl360_ext.harbor.app import serve
    from rl360_ext.harbor.runner import TrialRunner
    from rl360_ext.local.fixtures import tasks_root as example_tasks_root
    from rl360_ext.util.prereqs import bwrap_problem, require

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
        settings = HarborServerConfig(**values)
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


app.command("serve")(fields_command(HarborServerConfig, _serve, optional=_OPTIONAL_AT_THE_FLAG))


@app.command("example-tasks")
def example_tasks() -> None:
    """Print the directory of rl360's example tasks and their names."""
    from rl360_ext.local.fixtures import tasks_root as example_tasks_root

    root = example_tasks_root()
    typer.echo(str(root))
    for task in sorted(p.name for p in root.iterdir() if (p / "task.toml").is_file()):
        typer.echo(f"  {task}")
