"""`rl360 containers up|down|status|env`: the local container stack (thin: rl360_ext.containers)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import typer

from rl360_ext.containers.paths import StackPaths

app = typer.Typer(
    help="A Docker engine and an image registry on this machine for `rl360 harbor serve --env docker`.",
    no_args_is_help=True,
)

_STATE = typer.Option(
    None,
    "--state-dir",
    help="The stack's state directory (default $RL360_CONTAINERS_DIR or /var/tmp/rl360-containers).",
)


def _paths(state_dir: Path | None) -> StackPaths:
    return StackPaths(state_dir) if state_dir is not None else StackPaths.default()


@app.command()
def up(
    state_dir: Path | None = _STATE,
    no_base_image: bool = typer.Option(
        False, "--no-base-image", help="Start the engine and the registry only."
    ),
) -> None:
    """Start dockerd (own data root, socket, no bridge, no NAT) and the loopback registry, and serve
    the base image under the library names tasks use. Idempotent."""
    from rl360_ext.containers import stack

    paths = _paths(state_dir)
    try:
        stack.up(paths, base_image=not no_base_image)
    except stack.Unavailable:
        raise  # one line and exit status 2 (rl360_ext.cli.PrerequisiteGroup)
    except RuntimeError as exc:  # a process that exited or never answered: its log is named
        typer.echo(f"rl360 containers up: {str(exc).splitlines()[0]}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"export DOCKER_HOST={paths.docker_host} DOCKER_CONFIG={paths.docker_config}")


@app.command()
def down(
    state_dir: Path | None = _STATE,
    purge: bool = typer.Option(
        False, "--purge", help="Remove the state directory too (engine data, registry, image cache)."
    ),
) -> None:
    """Remove every container, then stop exactly the dockerd and registry `up` started (by PID)."""
    from rl360_ext.containers import stack

    stack.down(_paths(state_dir), purge=purge)


@app.command()
def status(state_dir: Path | None = _STATE) -> None:
    """What runs: dockerd, the registry, the engine's containers, networks and volumes (JSON)."""
    from rl360_ext.containers import stack

    typer.echo(json.dumps(stack.status(_paths(state_dir)), indent=2))


@app.command()
def env(state_dir: Path | None = _STATE) -> None:
    """Print the shell exports that point the docker CLI at the stack."""
    paths = _paths(state_dir)
    typer.echo(
        f"export DOCKER_HOST={shlex.quote(paths.docker_host)} "
        f"DOCKER_CONFIG={shlex.quote(str(paths.docker_config))}"
    )
