"""`rl360 tasks ...` commands (thin: the audit's flags come from `AuditConfig`'s fields through
`rl360_ext.cli.fields`, the work is `rl360_ext.tasks.audit`)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import typer
from rich.table import Table

from rl360_ext.cli.fields import config_command
from rl360_ext.tasks.audit import AuditConfig, Cache, RunFailed, audit_tasks, find_tasks, from_cache
from rl360_ext.tasks.health import QUARANTINE_FILE, TASK_HEALTH_FILE, TaskHealth, document, write_outputs
from rl360_ext.tasks.verdicts import CONTROL_AGENTS, Control

app = typer.Typer(help="Task health: audit a task set with controls before training.", no_args_is_help=True)


def _keyword(name: str, annotation: object, option: object) -> inspect.Parameter:
    """A keyword-only parameter of the derived command: its name, type and typer option."""
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=option)


_EXTRA = [
    inspect.Parameter(
        "tasks_root",
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        annotation=Path,
        default=typer.Argument(
            ..., help="Directory whose subdirectories (each with task.toml) are the tasks."
        ),
    ),
    _keyword(
        "task",
        list[str] | None,
        typer.Option(None, "--task", help="Audit only this task (repeatable; default: every task)."),
    ),
    _keyword(
        "harbor",
        str | None,
        typer.Option(
            None,
            "--harbor",
            help="URL of a running Harbor /run server over the same TASKS_ROOT (default: start one).",
        ),
    ),
    _keyword(
        "token_file",
        Path | None,
        typer.Option(None, "--token-file", help="Bearer token for --harbor (first line of the file)."),
    ),
    _keyword(
        "out",
        Path,
        typer.Option(
            Path("task-health"),
            "--out",
            help="Where task_health.jsonl, quarantine.json and task_health.html go.",
        ),
    ),
    _keyword(
        "cache_dir",
        Path | None,
        typer.Option(None, "--cache-dir", help="Result cache by task content digest (default: OUT/cache)."),
    ),
    _keyword("no_cache", bool, typer.Option(False, "--no-cache", help="Run every task's controls again.")),
    _keyword(
        "as_json",
        bool,
        typer.Option(False, "--json", help='Print {"tasks": [{"task", "verdicts", "evidence"}]}.'),
    ),
]


def _own_agents() -> list[str]:
    """The agent names of a server `rl360 tasks audit` starts (Harbor's defaults and the canaries)."""
    from rl360_ext.harbor.agents import DEFAULT_AGENTS
    from rl360_ext.harbor.canaries import CANARY_AGENTS

    return sorted({*DEFAULT_AGENTS, *CANARY_AGENTS})


@contextlib.contextmanager
def _server(tasks_root: Path, harbor: str | None, config: AuditConfig, logs: Path) -> Iterator[str]:
    """The URL of the /run server to audit through: `harbor`, or one started here (bwrap sandboxes)."""
    if harbor is not None:
        yield harbor
        return
    from rl360_ext.harbor.canaries import CANARY_AGENTS
    from rl360_ext.local.services import start_harbor
    from rl360_ext.util.prereqs import bwrap_problem, require

    require("rl360 tasks audit", [bwrap_problem()])
    canaries = [f"--agent={name}={path}" for name, path in CANARY_AGENTS.items()]
    flags = (
        "--max-concurrent",
        str(config.concurrency),
        "--keep-trials",
        "none",
        "--trials-dir",
        str(logs / "trials"),
    )
    service = start_harbor(
        logs, tasks_root, CONTROL_AGENTS[Control.ORACLE], *canaries, *flags, name="harbor-audit"
    )
    try:
        yield service.url
    finally:
        service.stop()


async def _audit(
    url: str,
    token: str | None,
    tasks: list[tuple[str, Path]],
    config: AuditConfig,
    cache_dir: Path | None,
) -> list[TaskHealth]:
    from rl360_ext.tasks.client import HarborClient

    client = HarborClient(url, token=token)
    try:
        agents = await client.agents()
        cache = Cache(cache_dir, config, agents) if cache_dir is not None else None
        return await audit_tasks(tasks, client, config, agents, cache)
    finally:
        await client.aclose()


def _table(results: list[TaskHealth]) -> Table:
    table = Table(title="task health")
    for header in ("task", "verdicts", "oracle", "nop", "oracle agent s", "undecided", "cached"):
        table.add_column(header)
    for r in results:
        ev = r.evidence
        oracle, nop = ev.get("oracle") or {}, ev.get("nop") or {}
        table.add_row(
            r.task,
            ",".join(r.verdicts) or "-",
            f"{oracle['passed']}/{oracle['valid']}" if oracle else "-",
            f"{nop['above_floor']}/{nop['valid']}" if nop else "-",
            f"{ev['oracle_agent_s']:.2f}" if ev.get("oracle_agent_s") is not None else "-",
            ",".join(ev.get("undecided", [])) or "-",
            "yes" if ev.get("cached") else "no",
        )
    return table


def audit_tree(
    tasks_root: Path,
    tasks: list[tuple[str, Path]],
    config: AuditConfig,
    out: Path,
    cache: Path | None,
    harbor: str | None = None,
    token: str | None = None,
) -> list[TaskHealth]:
    """The audit of `tasks` (under `tasks_root`) through `harbor` or a server started for it,
    every task served from `cache` when it can be; writes OUT's files. A server that cannot be
    reached ends the command with one line on stderr, exit status 1."""
    # A server this command starts runs these agents: every task cached for them needs none started.
    results = (
        None
        if cache is None or harbor is not None
        else from_cache(tasks, Cache(cache, config, _own_agents()))
    )
    if results is None:
        scratch = tempfile.TemporaryDirectory(prefix="rl360-audit-", ignore_cleanup_errors=True)
        with scratch, _server(tasks_root.resolve(), harbor, config, Path(scratch.name)) as url:
            try:
                results = asyncio.run(_audit(url, token, tasks, config, cache))
            except (RunFailed, ValueError) as exc:
                typer.echo(f"rl360 tasks audit: {exc}", err=True)
                raise typer.Exit(1) from None
    write_outputs(results, out)
    from rl360_ext.diagnostics.task_health_page import write_task_health_page

    write_task_health_page(results, out, str(tasks_root))
    return results


def print_health(results: list[TaskHealth], out: Path) -> None:
    """The audit's table, and where its files went."""
    from rl360_ext.util.console import make_console, print_table

    console = make_console()
    print_table(console, _table(results))
    from rl360_ext.diagnostics.task_health_page import TASK_HEALTH_PAGE

    wrote = f"{out / TASK_HEALTH_FILE}, {out / QUARANTINE_FILE} and {out / TASK_HEALTH_PAGE}"
    console.out(f"wrote {wrote}", highlight=False)


def _run(
    config: AuditConfig,
    tasks_root: Path,
    task: list[str] | None,
    harbor: str | None,
    token_file: Path | None,
    out: Path,
    cache_dir: Path | None,
    no_cache: bool,
    as_json: bool,
) -> None:
    """Audit every task under TASKS_ROOT with controls (lint, environment, oracle, nop, slow oracle,
    verifier regrade, insensitive, canary hacks, work-product hijack, leak probe) through a Harbor
    /run server; write task_health.jsonl, quarantine.json and task_health.html."""
    if not tasks_root.is_dir():
        raise typer.BadParameter(f"{tasks_root} is not a directory", param_hint="TASKS_ROOT")
    try:
        tasks = find_tasks(tasks_root, task or ())
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--task") from None
    token = token_file.read_text().splitlines()[0].strip() if token_file is not None else None
    cache = None if no_cache else (cache_dir or out / "cache")
    results = audit_tree(tasks_root, tasks, config, out, cache, harbor, token)
    if as_json:
        typer.echo(json.dumps(document(results), sort_keys=True))
        return
    print_health(results, out)


app.command("audit")(config_command(AuditConfig, _run, extra=_EXTRA))
