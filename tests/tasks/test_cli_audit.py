"""`rl360 demo --audit-tasks`: the audit runs first; a quarantined quiz task stops the demo."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from rl360_ext.cli import app
from rl360_ext.tasks.health import TaskHealth
from rl360_ext.tasks.verdicts import TaskVerdict


@pytest.fixture
def demo_calls(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    import rl360_ext.local.demo.run as demo
    import rl360_ext.local.stack as stack

    calls: list[Any] = []
    monkeypatch.setattr(stack, "preflight", lambda *args, **kwargs: None)
    monkeypatch.setattr(demo, "run_demo", lambda config: calls.append(config) or SimpleNamespace(problems=[]))
    return calls


def audited(monkeypatch: pytest.MonkeyPatch, verdicts: dict[str, list[TaskVerdict]]) -> list[dict[str, Any]]:
    import rl360_ext.cli.tasks as cli_tasks

    seen: list[dict[str, Any]] = []

    def audit_tree(
        root: Path, tasks: list[tuple[str, Path]], config: Any, out: Path, cache: Path | None
    ) -> Any:
        seen.append({"tasks": [name for name, _ in tasks], "out": out, "cache": cache})
        return [TaskHealth(name, verdicts.get(name, [TaskVerdict.OK]), {}) for name, _ in tasks]

    monkeypatch.setattr(cli_tasks, "audit_tree", audit_tree)
    return seen


def test_the_demo_runs_after_a_clean_audit_of_its_quiz_tasks(
    monkeypatch: pytest.MonkeyPatch, demo_calls: list[Any], tmp_path: Path
) -> None:
    seen = audited(monkeypatch, {})
    result = CliRunner().invoke(app, ["demo", "--audit-tasks", "--steps", "1", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert seen[0]["tasks"] == [f"quiz-{i:02d}" for i in range(1, 13)]
    assert seen[0]["cache"] == tmp_path / "task-health" / "cache"
    # the run's hooks mask the audit's tasks and track task health next to its quarantine.json
    assert [call.quarantine_file for call in demo_calls] == [tmp_path / "task-health" / "quarantine.json"]


def test_without_the_audit_the_demo_tracks_no_quarantine(
    monkeypatch: pytest.MonkeyPatch, demo_calls: list[Any], tmp_path: Path
) -> None:
    result = CliRunner().invoke(app, ["demo", "--steps", "1", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert [call.quarantine_file for call in demo_calls] == [None]


def test_a_quarantined_quiz_task_stops_the_demo(
    monkeypatch: pytest.MonkeyPatch, demo_calls: list[Any], tmp_path: Path
) -> None:
    audited(monkeypatch, {"quiz-03": [TaskVerdict.VACUOUS]})
    result = CliRunner().invoke(app, ["demo", "--audit-tasks", "--steps", "1", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "quiz-03" in result.output
    assert demo_calls == []


def test_the_demo_hands_its_quarantine_file_to_the_hooks(tmp_path: Path) -> None:
    from rl360_ext.local.demo.miles_args import build_args
    from rl360_ext.local.demo.plan import DemoConfig
    from rl360_ext.rollout.config import AgentConfig

    stack = SimpleNamespace(
        harbor_urls="http://127.0.0.1:1", gateway_url="http://127.0.0.1:2", tokenizer_dir="t"
    )
    quarantine = tmp_path / "task-health" / "quarantine.json"
    args = build_args(DemoConfig(out=tmp_path, quarantine_file=quarantine), stack)  # type: ignore[arg-type]
    assert AgentConfig.from_args(args).quarantine_file == str(quarantine)
    assert AgentConfig.from_args(build_args(DemoConfig(out=tmp_path), stack)).quarantine_file is None  # type: ignore[arg-type]
