"""The `rl360` command. Thin: each subcommand parses flags and calls into its subpackage.

The CLI is the top layer: `rl360_ext/cli/<component>.py` holds each component's typer app
(imported here only for the app, nothing heavy at module level); benchmarks are
`rl360_ext/local/bench/<name>.py:main(as_json)`.

A missing prerequisite never ends a command in a traceback: `Unavailable` (rl360_ext.util.prereqs),
a service that could not start (`ServiceStartError`) and a Python package that is not installed
(`ModuleNotFoundError` for a module outside rl360_ext) become one line on stderr and exit status 2,
in every command (`PrerequisiteGroup`). Benchmarks run under `signals_raise()`, so a bench
killed by SIGTERM (e.g. `timeout`) stops every process it started on the way out.
"""

from __future__ import annotations

import importlib
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from rl360_ext.cli.ab import command as ab_command
from rl360_ext.cli.containers import app as containers_app
from rl360_ext.cli.engine import app as engine_app
from rl360_ext.cli.harbor import app as harbor_app
from rl360_ext.cli.session import app as session_app
from rl360_ext.cli.tasks import app as tasks_app
from rl360_ext.cli.templates import app as template_app
from rl360_ext.local.demo.modes import FAULT_MODES, LIVE_FAULT_MODES, LIVE_SEEDS, parse_names
from rl360_ext.util.prereqs import EXIT_UNAVAILABLE, Unavailable, package_remedy
from rl360_ext.util.procs import ServiceStartError
from rl360_ext.util.progress import showing_progress
from rl360_ext.util.signals import signals_raise


def prerequisite_line(exc: BaseException, command: str) -> str | None:
    """The one line a missing prerequisite ends `command` with, or None for any other error."""
    if isinstance(exc, Unavailable):
        return str(exc)
    if isinstance(exc, ServiceStartError):
        log = f" (log: {exc.log_path})" if exc.log_path else ""
        return f"{command}: {exc.reason}{log}"
    if isinstance(exc, ModuleNotFoundError) and exc.name and exc.name.split(".")[0] != "rl360_ext":
        top = exc.name.split(".")[0]
        return f"{command} needs the Python package {top!r}: {package_remedy(top)}"
    return None


