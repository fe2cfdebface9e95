"""`rl360 harbor ...` commands (thin: parse flags, call into rl360_ext.harbor)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rl360_ext.cli.options import key_values

app = typer.Typer(
    help="The Harbor /run server (one deadline, waves, reservations, pinning) and example tasks.",
    no_args_is_help=True,
)


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="Bind address."),
    port: int = typer.Option(8765, help="Bind port."),
    tasks_root: Annotated[
        Path | None,
        typer.Option(
            help="Directory of Harbor tasks; /run's task is relative to it. Default: rl360's example tasks."
        ),
    ] = None,
    env: str = typer.Option(
        "bwrap", help="bwrap, a Harbor environment type (docker, daytona, ...) or module:Class."
    ),
    env_kwarg: Annotated[
        list[str] | None, typer.Option(help="Environment kwarg KEY=VALUE (repeatable).")
    ] = None,
    max_concurrent: int = typer.Option(64, min=1, help="Trials running at once, at most."),
    rolling_start_size: int | None = typer.Option(None, min=1, help="At most K sandbox starts per interval."),
    rolling_start_interval: float = typer.Option(1.0, min=0.001, help="Rolling-start interval, seconds."),
    agent: str = typer.Option("oracle", help="Default agent: a Harbor agent name or module.path:Class."),
    token: str | None = typer.Option(None, envvar="RL360_HARBOR_TOKEN", help="Require this bearer token."),
    trials_dir: Annotated[
        Path | None,
        typer.Option(help="Where Harbor writes trial dirs (default: a temp dir removed at exit)."),
    ] = None,
    keep_trials: str = typer.Option("failed", help="Keep trial dirs: all, failed or none."),
    nodes: str = typer.Option("local", help="Comma-separated node labels for image-group pinning."),
    placement_kwarg: str | None = typer.Option(
        None, help="Environment kwarg that receives the node label (bwrap: node_label)."
    ),
    capacity_cpus: float | None = typer.Option(None, min=0.0, help="CPUs reservations may add up to."),
    capacity_memory_mb: int | None = typer.Option(
        None, min=0, help="Memory (MB) reservations may add up to."
    ),
    default_cpus: float = typer.Option(1.0, min=0.0, help="Reservation for tasks that declare no cpus."),
    default_memory_mb: int = typer.Option(
        2048, min=1, help="Reservation for tasks that declare no memory_mb."
    ),
    env_setup_s: float = typer.Option(120.0, min=0.0, help="Budget (and timeout) for starting the sandbox."),
    agent_setup_s: float = typer.Option(30.0, min=0.0, help="Budget (and timeout) for agent setup."),
    max_verifier_s: float = typer.Option(600.0, min=0.0, help="Cap on the task's verifier timeout."),
    margin_s: float = typer.Option(
        15.0, min=0.0, help="Deadline margin for Harbor bookkeeping and the reply."
    ),
    min_agent_s: float = typer.Option(10.0, min=0.0, help="Below this agent budget: insufficient_budget."),
    max_turns: int | None = typer.Option(None, min=1, help="Turn limit passed to model-driven agents."),
    log_level: str = typer.Option("warning", help="Server log level."),
) -> None:
    """Serve POST /run, POST /flush, GET /health, GET /metrics for Harbor trials."""
    import contextlib
    import logging
    import os
    import tempfile

    import uvicorn

    from rl360_ext.harbor.admission import Reservation
    from rl360_ext.harbor.app import create_app
    from rl360_ext.harbor.budget import BudgetPolicy
    from rl360_ext.harbor.runner import EnvironmentSpec, ServerSettings, TrialRunner
    from rl360_ext.local.fixtures import tasks_root as example_tasks_root
    from rl360_ext.util.prereqs import bwrap_problem, require

    if keep_trials not in ("all", "failed", "none"):
        raise typer.BadParameter("must be all, failed or none", param_hint="--keep-trials")
    if (capacity_cpus is None) != (capacity_memory_mb is None):
        raise typer.BadParameter("give both --capacity-cpus and --capacity-memory-mb, or neither")
    try:
        env_kwargs = key_values(env_kwarg or [])
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--env-kwarg") from None
    try:
        environment = EnvironmentSpec.parse(env, env_kwargs, placement_kwarg)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--env") from exc
    if environment.name == "bwrap":
        require("rl360 harbor serve --env bwrap", [bwrap_problem()])
    # Without --trials-dir, trial directories live in a temporary directory removed at exit.
    scratch = (
        None
        if trials_dir
        else tempfile.TemporaryDirectory(prefix="rl360-trials-", ignore_cleanup_errors=True)
    )
    settings = ServerSettings(
        tasks_root=tasks_root or example_tasks_root(),
        trials_dir=Path(scratch.name) if scratch else trials_dir,
        environment=environment,
        agent=agent,
        max_concurrent=max_concurrent,
        rolling_start_size=rolling_start_size,
        rolling_start_interval_s=rolling_start_interval,
        capacity=Reservation(capacity_cpus, capacity_memory_mb)
        if capacity_cpus is not None and capacity_memory_mb is not None
        else None,
        default_reservation=Reservation(default_cpus, default_memory_mb),
        node_labels=tuple(label.strip() for label in nodes.split(",") if label.strip()),
        budget=BudgetPolicy(env_setup_s, agent_setup_s, max_verifier_s, margin_s, min_agent_s),
        max_turns=max_turns,
        keep_trials=keep_trials,
    )
    logging.getLogger("harbor").setLevel(logging.WARNING)
    # LiteLLM (terminus-2) otherwise fetches its model price map from the internet in every process.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    with scratch or contextlib.nullcontext():
        try:
            runner = TrialRunner(settings)
        except (ValueError, FileNotFoundError) as exc:
            raise typer.BadParameter(str(exc)) from exc
        # On SIGTERM, give in-flight /run calls 5 s, then cancel them: their sandboxes are stopped.
        uvicorn.run(
            create_app(runner, token), host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5
        )


@app.command("example-tasks")
def example_tasks() -> None:
    """Print the directory of rl360's example tasks and their names."""
    from rl360_ext.local.fixtures import tasks_root as example_tasks_root

    root = example_tasks_root()
    typer.echo(str(root))
    for task in sorted(p.name for p in root.iterdir() if (p / "task.toml").is_file()):
        typer.echo(f"  {task}")
