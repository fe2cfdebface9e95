"""`rl360 bench trainer --megatron`: Miles' Megatron fork on CPU, measured beside the reference trainer.

Owns finding what the option needs, running the measurement, and turning its JSON into rows.
Megatron and torch live only in the Python 3.11 scratch venv (integration_tests/miles/
setup_venv.sh) and the CPU shims and the weight mapping in this repository's
integration_tests/megatron/ (a source checkout), so nothing here imports them: `find_setup`
checks the checkouts (MILES_SRC, MEGATRON_SRC), the venv (MILES_VENV, default /tmp/miles-venv)
and the entry point, raising `Unavailable` (one line naming everything missing; the CLI exits 2);
`run_megatron` runs `python -m integration_tests.megatron.bench` in that venv and reads the JSON it
writes (an exit status 2 there, Megatron or Miles not importing, is `Unavailable` too);
`forward_rows`, `gradient_row` and `speed_row` are the table rows (pure, unit-tested).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl360_ext.util.prereqs import EXIT_UNAVAILABLE, Unavailable, require

COMMAND = "rl360 bench trainer --megatron"
ENTRY_MODULE = "integration_tests.megatron.bench"
ENTRY_FILE = Path("integration_tests") / "megatron" / "bench.py"
REPO_ROOT = Path(__file__).resolve().parents[3]  # a source checkout: rl360_ext/local/bench/ -> root
DEFAULT_VENV = Path("/tmp/miles-venv")
VENV_ENV = "MILES_VENV"
MILES_MARKER = Path("miles") / "utils" / "replay_base.py"
MEGATRON_MARKER = Path("megatron") / "core" / "transformer" / "moe" / "router.py"
SCHEMA = 1  # the entry point's JSON schema this module reads
RUN_TIMEOUT_S = 1800.0
MODES = {"r3_on": "replay", "r3_off": "own top-k"}
PRECISIONS = {"stock": "Megatron, stock", "lifted": "Megatron, float64"}
PRECISIONS_NOTE = (
    "stock: Megatron's float32 RoPE and router gates as they are; float64: both lifted "
    "(integration_tests/megatron/precision.py)"
)
REFERENCE = "reference trainer"


@dataclass(frozen=True)
class MegatronSetup:
    """The two checkouts, the venv's interpreter, and the source checkout holding the entry point."""

    miles_src: Path
    megatron_src: Path
    python: Path
    root: Path


def find_setup(
    miles_src: str | None,
    megatron_src: str | None,
    venv: str | None = None,
    root: Path = REPO_ROOT,
) -> MegatronSetup:
    """The setup `--megatron` runs with; `Unavailable` naming every missing piece otherwise.

    `venv` None means $MILES_VENV, else /tmp/miles-venv.
    """
    venv_dir = Path(venv or os.environ.get(VENV_ENV) or DEFAULT_VENV).expanduser()
    python = venv_dir / "bin" / "python"
    problems = [
        _checkout_problem(
            "MILES_SRC", miles_src, MILES_MARKER, "a radixark/miles checkout (tested at 31f1ca96)"
        ),
        _checkout_problem(
            "MEGATRON_SRC",
            megatron_src,
            MEGATRON_MARKER,
            "a radixark/Megatron-LM checkout, branch miles-main",
        ),
        None
        if python.is_file()
        else f"the scratch venv {venv_dir} ({VENV_ENV}; build it with MILES_SRC=... "
        "bash integration_tests/miles/setup_venv.sh)",
        None
        if (root / ENTRY_FILE).is_file()
        else f"a source checkout of rl360-ext ({ENTRY_FILE} is not under {root})",
    ]
    require(COMMAND, problems)
    assert miles_src is not None and megatron_src is not None  # require() raised otherwise
    return MegatronSetup(
        miles_src=Path(miles_src).expanduser().resolve(),
        megatron_src=Path(megatron_src).expanduser().resolve(),
        python=python,
        root=root,
    )


def _checkout_problem(env: str, value: str | None, marker: Path, what: str) -> str | None:
    if not value:
        return f"{env} set to {what}"
    path = Path(value).expanduser()
    if not (path / marker).is_file():
        return f"{env}={value} to be {what} (no {marker.as_posix()})"
    return None