class PrerequisiteGroup(TyperGroup):
    """The top-level group: turns a missing prerequisite raised by any subcommand into one line."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as exc:
            command = f"rl360 {ctx.invoked_subcommand}" if ctx.invoked_subcommand else "rl360"
            line = prerequisite_line(exc, command)
            if line is None:
                raise
            click.echo(line, err=True)
            raise typer.Exit(EXIT_UNAVAILABLE) from None


app = typer.Typer(
    cls=PrerequisiteGroup,
    name="rl360",
    help="rl360-ext: trustworthy RL rollouts for coding agents on Miles, SGLang, SMG and Harbor.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(engine_app, name="engine")
app.add_typer(session_app, name="session")
app.add_typer(template_app, name="template")
app.add_typer(harbor_app, name="harbor")
app.add_typer(tasks_app, name="tasks")
app.add_typer(containers_app, name="containers")
app.command("ab")(ab_command)
bench_app = typer.Typer(
    help="Benchmarks: each prints a table and compares against its baseline in the same run."
)
app.add_typer(bench_app, name="bench")


@app.command()
def doctor() -> None:
    """Check this machine: Python, extras, the smg binary, bubblewrap, tmux, Ray, Chromium."""
    from rl360_ext.diagnostics.doctor import run_checks

    checks = run_checks()
    table = Table("check", "status", "detail")
    for check in checks:
        table.add_row(check.name, "[green]OK[/]" if check.ok else "[red]MISSING[/]", check.detail)
    Console().print(table)
    raise typer.Exit(0 if all(c.ok for c in checks) else 1)


TASK_HEALTH_DIR = "task-health"  # under the demo's OUT: the audit's files, then the tracker's


def _demo_quarantine_file(out: Path) -> Path:
    """The audit's quarantine.json under OUT: the hooks mask its tasks and, next to it, the tasks
    the training-time tracker quarantines (`rl360_ext.tasks.tracker`)."""
    from rl360_ext.tasks.health import QUARANTINE_FILE

    return out / TASK_HEALTH_DIR / QUARANTINE_FILE


def _audit_demo_tasks(out: Path) -> None:
    """`rl360 tasks audit` of the demo's quiz tasks into OUT/task-health (cached by content); a
    quiz task with any finding ends the demo before it starts."""
    from rl360_ext.cli.tasks import audit_tree, print_health
    from rl360_ext.local.fixtures import quiz_task_names, tasks_root
    from rl360_ext.tasks.audit import AuditConfig, find_tasks

    health_dir = out / TASK_HEALTH_DIR
    root = tasks_root()
    results = audit_tree(
        root, find_tasks(root, quiz_task_names(root)), AuditConfig(), health_dir, health_dir / "cache"
    )
    print_health(results, health_dir)
    if bad := [r.task for r in results if r.quarantined]:
        typer.echo(f"rl360 demo: the task audit quarantined {', '.join(bad)}; see {health_dir}", err=True)
        raise typer.Exit(1)


@app.command()
def demo(
    steps: int = typer.Option(20, min=1, help="Rollout steps (one train step and weight push after each)."),
    tasks: int = typer.Option(8, min=1, help="Task groups per step."),
    attempts: int = typer.Option(4, min=2, help="Attempts per task group."),
    faults: float = typer.Option(0.0, min=0.0, max=1.0, help="Rate of injected infrastructure faults."),
    engines: int = typer.Option(2, min=1, help="Tiny engines behind the SMG gateway."),
    out: Path = typer.Option(Path("runs/demo"), help="Output folder for metrics.jsonl and report.html."),
    lr: float = typer.Option(1e-3, min=0.0, help="The reference trainer's AdamW learning rate."),
    head_lr: float = typer.Option(
        2e-2, min=0.0, help="Learning rate of the embedding and LM head (Megatron's --decoupled-lr)."
    ),
    dtype: str = typer.Option("float64", help="The tiny engines' arithmetic: float64 or float32."),
    session_servers: int = typer.Option(1, min=1, help="Session servers (Ray actors) of the generate hook."),
    harbor_replicas: int = typer.Option(
        1, min=1, help="Harbor /run servers; attempts are routed over them by image group."
    ),
    schedule: str = typer.Option(
        "one-step-off", help="Weight pushes: one-step-off (Miles' train_async) or in-flight (mid-rollout)."
    ),
    pause_mode: str = typer.Option("in_place", help="How engines pause for a push: in_place or retract."),
    keep_old_actor: bool = typer.Option(
        True,
        help="Miles' --keep-old-actor: PPO's old log-probs from the weights that sampled each token "
        "(--no-keep-old-actor: from the current weights, Miles' default).",
    ),
    top_logprobs_num: int = typer.Option(
        5, min=0, help="Top-k log-probs the engines return per generated token, for top-k parity (0: off)."
    ),
    eval_interval: int | None = typer.Option(
        None,
        min=1,
        help="Miles' --eval-interval: before training and after every N train steps (and the last), "
        "evaluate the training tasks and held-out quiz tasks (greedy and sampled) through the generate "
        "hook with evaluation=True and the eval log hook; the report draws eval beside training.",
    ),
    engine_churn: str = typer.Option(
        "",
        help="Engine churn during the run: comma-separated kill:STEP (an engine dies mid-rollout of that "
        "step, a replacement joins on the current weights) and hang:STEP (an engine stops answering at "
        "the push after that step; the push fences it and retries), e.g. kill:1,hang:2,kill:3.",
    ),
    inject: list[str] | None = typer.Option(
        None,
        "--inject",
        help="A fault that should trip the step gate, FAULT:STEP (repeatable): burst:STEP (most of the "
        "step's attempts lose their sandbox), bad-push:STEP (one engine serves perturbed weights under the "
        "pushed version in the push that rollout STEP generates on), template-drift:STEP (the step's "
        "sessions render with a drifting template). See docs/gate.md.",
    ),
    gate: bool | None = typer.Option(
        None,
        help="The step gate (rl360_ext.gate, StepGate defaults) judges every step before its update: "
        "skip drops the update, stop ends the run. Default: on, except in the fault A/B (--compare "
        "upstream...: its arms compare reward rules, and upstream Miles has no gate); --no-gate: off.",
    ),
    audit_tasks: bool = typer.Option(
        False,
        "--audit-tasks",
        help="First audit the quiz tasks (rl360 tasks audit, cached in OUT/task-health); "
        "a quiz task that is not ok stops the demo (exit status 1). The run then tracks task health "
        "(--rl360-quarantine-file: tasks quarantined during training are masked).",
    ),
    compare: str | None = typer.Option(
        None,
        help="'schedules': run one-step-off, in-flight in_place and in-flight retract, side by side. "
        "The fault A/B, 'upstream' or 'upstream,clean': runs rl360's arm, then upstream Miles' defaults "
        "(failures scored 0, Miles' baseline, masked samples in the loss denominator) on the same seed, "
        "tasks and faults, then (rl360-list, in the exploitable mode) rl360's rules on a Harbor server with "
        "--attribution list, then (clean) rl360's rules without faults; --seeds seeds x --fault-modes modes, "
        "one run after the other, each a full demo in OUT/<mode>/<arm>/seed-<S> (wall time: S x (modes x 2 "
        "+ 1 with clean) demos), plus OUT/compare.html and compare.json (mean and 95% interval over seeds).",
    ),
    seeds: int | None = typer.Option(
        None,
        help=f"With --compare upstream[,clean]: seeds per arm and fault mode (default {LIVE_SEEDS}), "
        "0 .. S - 1, the same in every arm (per seed: the same warm start, tasks, faults, sampling seeds).",
    ),
    fault_modes: str | None = typer.Option(
        None,
        help=f"With --compare upstream[,clean]: comma-separated fault modes, each a set of runs (default "
        f"{LIVE_FAULT_MODES}): uniform, burst (the middle step only), correlated (faults grow with an "
        "attempt's sandbox calls), exploitable (uniform, and the quiz agent's crash tool); the offline "
        "A/B's modes (docs/demo.md).",
    ),
) -> None:
    """Run the whole RL loop on this CPU machine (rollouts, the reference trainer, weight pushes)
    and write a step report.

    On a first run as root with apt-get, missing bubblewrap and tmux are installed (said on stderr);
    any other missing prerequisite ends it with one line saying what to run, exit status 2."""
    from rl360_ext.local.demo.faults import parse_injections
    from rl360_ext.local.demo.plan import DemoConfig
    from rl360_ext.local.demo.run import run_demo
    from rl360_ext.local.demo.stack import demo_stack_config
    from rl360_ext.local.stack import preflight

    try:
        injections = parse_injections(inject)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--inject") from None

    settings = {
        "lr": lr,
        "head_lr": head_lr,
        "engine_dtype": dtype,
        "session_servers": session_servers,
        "harbor_replicas": harbor_replicas,
        "schedule": schedule,
        "pause_mode": pause_mode,
        "keep_old_actor": keep_old_actor,
        "top_logprobs_num": top_logprobs_num,
        "eval_interval": eval_interval,
        "engine_churn": engine_churn,
        "quarantine_file": _demo_quarantine_file(out) if audit_tasks else None,
        "inject": injections,
        "gate": gate if gate is not None else compare in (None, "schedules"),
    }
    try:
        config = DemoConfig(
            steps=steps, tasks=tasks, attempts=attempts, faults=faults, engines=engines, out=out, **settings
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    arms = None
    if compare not in (None, "schedules"):
        from rl360_ext.local.ab.compare import parse_compare

        try:
            arms = parse_compare(compare)
        except ValueError as err:
            raise typer.BadParameter(str(err), param_hint="--compare") from None
    modes, ab_seeds = _ab_runs(arms is not None, seeds, fault_modes)
    if arms is not None:
        from rl360_ext.local.ab.compare import compare_runs

        try:  # every run's settings, before anything starts (rl360-list needs a crash-tool mode)
            compare_runs(config, arms, modes, ab_seeds)
        except ValueError as err:
            raise typer.BadParameter(str(err), param_hint="--compare") from None
    preflight(demo_stack_config(config), "rl360 demo", install=True)
    if audit_tasks:
        _audit_demo_tasks(out)
    if compare == "schedules":
        from rl360_ext.local.demo.schedules import compare_schedules

        figures = compare_schedules(config)
        raise typer.Exit(1 if any(side["problems"] for side in figures.values()) else 0)
    if arms is not None:
        from rl360_ext.local.ab.compare import run_compare

        raise typer.Exit(1 if run_compare(config, arms, modes, ab_seeds).problems else 0)
    result = run_demo(config)
    raise typer.Exit(1 if result.problems else 0)


def _ab_runs(ab: bool, seeds: int | None, fault_modes: str | None) -> tuple[list[str], int]:
    """The fault A/B's modes and seeds from `--fault-modes` and `--seeds` (defaults when unset); a
    BadParameter names the option when one is bad or given without `--compare upstream[,clean]`."""
    for value, flag in ((seeds, "--seeds"), (fault_modes, "--fault-modes")):
        if value is not None and not ab:
            raise typer.BadParameter(f"{flag} needs --compare upstream[,clean]", param_hint=flag)
    if seeds is not None and seeds < 1:
        raise typer.BadParameter(f"--seeds must be an integer >= 1, got {seeds}", param_hint="--seeds")
    try:
        modes = list(
            parse_names(
                LIVE_FAULT_MODES if fault_modes is None else fault_modes, FAULT_MODES, "--fault-modes"
            )
        )
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--fault-modes") from None
    return modes, LIVE_SEEDS if seeds is None else seeds


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


def _faults_needs() -> None:
    from rl360_ext.local.bench.fault_matrix import matrix_stack_config
    from rl360_ext.local.stack import preflight

    preflight(matrix_stack_config(Path(tempfile.gettempdir())), "rl360 bench faults", install=True)


def _harbor_needs() -> None:
    from rl360_ext.local.stack import HarborServer, StackConfig, preflight

    config = StackConfig(out=Path(tempfile.gettempdir()), gateway=False, harbors=(HarborServer(),))
    preflight(config, "rl360 bench harbor", install=True)


BENCHES: dict[str, tuple[str, Callable[[], None] | None]] = {
    "engine": ("Prefill and decode tokens/s of the tiny engine at its default size.", None),
    "r3": ("R3 routing data: wire vs json/orjson, delta vs full routing bytes, pool collection.", None),
    "template": ("Append-only checker cost at server start vs rendering each request once.", None),
    "launch": (
        "Simulated 8,192 sandbox starts: all at once vs waves, image-group pinning vs random placement.",
        None,
    ),
    "faults": (
        "Fault matrix: every injected infra failure, its class, and proof its reward enters no mean.",
        _faults_needs,
    ),
}  # name -> (help, check or install what it needs first)


def _bench_command(name: str, needs: Callable[[], None] | None) -> Callable[[bool], None]:
    def run(json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
        if needs is not None:
            needs()
        main = importlib.import_module(f"rl360_ext.local.bench.{name}").main
        with signals_raise(), showing_progress(f"rl360 bench {name}"):
            main(as_json=json)

    return run


for _name, (_help, _needs) in BENCHES.items():
    bench_app.command(_name, help=_help)(_bench_command(_name, _needs))


@bench_app.command("harbor")
def bench_harbor(
    env: str = typer.Option(
        "bwrap", "--env", help="bwrap: one replica's throughput; docker: waves and pinning on real pulls."
    ),
    json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """One Harbor /run replica (process and Ray actor) at max_concurrent 8/16: attempts/s, starts/s,
    CPU per attempt, RSS, memory per live sandbox. With --env docker: launch waves vs all at once and
    image pinning vs anywhere on two real engines behind an overloaded registry, and reservations
    beside a heavy build (needs `rl360 containers up`)."""
    if env not in ("bwrap", "docker"):
        raise typer.BadParameter(f"--env must be bwrap or docker, got {env!r}")
    name = "harbor" if env == "bwrap" else "docker_waves"
    _bench_command(name, _harbor_needs if env == "bwrap" else None)(json)


@bench_app.command("trainer")
def bench_trainer(
    megatron: bool = typer.Option(
        False,
        "--megatron",
        help="Also measure Miles' Megatron fork on CPU (needs MILES_SRC, MEGATRON_SRC, the scratch venv "
        "of integration_tests/miles/setup_venv.sh and this source checkout).",
    ),
    miles_src: str | None = typer.Option(
        None, envvar="MILES_SRC", help="With --megatron: a radixark/miles checkout."
    ),
    megatron_src: str | None = typer.Option(
        None, envvar="MEGATRON_SRC", help="With --megatron: radixark/Megatron-LM, branch miles-main."
    ),
    json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """|Δ log p| and routing agreement of the reference trainer vs float64/float32 engines, R3 on and
    off, and its forward+backward tokens/s; with --megatron, Megatron-on-CPU's beside them."""
    from rl360_ext.local.bench.megatron import find_setup
    from rl360_ext.local.bench.trainer import main

    setup = find_setup(miles_src, megatron_src) if megatron else None
    with signals_raise(), showing_progress("rl360 bench trainer"):
        main(as_json=json, megatron=setup)


