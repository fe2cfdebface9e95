"""The step report's task-health section: the tasks/* metrics per step and the tasks quarantined
during the run, from step records the real metrics hook wrote."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from rl360_ext.diagnostics.report import main
from rl360_ext.diagnostics.report_data import load_run
from rl360_ext.rollout.metrics import REGISTRY, append_records, log_rollout_metrics
from rl360_ext.tasks.health import TaskHealth, write_outputs
from rl360_ext.tasks.verdicts import TaskVerdict

from ..rollout.duck_samples import DuckSample, valid
from .report_fixtures import parse_page

SECTION = "chart-task-health"


def crashed(group: int, index: int, task: str) -> DuckSample:
    """A valid attempt above the floor that ended in an exception: the vacuous signature."""
    return valid(group, index, 1.0, task=task, exception_type="ContextLengthExceededError")


def test_the_section_charts_the_tasks_metrics_and_lists_each_quarantine_with_its_evidence(
    tmp_path: Path,
) -> None:
    _, quarantine = write_outputs([TaskHealth("q", [TaskVerdict.OK], {"undecided": []})], tmp_path / "health")
    run = tmp_path / "run"
    args = SimpleNamespace(
        reward_key=None,
        dynamic_sampling_filter_path=None,
        rl360_metrics_path=run / "metrics.jsonl",
        rl360_harbor_url="http://h",
        rl360_quarantine_file=str(quarantine),
    )
    REGISTRY.drain()
    steps = [
        [crashed(0, 0, "q"), crashed(0, 1, "q"), valid(1, 2, 1.0, task="ok"), valid(1, 3, 1.0, task="ok")],
        [
            crashed(2, 0, "q"),
            valid(2, 1, 0.0, task="q"),
            valid(3, 2, 1.0, task="ok"),
            valid(3, 3, 1.0, task="ok"),
        ],
    ]
    for rollout_id, samples in enumerate(steps):
        log_rollout_metrics(rollout_id, args, samples, None, 1.0)
    main(run, None)
    chart = parse_page((run / "report.html").read_text()).charts[SECTION]
    assert chart.values("vacuous-signature attempts") == {"0": 2.0, "1": 1.0}
    assert chart.values("always-pass groups") == {"0": 2.0, "1": 1.0}  # step 0: q and ok; step 1: ok
    assert chart.values("quarantined (live list)") == {"0": 0.0, "1": 1.0}
    ((header, row),) = chart.tables
    assert header == ["rollout step", "task", "verdicts", "evidence"]
    assert row[:3] == ["1", "q", "vacuous"] and "vacuous_signature_attempts=3" in row[3]


def test_a_run_without_tasks_metrics_says_so(tmp_path: Path) -> None:
    append_records(tmp_path / "metrics.jsonl", [{"kind": "step", "rollout_id": 0, "metrics": {}}])
    main(tmp_path, None)
    chart = parse_page((tmp_path / "report.html").read_text()).charts[SECTION]
    assert chart.no_data and "tasks/*" in chart.no_data[0]


def test_a_malformed_quarantine_entry_names_its_field(tmp_path: Path) -> None:
    record = {"kind": "step", "rollout_id": 3, "metrics": {}, "task_health": {"quarantined": [{"task": 7}]}}
    append_records(tmp_path / "metrics.jsonl", [record])
    with pytest.raises(ValueError, match=r"task_health.quarantined\[0\].*'task' must be str"):
        load_run(tmp_path)
