"""One `rl360 demo` run from start to end: a fresh output folder, the log file, SIGTERM as an
interrupt, the stack started and always stopped, the driver's steps, then `summary.json` and
`report.html` (`run_demo`, `DemoResult`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import os
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress

from rl360_ext.local.demo.console import (
    PROGRESS_COLUMNS,
    harbor_pool_line,
    infra_table,
    learning_line,
    summary_table,
)
from rl360_ext.local.demo.driver import DemoDriver
from rl360_ext.local.demo.miles_args import METRICS_FILE
from rl360_ext.local.demo.plan import DemoConfig
from rl360_ext.local.demo.policy import demo_policy
from rl360_ext.local.demo.stack import demo_stack
from rl360_ext.local.demo.summary import StepSummary
from rl360_ext.local.engines import engine_busy_seconds, engine_fault_counts
from rl360_ext.util.console import make_console, print_table

REPORT_FILE = "report.html"


SUMMARY_FILE = "summary.json"


TRANSFORMERS_ADVISORY_ENV = "TRANSFORMERS_NO_ADVISORY_WARNINGS"


@dataclass
class DemoResult:
    out: Path
    summaries: list[StepSummary]
    pushes: list[dict[str, Any]]
    wall_s: float
    metrics_path: Path
    report_path: Path
    engine_503s: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    loop_s: float | None = None  # the driver's steps alone (no stack start, no warm start)
    engine_idle_share: float | None = None  # engine_idle_share over the driver's steps
    harbor_replicas: list[dict[str, Any]] = field(default_factory=list)  # the Harbor pool's, if any
    harbor_replacements: list[dict[str, Any]] = field(default_factory=list)  # by the pool's watchdog


def write_summary(config: DemoConfig, result: DemoResult) -> Path:
    """The summary table as JSON (`summary.json`), plus the run's settings and wall time."""
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()}
    body = {
        "config": settings,
        "wall_s": result.wall_s,
        "steps": [{**asdict(s), "infra": s.infra} for s in result.summaries],
        "pushes": result.pushes,
        "engine_503s": result.engine_503s,
        "problems": result.problems,
        "loop_s": result.loop_s,
        "engine_idle_share": result.engine_idle_share,
        "harbor_replicas": result.harbor_replicas,
        "harbor_replacements": result.harbor_replacements,
    }
    path = config.out / SUMMARY_FILE
    path.write_text(json.dumps(body, indent=2) + "\n")
    return path


def _import_transformers_quietly() -> None:
    """Import transformers now, without its "PyTorch was not found" advisory (rl360 never needs
    torch), instead of letting the first tokenizer load print it over the progress bars."""
    saved = os.environ.get(TRANSFORMERS_ADVISORY_ENV)
    os.environ[TRANSFORMERS_ADVISORY_ENV] = "1"
    try:
        importlib.import_module("transformers")
    finally:
        if saved is None:
            del os.environ[TRANSFORMERS_ADVISORY_ENV]
        else:
            os.environ[TRANSFORMERS_ADVISORY_ENV] = saved


def _fresh_output(out: Path) -> None:
    """A re-run into the same folder starts clean: the JSONL is append-only."""
    out.mkdir(parents=True, exist_ok=True)
    for name in (METRICS_FILE, REPORT_FILE, SUMMARY_FILE):
        (out / name).unlink(missing_ok=True)
    for name in ("weights", "trials"):
        shutil.rmtree(out / name, ignore_errors=True)