def _numbers(text: str, flag: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"expects comma-separated whole numbers, got {text!r}", param_hint=flag
        ) from None
    if not values or min(values) < 1:
        raise typer.BadParameter(f"expects numbers >= 1, got {text!r}", param_hint=flag)
    return values


def _choices(text: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    """A comma-separated flag's values, each one of `allowed`; typer's usage error naming `flag` else."""
    values = [part.strip() for part in text.split(",") if part.strip()]
    if not values or any(value not in allowed for value in values):
        raise typer.BadParameter(
            f"expects one or more of {', '.join(allowed)}, comma-separated, got {text!r}", param_hint=flag
        )
    return values


@bench_app.command("sessions")
def bench_sessions(
    concurrency: str = typer.Option("1,32,256", help="Concurrent sessions per case, comma-separated."),
    turns: str = typer.Option("16", help="Turns per conversation, comma-separated."),
    r3: str = typer.Option("off,on", help="Routing replay (61 layers x top-8): off, on, or off,on."),
    servers: str = typer.Option("1", help="Session servers the sessions are spread over, comma-separated."),
    hosting: str = typer.Option(
        "process",
        help="What the servers run in: process (rl360 session serve), actor (a SessionPool's Ray actors), "
        "or process,actor.",
    ),
    backend: str = typer.Option("instant", help="instant (the server's own cost) or tiny (real engine)."),
    miles_src: str | None = typer.Option(
        None,
        envvar="MILES_SRC",
        help="A radixark/miles checkout: run Miles' own session server beside rl360's.",
    ),
    miles_python: str | None = typer.Option(
        None,
        help="Interpreter Miles' server imports in (default: this one, $MILES_VENV's, /tmp/miles-venv's).",
    ),
    rounds: int = typer.Option(
        1, min=1, help="Runs per server and case, alternating A/B then B/A (medians)."
    ),
    miles_modes: str = typer.Option(
        "full,in_place",
        help="Miles' R3 modes to run with R3 on: full (its default), in_place (deltas), or both.",
    ),
    stall_s: float = typer.Option(
        10.0,
        min=0.0,
        help="Seconds of each phase of the stall case (idle, then beside the largest request); 0: off.",
    ),
    json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Session server under load: turns/s, added latency, CPU per turn, bytes, memory per session.

    With a Miles checkout, Miles' own session server runs beside rl360's on every case.
    """
    from rl360_ext.local.bench.miles_sessions import MILES_MODES, MilesUnavailable
    from rl360_ext.local.bench.session_case import Hosting
    from rl360_ext.local.bench.sessions import main

    flags = {"off": False, "on": True}
    modes = _choices(r3, tuple(flags), "--r3")
    if backend not in ("instant", "tiny"):
        raise typer.BadParameter(f"expects instant or tiny, got {backend!r}", param_hint="--backend")
    chosen = _choices(miles_modes, MILES_MODES, "--miles-modes")
    hostings = _choices(hosting, tuple(Hosting), "--hosting")
    with signals_raise(), showing_progress("rl360 bench sessions"):
        try:
            main(
                as_json=json,
                concurrency=_numbers(concurrency, "--concurrency"),
                turns=_numbers(turns, "--turns"),
                r3=[flags[mode] for mode in modes],
                servers=_numbers(servers, "--servers"),
                backend=backend,
                miles_src=miles_src,
                miles_python=miles_python,
                rounds=rounds,
                miles_modes=chosen,
                hostings=[Hosting(part) for part in hostings],
                stall_s=stall_s,
            )
        except MilesUnavailable as exc:
            raise typer.BadParameter(str(exc), param_hint="--miles-src") from None
