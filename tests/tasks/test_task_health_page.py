"""The audit's HTML page: verdict counts, one row per task with what its controls saw, escaped."""

from __future__ import annotations

from pathlib import Path

from rl360_ext.diagnostics.task_health_page import (
    TASK_HEALTH_PAGE,
    render_task_health,
    write_task_health_page,
)
from rl360_ext.tasks.health import TaskHealth
from rl360_ext.tasks.verdicts import TaskVerdict


def results() -> list[TaskHealth]:
    oracle = {"passed": 3, "valid": 3, "attempts": []}
    return [
        TaskHealth(
            "quiz-01",
            [TaskVerdict.OK],
            {
                "oracle": oracle,
                "nop": {"above_floor": 0, "valid": 2},
                "verifier_timeout_s": 20.0,
                "undecided": [],
            },
        ),
        TaskHealth(
            "<hack>",
            [TaskVerdict.HACKABLE],
            {
                "oracle": oracle,
                "canary_conftest": {"reward": 1.0},
                "canary_path_shims": {"reward": 0.0},
                "found_by": {"canary_conftest": "hackable"},
            },
        ),
        TaskHealth(
            "regraded",
            [TaskVerdict.FLAKY_VERIFIER],
            {
                "verifier_regrade": {"exception_message": 'rewards [{"reward": 1.0}, {"reward": 0.0}]'},
                "found_by": {"verifier_regrade": "flaky_verifier"},
            },
        ),
        TaskHealth("bad-toml", [TaskVerdict.LINT], {"lint": {"type": "task_invalid", "message": "bad"}}),
        TaskHealth("lost", [], {"undecided": ["oracle"], "cached": True}),
    ]


def test_the_page_counts_verdicts_and_shows_what_the_controls_saw() -> None:
    html = render_task_health(results(), "tasks/")
    assert "5 tasks, 1 from the cache" in html
    assert (
        "<td>hackable</td><td class=num>1</td>" in html and "<td>undecided</td><td class=num>1</td>" in html
    )
    assert "canary_conftest: reward 1" in html and "canary_path_shims" not in html  # only the hit
    assert "verifier_regrade: rewards [{&quot;reward&quot;: 1.0}" in html
    assert "lint: task_invalid: bad" in html
    assert "&lt;hack&gt;" in html and "<hack>" not in html
    assert html.index("bad-toml") < html.index("quiz-01")  # findings first
    assert "<td class=num>3/3</td><td class=num>0/2</td>" in html and "<td class=num>20.00</td>" in html


def test_the_page_is_written_whole_into_out(tmp_path: Path) -> None:
    target = write_task_health_page(results(), tmp_path / "out", "tasks/")
    assert target == tmp_path / "out" / TASK_HEALTH_PAGE
    assert target.read_text().startswith("<!doctype html>")
    assert [p.name for p in target.parent.iterdir()] == [TASK_HEALTH_PAGE]
