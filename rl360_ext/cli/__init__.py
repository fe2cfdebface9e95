"""The `rl360` command. Thin: each subcommand parses flags and calls into its subpackage.

The CLI is the top layer: `rl360_ext/cli/<component>.py` holds each component's typer app
(imported here only for the app, nothing heavy at module level); benchmarks are
`rl360_ext/local/bench/<name>.py:main(as_json)`.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from rl360_ext.cli.engine import app as engine_app
from rl360_ext.cli.harbor import app as harbor_app
from rl360_ext.cli.session import app as session_app
from rl360_ext.cli.templates import app as template_app
from rl360_ext.util.progress import showing_progress

app = typer.Typer(
    name="rl360",
    help="rl360-ext: trustworthy RL rollouts for coding agents on Miles, SGLang, SMG and Harbor.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(engine_app, name="engine")
app.add_typer(session_app, name="session")
app.add_typer(template_app, name="template")
app.add_typer(harbor_app, name="harbor")
bench_app = typer.Typer(
    help="Benchmarks: each prints a table and compares against its baseline in the same run."
)
app.add_typer(bench_app, name="bench")


@app.command()
def doctor() -> None:
    """Check this machine: Python, extras, the smg binary, bubblewrap, Ray, Chromium."""
    from rl360_ext.diagnostics.doctor import run_checks

    checks = run_checks()
    table = Table("check", "status", "detail")
    for check in checks:
        table.add_row(check.name, "[green]OK[/]" if check.ok else "[red]MISSING[/]", check.detail)
    Console().print(table)
    raise typer.Exit(0 if all(c.ok for c in checks) else 1)


@app.command()
def demo(
    steps: int = typer.Option(20, min=1, help="Rollout steps (one train step and weight push after each)."),
    tasks: int = typer.Option(8, min=1, help="Task groups per step."),
    attempts: int = typer.Option(4, min=2, help="Attempts per task group."),
    faults: float = typer.Option(0.0, min=0.0, max=1.0, help="Rate of injected infrastructure faults."),
    engines: int = typer.Option(2, min=1, help="Tiny engines behind the SMG gateway."),
    out: Path = typer.Option(Path("runs/demo"), help="Output folder for metrics.jsonl and report.html."),
    lr: float = typer.Option(5e-4, min=0.0, help="The reference trainer's AdamW learning rate."),
    dtype: str = typer.Option("float64", help="The tiny engines' arithmetic: float64 or float32."),
) -> None:
    """Run the whole RL loop on this CPU machine (rollouts, the reference trainer, weight pushes)
    and write a step report."""
    from rl360_ext.local.demo import run_demo
    from rl360_ext.local.demo_plan import DemoConfig

    settings = {"lr": lr, "engine_dtype": dtype}
    try:
        DemoConfig(steps=steps, tasks=tasks, attempts=attempts, faults=faults, engines=engines, **settings)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    result = run_demo(
        steps=steps, tasks=tasks, attempts=attempts, faults=faults, engines=engines, out=out, **settings
    )
    raise typer.Exit(1 if result.problems else 0)


@bench_app.command("engine")
def bench_engine(json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """Prefill and decode tokens/s of the tiny engine at its default size."""
    from rl360_ext.local.bench.engine import main

    with showing_progress("rl360 bench engine"):
        main(as_json=json)


@app.command()
def audit(
    path: Path = typer.Argument(..., exists=True, help="Miles rollout dump (.pt), rl360 JSONL, or a folder."),
    json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
) -> None:
    """Per step: gradient scale, advantage shift and logged-mean bias under upstream defaults."""
    from rl360_ext.rollout.audit import main

    main(path, as_json=json)


@app.command()
def report(
    run_dir: Path = typer.Argument(..., exists=True, help="Run folder with metrics.jsonl, or a .jsonl."),
    out: Path | None = typer.Option(None, "--out", help="Output page (default RUN_DIR/report.html)."),
) -> None:
    """Write a self-contained HTML step report with charts (works offline)."""
    from rl360_ext.diagnostics.report import main

    main(run_dir, out)


@bench_app.command("r3")
def bench_r3(json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """R3 routing data: wire vs json/orjson, delta vs full routing bytes, pool collection."""
    from rl360_ext.local.bench.r3 import main

    with showing_progress("rl360 bench r3"):
        main(as_json=json)


@bench_app.command("template")
def bench_template(json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """Append-only checker cost at server start vs rendering each request once."""
    from rl360_ext.local.bench.template import main

    with showing_progress("rl360 bench template"):
        main(as_json=json)


@bench_app.command("trainer")
def bench_trainer(json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """|Δ log p| and routing agreement of the reference trainer vs float64/float32 engines, R3 on
    and off, and its forward+backward tokens/s."""
    from rl360_ext.local.bench.trainer import main

    with showing_progress("rl360 bench trainer"):
        main(json)


@bench_app.command("launch")
def bench_launch(json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """Simulated 8,192 sandbox starts: all at once vs waves, image-group pinning vs random placement."""
    from rl360_ext.local.bench.launch import main

    with showing_progress("rl360 bench launch"):
        main(as_json=json)


@bench_app.command("faults")
def bench_faults(json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """Fault matrix: every injected infra failure, its class, and proof its reward enters no mean."""
    from rl360_ext.local.bench.faults import main

    with showing_progress("rl360 bench faults"):
        main(as_json=json)