@contextlib.contextmanager
def _log_to_file(path: Path) -> Iterator[None]:
    """rl360's own log lines (per-attempt warnings) go to logs/driver.log, not over the progress bars."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    package = logging.getLogger("rl360_ext")
    saved = (package.level, package.propagate)
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    package.propagate = False
    try:
        yield
    finally:
        package.removeHandler(handler)
        package.setLevel(saved[0])
        package.propagate = saved[1]
        handler.close()


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops the demo the way Ctrl-C does (through every `finally`)."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_demo(config: DemoConfig, console: Console | None = None, *, reuse_ray: bool = False) -> DemoResult:
    """Start the stack, run `config.steps` rollout steps in Miles' order, stop everything, write
    the report. With `reuse_ray`, on the local Ray this process runs (`local.stack.shared_ray`: the
    runs of one `--compare`), which it leaves running."""
    from rl360_ext.diagnostics.report import main as write_report

    console = console or make_console()
    _fresh_output(config.out)
    _import_transformers_quietly()
    started = time.monotonic()
    engine_503s: dict[str, int] = {}
    replicas: list[dict[str, Any]] = []
    replacements: list[dict[str, Any]] = []
    console.print(
        f"rl360 demo: {config.steps} steps x {config.tasks} tasks x {config.attempts} attempts, "
        f"{config.engines} engines, faults {config.faults:g}, output {config.out}"
    )
    with _sigterm_as_interrupt(), _log_to_file(config.out / "logs" / "driver.log"):
        console.print("starting tiny engines, the SMG gateway, the Harbor /run server and local Ray ...")
        with demo_stack(config, reuse_ray) as stack:
            try:
                console.print(
                    f"ready in {time.monotonic() - started:.1f} s: gateway {stack.gateway_url}, "
                    f"engines {', '.join(e.url for e in stack.engines)}, Harbor {stack.harbor_urls}; "
                    f"logs in {stack.logs}"
                )
                with Progress(*PROGRESS_COLUMNS, console=console) as progress:
                    driver = DemoDriver(config, stack, progress, demo_policy(config))
                    busy_before, loop_started = engine_busy_seconds(stack.engines), time.monotonic()
                    summaries = asyncio.run(driver.run())
                    loop_s = time.monotonic() - loop_started
                    idle_share = engine_idle_share(busy_before, engine_busy_seconds(stack.engines), loop_s)
                if config.faults > 0:
                    engine_503s = engine_fault_counts(stack.engines)
                if stack.harbor_pool is not None:
                    replicas, replacements = stack.harbor_replicas(), list(stack.harbor_pool.replacements)
            finally:
                console.print("stopping every process the demo started ...")
                stopping = time.monotonic()
    wall_s = time.monotonic() - started
    console.print(f"stopped in {time.monotonic() - stopping:.1f} s")
    print_table(console, summary_table(summaries))
    if (by_cause := infra_table(summaries)) is not None:
        print_table(console, by_cause)
    if engine_503s:
        console.print("engine 503s injected: " + ", ".join(f"{name} {n}" for name, n in engine_503s.items()))
    if replicas:
        console.print(harbor_pool_line(replicas, replacements))
    for problem in driver.problems:
        console.print(f"[bold red]MISMATCH[/] {problem}")
    console.print(learning_line(summaries, wall_s))
    if (gate_line := driver.gate.summary_line()) is not None:
        console.print(gate_line)
    report_path = config.out / REPORT_FILE
    write_report(config.out, report_path)
    result = DemoResult(
        out=config.out,
        summaries=summaries,
        pushes=driver.pushes,
        wall_s=wall_s,
        metrics_path=config.out / METRICS_FILE,
        report_path=report_path,
        engine_503s=engine_503s,
        problems=list(driver.problems),
        loop_s=loop_s,
        engine_idle_share=idle_share,
        harbor_replicas=replicas,
        harbor_replacements=replacements,
    )
    write_summary(config, result)
    console.print(
        f"done in {wall_s:.1f} s: {config.out / METRICS_FILE}, {report_path}, {config.out / SUMMARY_FILE}"
    )
    return result


def engine_idle_share(before: dict[str, float], after: dict[str, float], seconds: float) -> float | None:
    """The share of `seconds` x engines the engines spent outside model steps (None if unreadable)."""
    if not before or seconds <= 0 or any(v < 0 for v in (*before.values(), *after.values())):
        return None
    if set(before) != set(after):  # an engine was replaced (--engine-churn): no common clock
        return None
    busy = sum(after[name] - before[name] for name in before)
    return max(0.0, 1.0 - busy / (seconds * len(before)))
