"""`rl360 template check|fixed`: exit codes 0 / 1 / 2, human and JSON output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rl360_ext.cli.templates import app
from rl360_ext.reference.engine.tokenizer import default_tokenizer_dir, write_tokenizer_dir
from rl360_ext.templates.select import fixed_template

FIXTURES = Path(__file__).parent / "fixtures"

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny_dir() -> Path:
    return default_tokenizer_dir()


@pytest.fixture
def qwen3_like_dir(tmp_path) -> Path:
    directory = write_tokenizer_dir(tmp_path / "qwen3-like")
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["chat_template"] = (FIXTURES / "qwen3_like.jinja").read_text()
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def test_append_only_template_exits_0(tiny_dir) -> None:
    result = runner.invoke(app, ["check", str(tiny_dir), "--cases", "40"])
    assert result.exit_code == 0, result.output
    assert "OK: append-only" in result.output


def test_violation_exits_1_with_json(tiny_dir) -> None:
    template = FIXTURES / "newline_after_end.jinja"
    result = runner.invoke(
        app, ["check", str(tiny_dir), "--template", str(template), "--cases", "40", "--json"]
    )
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["ok"] is False
    assert [v["kind"] for v in data["violations"]] == ["text-after-end-token"]


def test_qwen3_like_tokenizer_fails_and_its_fixed_template_passes(qwen3_like_dir) -> None:
    own = runner.invoke(app, ["check", str(qwen3_like_dir), "--cases", "40"])
    assert own.exit_code == 1
    assert "earlier-reasoning-dropped" in own.stdout
    assert "--fixed" in own.stdout
    fixed = runner.invoke(app, ["check", str(qwen3_like_dir), "--cases", "40", "--fixed"])
    assert fixed.exit_code == 0, fixed.output
    assert "rl360 fixed template 'qwen3'" in fixed.stdout


def test_kwarg_reaches_the_template(qwen3_like_dir) -> None:
    result = runner.invoke(
        app, ["check", str(qwen3_like_dir), "--fixed", "--cases", "30", "--kwarg", "enable_thinking=false"]
    )
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["check", "/nonexistent/tokenizer"], "tokenizer directory not found"),
        (["check", "{tiny}", "--template", "/nonexistent.jinja"], "cannot read template"),
        (["check", "{tiny}", "--template", "{bad}"], "does not compile"),
        (["check", "{empty}"], "cannot load a tokenizer"),
        (["check", "{tiny}", "--fixed"], "no fixed template"),
        (["check", "{tiny}", "--kwarg", "novalue"], "expected KEY=VALUE"),
        (["check", "{tiny}", "--fixed", "--template", "{bad}"], "exclusive"),
    ],
)
def test_bad_input_exits_2_with_a_message(tiny_dir, tmp_path, args, message) -> None:
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% if %}")
    empty = tmp_path / "empty"
    empty.mkdir()
    argv = [a.format(tiny=tiny_dir, bad=bad, empty=empty) for a in args]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2
    assert message in result.stderr


def test_cases_must_be_positive(tiny_dir) -> None:
    assert runner.invoke(app, ["check", str(tiny_dir), "--cases", "0"]).exit_code == 2


def test_fixed_prints_or_writes_the_template(qwen3_like_dir, tiny_dir, tmp_path) -> None:
    printed = runner.invoke(app, ["fixed", str(qwen3_like_dir)])
    assert printed.exit_code == 0 and printed.stdout == fixed_template("qwen3")
    out = tmp_path / "t.jinja"
    assert runner.invoke(app, ["fixed", str(qwen3_like_dir), "--out", str(out)]).exit_code == 0
    assert out.read_text() == fixed_template("qwen3")
    none = runner.invoke(app, ["fixed", str(tiny_dir)])
    assert none.exit_code == 1 and "already rl360's 'reference'" in none.stderr


def test_rl360_command_exit_codes(tiny_dir) -> None:
    """Through the installed `rl360` entry point, as a user runs it."""
    rl360 = Path(sys.executable).parent / "rl360"
    ok = subprocess.run(
        [str(rl360), "template", "check", str(tiny_dir), "--cases", "20"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run(
        [
            str(rl360),
            "template",
            "check",
            str(tiny_dir),
            "--cases",
            "20",
            "--template",
            str(FIXTURES / "loop_last_open_turn.jinja"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 1 and "loop-position-branch" in bad.stdout
