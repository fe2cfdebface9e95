"""`rl360 bench trainer --megatron`'s pure parts: finding what it needs, the exit-2 line, the JSON's rows.

No torch or Megatron: the checkouts, the venv and the entry point are stand-in files under tmp_path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rl360_ext.cli import app
from rl360_ext.local.bench import megatron as bench
from rl360_ext.util.prereqs import EXIT_UNAVAILABLE, Unavailable


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    return path


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    """A Miles and a Megatron checkout, a venv and a source checkout, each just its marker files."""
    miles, megatron, venv, root = (tmp_path / name for name in ("miles", "megatron", "venv", "repo"))
    _touch(miles / bench.MILES_MARKER)
    _touch(megatron / bench.MEGATRON_MARKER)
    _touch(venv / "bin" / "python")
    _touch(root / bench.ENTRY_FILE)
    return {"miles": miles, "megatron": megatron, "venv": venv, "root": root}


def test_find_setup_with_everything_present(layout: dict[str, Path]) -> None:
    setup = bench.find_setup(
        str(layout["miles"]), str(layout["megatron"]), str(layout["venv"]), root=layout["root"]
    )
    assert setup.python == layout["venv"] / "bin" / "python"
    assert setup.miles_src == layout["miles"].resolve()
    argv = bench.command(setup, Path("/out.json"), seed=3)
    assert argv[:3] == [str(setup.python), "-m", bench.ENTRY_MODULE]
    assert argv[3:] == ["--out", "/out.json", "--seed", "3"]


def test_every_missing_piece_is_named_on_one_line(tmp_path: Path) -> None:
    with pytest.raises(Unavailable) as raised:
        bench.find_setup(None, None, str(tmp_path / "no-venv"), root=tmp_path)
    line = str(raised.value)
    assert "\n" not in line
    assert line.startswith("rl360 bench trainer --megatron needs ")
    for what in ("MILES_SRC", "MEGATRON_SRC", "no-venv", "setup_venv.sh", "a source checkout"):
        assert what in line


def test_a_directory_that_is_not_the_checkout_is_named(layout: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(Unavailable, match=r"MEGATRON_SRC=.*not-megatron.*router\.py") as raised:
        bench.find_setup(
            str(layout["miles"]), str(tmp_path / "not-megatron"), str(layout["venv"]), root=layout["root"]
        )
    assert "MILES_SRC" not in str(raised.value)


def test_the_venv_defaults_to_miles_venv(layout: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(bench.VENV_ENV, str(layout["venv"]))
    setup = bench.find_setup(str(layout["miles"]), str(layout["megatron"]), root=layout["root"])
    assert setup.python == layout["venv"] / "bin" / "python"


def test_cli_exits_2_with_the_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("MILES_SRC", raising=False)
    monkeypatch.delenv("MEGATRON_SRC", raising=False)
    monkeypatch.setenv(bench.VENV_ENV, str(tmp_path / "absent"))
    result = CliRunner().invoke(app, ["bench", "trainer", "--megatron"])
    assert result.exit_code == EXIT_UNAVAILABLE
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "MILES_SRC" in lines[0] and "MEGATRON_SRC" in lines[0]


def _figures(**mode: float) -> dict[str, float]:
    return {"logprob_abs_diff_mean": 1e-15, "logprob_abs_diff_max": 5e-15, "routing_agreement": 1.0, **mode}


PAYLOAD: dict[str, Any] = {
    "schema": bench.SCHEMA,
    "forward": {
        "stock": {"r3_on": _figures(logprob_abs_diff_max=6.6e-7), "r3_off": _figures(routing_agreement=0.99)},
        "lifted": {"r3_on": _figures(), "r3_off": _figures()},
    },
    "gradient": {"parameters": 43.0, "max_relative_error": 4.3e-8, "median_relative_error": 3.3e-8},
    "demo_size": {"tokens": 1600.0, "seconds": 4.0, "tokens_per_s": 400.0},
    "versions": {
        "miles": "31f1ca961a94",
        "megatron": "2e64d788b67f",
        "torch": "2.13.0",
        "torch_threads": 2.0,
    },
}


def test_parse_checks_the_schema_and_the_sections() -> None:
    assert bench.parse(json.dumps(PAYLOAD))["gradient"]["parameters"] == 43.0
    with pytest.raises(ValueError, match="schema"):
        bench.parse(json.dumps({**PAYLOAD, "schema": 99}))
    with pytest.raises(ValueError, match="gradient"):
        bench.parse(json.dumps({k: v for k, v in PAYLOAD.items() if k != "gradient"}))


def test_rows_put_megatron_beside_the_reference() -> None:
    reference = {"r3_on": _figures(logprob_abs_diff_max=2e-15), "r3_off": _figures()}
    rows = bench.forward_rows(reference, PAYLOAD)
    assert [row[:2] for row in rows] == [
        (bench.REFERENCE, "replay"),
        (bench.REFERENCE, "own top-k"),
        (bench.PRECISIONS["stock"], "replay"),
        (bench.PRECISIONS["stock"], "own top-k"),
        (bench.PRECISIONS["lifted"], "replay"),
        (bench.PRECISIONS["lifted"], "own top-k"),
    ]
    assert rows[0][3] == "2.00e-15"
    assert rows[2][3] == "6.60e-07" and rows[3][4] == "0.9900"
    assert bench.gradient_row(PAYLOAD) == ("43", "4.30e-08", "3.30e-08")
    assert bench.speed_row(PAYLOAD, 8, 200) == (
        "Megatron-on-CPU, demo size (8 x 200 tokens)", "1,600", "4.0", "400"
    )  # fmt: skip
    assert bench.versions_line(PAYLOAD).startswith("Miles 31f1ca96, Megatron-LM 2e64d788, torch 2.13.0")


def test_an_entry_point_that_cannot_import_megatron_is_unavailable(
    layout: dict[str, Path], tmp_path: Path
) -> None:
    """The entry point's exit status 2 becomes the bench's Unavailable with its last line."""
    python = layout["venv"] / "bin" / "python"
    python.write_text("#!/bin/sh\necho 'Megatron or Miles does not import in x: no torch' >&2\nexit 2\n")
    python.chmod(0o755)
    setup = bench.find_setup(
        str(layout["miles"]), str(layout["megatron"]), str(layout["venv"]), layout["root"]
    )
    with pytest.raises(Unavailable, match="does not import in x: no torch"):
        bench.run_megatron(setup)
