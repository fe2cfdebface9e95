"""`rl360 bench faults`: the fault matrix as a table (or JSON).

Owns printing the matrix of `rl360_ext.local.bench.fault_matrix`: for every injected failure, the class the
attempt got, whether its reward reached any mean or baseline (must be "no" for every infra
attempt), and, as the baseline measured in the same run, how far the other attempts' advantages
move when the failure is scored 0.0 the way upstream's Harbor example scores it. Exits 1 when a
class is unexpected or an infra reward entered a statistic. It does not own the cases or checks.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from rl360_ext.local.bench.fault_matrix import CASES, MatrixRow, quiet, run_matrix, summarize


def _yes_no(value: bool) -> str:
    return "yes" if value else "no"


def _print_table(rows: list[MatrixRow], seconds: float) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Fault matrix: real Harbor server, SessionPool, tiny engine, SMG gateway")
    table.add_column("case", no_wrap=True)
    table.add_column("injected")
    table.add_column("class", no_wrap=True)
    table.add_column("ok", justify="center")
    table.add_column("harbor / client cause", no_wrap=True)
    table.add_column("reward", justify="right")
    table.add_column("trained tokens", justify="right")
    table.add_column("enters a mean", justify="center")
    table.add_column("upstream shift", justify="right")
    table.add_column("s", justify="right")
    for row in rows:
        table.add_row(
            row.case,
            row.injected + (f" [{row.note}]" if row.note else ""),
            row.attempt_class,
            "[green]yes[/]" if row.class_ok else "[red]NO[/]",
            row.failure_cause or "-",
            "-" if row.reward is None else f"{row.reward:g}",
            f"{row.loss_tokens}/{row.response_tokens}",
            _yes_no(row.enters_means) if row.attempt_class == "valid" else (
                "[red]YES[/]" if row.enters_means else "[green]no[/]"
            ),
            "-" if row.upstream_shift is None else f"{row.upstream_shift:.3f}",
            f"{row.seconds:.1f}",
        )  # fmt: skip
    console = Console(width=max(Console().width, 200))
    console.print(table)
    summary = summarize(rows)
    shift = "-" if summary.max_upstream_shift is None else f"{summary.max_upstream_shift:.3f}"
    console.print(
        f"{summary.classes_ok}/{summary.rows} classes as expected; "
        f"infra rewards entering a mean or baseline: {summary.infra_entering_means}/{summary.infra_rows}; "
        f"valid policy failures kept: {summary.policy_failures_kept}; "
        f"upstream (failure scored 0.0) shifts the others' advantages by up to {shift}; "
        f"{seconds:.0f} s."
    )
    for failure in summary.failures:
        console.print(f"[red]FAIL[/] {failure}")


def main(as_json: bool) -> None:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rl360-faults-") as work, quiet():
        rows = asyncio.run(run_matrix(Path(work), CASES))
    seconds = time.monotonic() - started
    summary = summarize(rows)
    if as_json:
        print(
            json.dumps(
                {"rows": [row.as_dict() for row in rows], "summary": asdict(summary), "seconds": seconds},
                indent=2,
                default=str,
            )
        )
    else:
        _print_table(rows, seconds)
    if summary.failures:
        raise SystemExit(1)
