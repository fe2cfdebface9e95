"""The gate's evidence: the last step record of a metrics JSONL, and the unhealthy-task share."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.gate import evidence as ev
from rl360_ext.gate.evidence import last_step_record, step_evidence, unhealthy_tasks
from rl360_ext.rollout.metrics import append_records


def _step(rollout_id: int) -> dict:
    return {"kind": "step", "schema": 1, "rollout_id": rollout_id, "metrics": {"infra/failure_rate": 0.1}}


def _attempt(rollout_id: int, index: int) -> dict:
    return {"kind": "attempt", "rollout_id": rollout_id, "index": index, "task": "t" * 50}


def test_the_last_step_record_is_found_behind_its_attempt_lines(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(ev, "BLOCK", 64)  # the step line straddles several blocks
    path = tmp_path / "metrics.jsonl"
    assert last_step_record(path) is None
    for rollout_id in range(3):
        append_records(path, [_step(rollout_id), *(_attempt(rollout_id, i) for i in range(20))])
        append_records(path, [{"kind": "gate", "rollout_id": rollout_id}])
    assert last_step_record(path)["rollout_id"] == 2
    assert last_step_record(path, max_scan_bytes=64) is None  # out of reach: none, not an older one


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 30), st.integers(1, 300))
def test_any_tail_length_and_block_size_finds_the_last_step(attempts: int, block: int) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "m.jsonl"
        append_records(path, [_step(0), _attempt(0, 0), _step(1), *(_attempt(1, i) for i in range(attempts))])
        original = ev.BLOCK
        ev.BLOCK = block
        try:
            assert last_step_record(path)["rollout_id"] == 1
        finally:
            ev.BLOCK = original


def test_a_file_without_step_records_or_with_a_broken_one_gives_none(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    append_records(path, [_attempt(0, 0)])
    assert last_step_record(path) is None
    path.write_bytes(b'{"kind":"step", broken\n')
    assert last_step_record(path) is None


def test_unhealthy_share_counts_quarantined_and_drifting_tasks() -> None:
    health = {
        "quarantined": [{"task": "a", "verdicts": []}, {"no_task": 1}, "junk"],
        "drift_down_tasks": ["b"],
        "drift_up_tasks": ["c", 3],
        "above_oracle_tasks": ["d"],
    }
    assert unhealthy_tasks(health) == {"a", "b", "c"}
    assert unhealthy_tasks(None) == set() and unhealthy_tasks([]) == set()
    record = {"metrics": {"infra/failure_rate": 0.2}, "task_health": health}
    evidence = step_evidence(record, ["a", "b", "d", None])
    assert evidence == {"infra/failure_rate": 0.2, "tasks/unhealthy_trained_frac": 0.5}
    assert "tasks/unhealthy_trained_frac" not in step_evidence({"metrics": {}, "task_health": None}, ["a"])
    assert "tasks/unhealthy_trained_frac" not in step_evidence({"metrics": {}, "task_health": health}, [])
    assert step_evidence({"metrics": "bad"}) == {}