def command(setup: MegatronSetup, out: Path, seed: int = 0) -> list[str]:
    """The entry point's argv, run in `setup.root`."""
    return [str(setup.python), "-m", ENTRY_MODULE, "--out", str(out), "--seed", str(seed)]


def run_megatron(setup: MegatronSetup, seed: int = 0, timeout_s: float = RUN_TIMEOUT_S) -> dict[str, Any]:
    """Run the entry point in the venv; its JSON figures (`Unavailable` if Megatron does not import)."""
    with tempfile.TemporaryDirectory(prefix="rl360-bench-megatron-") as scratch:
        out = Path(scratch) / "megatron.json"
        env = {**os.environ, "MILES_SRC": str(setup.miles_src), "MEGATRON_SRC": str(setup.megatron_src)}
        done = subprocess.run(
            command(setup, out, seed),
            cwd=setup.root,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if done.returncode == EXIT_UNAVAILABLE:
            raise Unavailable(f"{COMMAND}: {_last_line(done.stderr)}")
        if done.returncode != 0 or not out.is_file():
            raise RuntimeError(
                f"{COMMAND}: {ENTRY_MODULE} failed (exit {done.returncode}):\n{done.stderr[-4000:]}"
            )
        return parse(out.read_text())


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


def parse(text: str) -> dict[str, Any]:
    """The entry point's JSON, checked for the schema and the sections the rows read."""
    data = json.loads(text)
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema != SCHEMA:
        raise ValueError(f"{ENTRY_MODULE} wrote schema {schema}, this bench reads {SCHEMA}")
    missing = [key for key in ("forward", "gradient", "demo_size", "versions") if key not in data]
    if missing:
        raise ValueError(f"{ENTRY_MODULE}'s JSON lacks {', '.join(missing)}")
    return data


def _forward_cells(row: Mapping[str, float]) -> tuple[str, str, str]:
    return (
        f"{row['logprob_abs_diff_mean']:.2e}",
        f"{row['logprob_abs_diff_max']:.2e}",
        f"{row['routing_agreement']:.4f}",
    )


def forward_rows(
    reference: Mapping[str, Mapping[str, float]], megatron: Mapping[str, Any]
) -> list[tuple[str, str, str, str, str]]:
    """(model, R3, |Δ log p| mean, max, routing agreement) against the float64 engine: the reference
    trainer's rows (`reference`: bench trainer's mismatch["float64"]) then Megatron's, stock and lifted."""
    rows = [(REFERENCE, MODES[mode], *_forward_cells(reference[mode])) for mode in MODES]
    for precision, label in PRECISIONS.items():
        figures = megatron["forward"][precision]
        rows += [(label, MODES[mode], *_forward_cells(figures[mode])) for mode in MODES]
    return rows


def gradient_row(megatron: Mapping[str, Any]) -> tuple[str, str, str]:
    """(parameters, max relative error, median) of Megatron + Miles' loss vs the reference trainer."""
    gradient = megatron["gradient"]
    return (
        f"{gradient['parameters']:.0f}",
        f"{gradient['max_relative_error']:.2e}",
        f"{gradient['median_relative_error']:.2e}",
    )


def speed_row(megatron: Mapping[str, Any], samples: int, length: int) -> tuple[str, str, str, str]:
    """The throughput table's Megatron row: (workload, tokens, seconds, tokens/s)."""
    row = megatron["demo_size"]
    return (
        f"Megatron-on-CPU, demo size ({samples} x {length} tokens)",
        f"{row['tokens']:,.0f}",
        f"{row['seconds']:.1f}",
        f"{row['tokens_per_s']:,.0f}",
    )


def versions_line(megatron: Mapping[str, Any]) -> str:
    """Which Miles, Megatron-LM and torch the figures are from."""
    versions = megatron["versions"]
    return (
        f"Miles {str(versions.get('miles', '?'))[:8]}, Megatron-LM {str(versions.get('megatron', '?'))[:8]}, "
        f"torch {versions.get('torch', '?')} (CPU, {versions.get('torch_threads', 0):.0f} threads)"
    )
