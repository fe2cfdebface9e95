"""The rl360 command: help, doctor."""

from __future__ import annotations

from typer.testing import CliRunner

from rl360_ext.cli import app
from rl360_ext.diagnostics.doctor import run_checks

runner = CliRunner()


def test_help_lists_subcommands() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("doctor", "demo", "engine", "session", "template", "harbor", "bench"):
        assert command in result.output


def test_doctor_reports_every_check() -> None:
    checks = run_checks()
    assert [c.name for c in checks] == ["python", "harbor", "ray", "smg", "bubblewrap", "tmux", "chromium"]
    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == (0 if all(c.ok for c in checks) else 1)
    for check in checks:
        assert check.name in result.output
    for check in checks:
        assert check.detail, f"{check.name} has no detail"
