"""The report's step-gate lane and `rl360 audit` on gate lines (`GateVerdict.record`, as the Miles hook
and the demo write them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl360_ext.diagnostics.report import main
from rl360_ext.diagnostics.report_data import load_run
from rl360_ext.gate.rules import GateState, decide
from rl360_ext.rollout.audit import format_step, gate_summary, load_steps
from rl360_ext.rollout.metrics import append_records

from .report_fixtures import parse_page


def _run(path: Path, rates: list[float]) -> None:
    state = GateState()
    for step, rate in enumerate(rates):
        metrics = {"infra/failure_rate": rate, "count/attempts": 32}
        attempt = {"kind": "attempt", "rollout_id": step, "trained": True, "attempt_class": "valid"}
        append_records(path, [{"kind": "step", "rollout_id": step, "metrics": metrics}])
        append_records(path, [{**attempt, "group_index": 0, "reward": 1.0}])
        verdict = decide(metrics, state)
        state = verdict.state
        append_records(path, [verdict.record(step)])


def test_the_gate_lane_lists_each_rule_that_fired_with_value_and_bound(tmp_path: Path) -> None:
    _run(tmp_path / "metrics.jsonl", [0.0, 0.0, 0.9, 0.0])
    run = load_run(tmp_path)
    assert [run.gates[s].action for s in range(4)] == ["train", "train", "skip", "train"]
    main(tmp_path, None)
    page = parse_page((tmp_path / "report.html").read_text(encoding="utf-8"))
    chart = page.charts["chart-gate"]
    assert chart.svgs == 2  # the verdict per step, the rules fired
    rows = [row for table in chart.tables for row in table[1:]]
    assert rows == [["2", "skip", "provenance/infra_rate", "infra/failure_rate", "0.9", "> 0.75"]]


def test_a_run_without_gate_lines_has_no_gate_lane(tmp_path: Path) -> None:
    append_records(tmp_path / "metrics.jsonl", [{"kind": "step", "rollout_id": 0, "metrics": {}}])
    main(tmp_path, None)
    assert "chart-gate" not in parse_page((tmp_path / "report.html").read_text(encoding="utf-8")).charts


def test_a_bad_gate_line_is_named(tmp_path: Path) -> None:
    append_records(tmp_path / "metrics.jsonl", [{"kind": "gate", "rollout_id": 0, "action": "maybe"}])
    with pytest.raises(ValueError, match=r"gate record 1.*'action'"):
        load_run(tmp_path)
    with pytest.raises(ValueError, match="action must be one of train, skip, stop, got 'maybe'"):
        append_records(tmp_path / "metrics.jsonl", [{"kind": "step", "rollout_id": 0, "metrics": {}}])
        load_steps(tmp_path / "metrics.jsonl")


def test_the_audit_adds_each_verdict_and_sums_them(tmp_path: Path) -> None:
    _run(tmp_path / "metrics.jsonl", [0.0, 0.0, 0.9, 1.0])
    audits = load_steps(tmp_path / "metrics.jsonl")
    assert [a.gate["action"] for a in audits if a.gate] == ["train", "train", "skip", "stop"]
    assert "gate skip: provenance/infra_rate (infra/failure_rate = 0.9 > 0.75)" in format_step(audits[2])
    assert "provenance/infra_down (hard, infra/failure_rate = 1 >= 1)" in format_step(audits[3])
    assert gate_summary(audits) == (
        "gate: 4 steps judged: 2 train, 1 skip, 1 stop; fired: provenance/infra_down at step(s) 3, "
        "provenance/infra_rate at step(s) 2, 3"
    )
