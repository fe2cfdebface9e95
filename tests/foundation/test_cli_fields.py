"""`rl360_ext.cli.fields`: a config dataclass's fields become a typer command's flags."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from rl360_ext.cli.fields import config_command, fields_command


def _parse_pairs(text: str) -> dict[str, int]:
    pairs = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if not value.isdigit():
            raise ValueError(f"{key}: not an integer")
        pairs[key] = int(value)
    return pairs


@dataclass(frozen=True)
class Demo:
    """A config with every kind of field the derivation reads."""

    backend_url: str = field(metadata={"flag": "backend"})
    """Where to send requests."""

    workers: int = field(default=2, metadata={"min": 1})
    """Worker count."""

    weights: dict[str, int] = field(default_factory=dict, metadata={"parse": _parse_pairs})
    """KEY=N pairs."""

    model_dir: str | None = field(default=None, metadata={"path": True})
    """A directory."""

    tag: tuple[str, ...] = field(default=(), metadata={"repeatable": True})
    """Repeatable tag."""

    secret: str | None = field(default="hunter2", repr=False, metadata={"envvar": "RL360_TEST_SECRET"})
    """A secret."""

    def __post_init__(self) -> None:
        if self.workers > 8:
            raise ValueError(f"--workers must be <= 8, got {self.workers}")


def _app(run: Any, **kwargs: Any) -> typer.Typer:
    app = typer.Typer()
    app.command("go")(config_command(Demo, run, **kwargs))
    app.command("other")(lambda: None)  # two commands, so "go" is addressed by name
    return app


def test_fields_become_flags_and_the_config_is_built() -> None:
    seen: list[Demo] = []

    def go(config: Demo) -> None:
        """Run the demo."""
        seen.append(config)

    args = ["go", "--backend", "http://x", "--workers", "3", "--weights", "a=1,b=2"]
    args += ["--model-dir", "/tmp", "--tag", "p", "--tag", "q"]
    result = CliRunner().invoke(_app(go), args, env={"RL360_TEST_SECRET": "from-env"})
    assert result.exit_code == 0, result.output
    assert seen == [
        Demo("http://x", 3, {"a": 1, "b": 2}, "/tmp", ("p", "q"), "from-env"),
    ]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["go"], "--backend"),  # a required field
        (["go", "--backend", "u", "--workers", "0"], "--workers"),  # below `min`
        (["go", "--backend", "u", "--weights", "a=x"], "--weights"),  # `parse` fails
        (["go", "--backend", "u", "--workers", "9"], "--workers"),  # the dataclass rejects it
    ],
)
def test_bad_flags_are_usage_errors_naming_the_flag(args: list[str], named: str) -> None:
    result = CliRunner().invoke(_app(lambda config: None), args)
    assert result.exit_code == 2
    assert named in result.output


def test_help_comes_from_the_field_docstrings_and_hides_secret_defaults() -> None:
    result = CliRunner().invoke(_app(lambda config: None), ["go", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for text in ("Where to send requests.", "Worker count.", "KEY=N pairs.", "Repeatable tag."):
        assert text in result.output
    assert "hunter2" not in result.output


def test_fields_command_hands_over_the_values_and_the_extras() -> None:
    seen: list[tuple[dict[str, Any], int]] = []
    extra = inspect.Parameter("port", inspect.Parameter.KEYWORD_ONLY, default=typer.Option(1), annotation=int)
    app = typer.Typer()
    app.command("go")(
        fields_command(
            Demo, lambda values, port: seen.append((values, port)), extra=[extra], optional=["backend_url"]
        )
    )
    app.command("other")(lambda: None)
    result = CliRunner().invoke(app, ["go", "--port", "7", "--tag", "t"])
    assert result.exit_code == 0, result.output
    values, port = seen[0]
    assert port == 7 and values["backend_url"] is None and values["tag"] == ("t",)
