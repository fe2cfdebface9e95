"""The training-time task-health tracker: accumulation across steps, the drift test, the quarantine
decision, the live list and the state file."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.tasks.drift import above_ceiling, drift, wilson_interval
from rl360_ext.tasks.health import read_quarantine
from rl360_ext.tasks.tracker import (
    LIVE_QUARANTINE_FILE,
    STATE_FILE,
    TaskRecord,
    TaskTracker,
    TrackerConfig,
    quarantine_findings,
    track_step,
)

QUICK = TrackerConfig(
    drift_baseline_attempts=8, drift_window=8, streak_steps=2, quarantine_min_verifier_runs=4
)


def attempt(
    task: str = "t",
    reward: float | None = 1.0,
    klass: str = "valid",
    exception: str | None = None,
    verifier_s: float | None = None,
) -> dict[str, Any]:
    return {
        "task": task,
        "attempt_class": klass,
        "reward": reward,
        "exception_type": exception,
        "phase_timings": {} if verifier_s is None else {"verifier": verifier_s},
    }


# ---- the drift test ---------------------------------------------------------------------------

counts = st.integers(min_value=0, max_value=200).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n)))


@given(counts, st.sampled_from([1.0, 1.96, 2.576]))
def test_the_wilson_interval_holds_the_observed_rate(tally: tuple[int, int], z: float) -> None:
    passes, n = tally
    low, high = wilson_interval(passes, n, z)
    assert 0.0 <= low <= high <= 1.0
    if n:
        assert low - 1e-12 <= passes / n <= high + 1e-12


@given(counts, counts)
def test_drift_is_antisymmetric_and_never_between_equal_rates(
    base: tuple[int, int], recent: tuple[int, int]
) -> None:
    assert drift(*base, *recent) == -drift(*recent, *base)
    assert drift(*base, *base) == 0


@given(st.integers(1, 100), st.integers(1, 100))
def test_no_drift_between_the_same_rate_at_any_sizes(n: int, m: int) -> None:
    assert drift(n, 2 * n, m, 2 * m) == 0  # 50% against 50%


def test_a_collapse_is_drift_down_and_a_small_wobble_is_not() -> None:
    assert drift(15, 16, 0, 16) == -1
    assert drift(0, 16, 15, 16) == 1
    assert drift(12, 16, 9, 16) == 0  # 75% vs 56%: not significant on 16 attempts each
    assert drift(12, 16, 0, 0) == 0


def test_the_oracle_is_a_ceiling_only_when_it_was_below_the_maximum() -> None:
    assert not above_ceiling(200, 200, 3, 3)  # an ok task's oracle passed 3 of 3: nothing is above it
    assert above_ceiling(40, 40, 0, 3)  # the policy passes what the reference solution never did
    assert not above_ceiling(2, 3, 1, 3)
    with pytest.raises(ValueError, match="passes"):
        wilson_interval(4, 3)


# ---- accumulation and the quarantine decision --------------------------------------------------


def test_evidence_accumulates_per_task_across_steps() -> None:
    tracker = TaskTracker(QUICK)
    tracker.observe(1, [attempt("a", 1.0), attempt("a", 1.0), attempt("b", 0.0)], {}, {})
    tracker.observe(
        2, [attempt("a", 1.0), attempt("a", 1.0), attempt("a", None, "infra:sandbox_lost")], {}, {}
    )
    a, b = tracker.tasks["a"], tracker.tasks["b"]
    assert (a.attempts, a.valid, a.passes, a.infra) == (5, 4, 4, 1)
    assert (a.pass_streak, a.fail_streak, a.first_step, a.last_step) == (2, 0, 1, 2)
    assert (b.attempts, b.valid, b.passes, b.pass_streak) == (1, 1, 0, 0)  # one attempt: no streak
    health = tracker.observe(3, [attempt("a", 0.0), attempt("a", 1.0)], {}, {})
    assert tracker.tasks["a"].pass_streak == 0
    assert health.metrics["tasks/tracked_tasks"] == 2


step_attempts = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from([None, 0.0, 0.5, 1.0])), max_size=10
)


@settings(max_examples=60, deadline=None)
@given(st.lists(step_attempts, max_size=8))
def test_the_counts_are_the_sums_over_steps_and_the_windows_stay_bounded(
    steps: list[list[tuple[str, float | None]]],
) -> None:
    """(task, reward) per attempt, None for an infrastructure attempt; brute force over the steps."""
    tracker = TaskTracker(QUICK)
    for rollout_id, step in enumerate(steps):
        batch = [attempt(t, r, "valid" if r is not None else "infra:sandbox_lost") for t, r in step]
        tracker.observe(rollout_id, batch, {}, {})
    for task, record in tracker.tasks.items():
        mine = [r for step in steps for t, r in step if t == task]
        rewards = [r for r in mine if r is not None]
        assert record.attempts == len(mine) and record.infra == len(mine) - len(rewards)
        assert record.valid == len(rewards) and record.passes == rewards.count(1.0)
        assert record.base_n == min(len(rewards), QUICK.drift_baseline_attempts)
        assert record.base_passes == rewards[: QUICK.drift_baseline_attempts].count(1.0)
        assert (
            list(record.recent)
            == [r == 1.0 for r in rewards[QUICK.drift_baseline_attempts :]][-QUICK.drift_window :]
        )
        with_two = [[r for t, r in step if t == task and r is not None] for step in steps]
        with_two = [rs for rs in with_two if len(rs) >= 2]
        streak = 0
        for rs in with_two:
            streak = streak + 1 if all(r == 1.0 for r in rs) else 0
        assert record.pass_streak == streak


def test_a_task_whose_pass_rate_collapses_drifts_down() -> None:
    tracker = TaskTracker(QUICK)
    tracker.observe(1, [attempt("a", 1.0)] * 8 + [attempt("b", 1.0)] * 8, {}, {})
    health = tracker.observe(2, [attempt("a", 0.0)] * 8 + [attempt("b", 1.0)] * 8, {}, {})
    assert health.drift_down == ["a"] and health.drift_up == []
    assert health.metrics["tasks/drift_tested_tasks"] == 2
    assert health.metrics["tasks/drift_down_tasks"] == 1


def test_a_replayed_step_after_a_restart_adds_nothing() -> None:
    tracker = TaskTracker(QUICK)
    tracker.observe(5, [attempt("a", 1.0)], {}, {})
    health = tracker.observe(5, [attempt("a", 1.0)] * 10, {}, {})
    assert health.replayed and tracker.tasks["a"].attempts == 1


@settings(max_examples=60, deadline=None)
@given(
    k=st.integers(1, 6),
    steps=st.lists(st.lists(st.tuples(st.booleans(), st.booleans()), max_size=6), max_size=6),
)
def test_a_task_is_never_quarantined_on_fewer_vacuous_attempts_than_the_threshold(
    k: int, steps: list[list[tuple[bool, bool]]]
) -> None:
    """Each attempt: (above the floor, ended in an exception); the signature is both."""
    config = TrackerConfig(quarantine_vacuous_attempts=k, quarantine_verifier_timeout_frac=0)
    tracker = TaskTracker(config)
    seen = 0
    for rollout_id, step in enumerate(steps):
        batch = [
            attempt("t", 1.0 if high else 0.0, exception="E" if crashed else None) for high, crashed in step
        ]
        seen += sum(high and crashed for high, crashed in step)
        health = tracker.observe(rollout_id, batch, {}, {})
        assert ("t" in tracker.quarantined) == (seen >= k)
        assert all(
            entry["evidence"]["vacuous"]["vacuous_signature_attempts"] >= k for entry in health.quarantined
        )


@given(
    durations=st.lists(st.floats(0, 100), max_size=20),
    timeout=st.floats(1, 100),
    minimum=st.integers(1, 10),
)
def test_slow_verifier_needs_enough_gradings_and_a_p95_at_its_timeout(
    durations: list[float], timeout: float, minimum: int
) -> None:
    config = TrackerConfig(quarantine_min_verifier_runs=minimum, quarantine_vacuous_attempts=0)
    record = TaskRecord()
    record.verifier_s.extend(durations)
    found = quarantine_findings(record, timeout, config)
    ordered = sorted(durations)
    expected = len(durations) >= minimum and ordered[math.ceil(0.95 * len(ordered)) - 1] >= 0.95 * timeout
    assert ("slow_verifier" in found) == expected
    assert quarantine_findings(record, None, config) == {}  # no timeout from the audit, no finding


def test_bad_thresholds_name_their_field() -> None:
    with pytest.raises(ValueError, match="drift_window"):
        TrackerConfig(drift_window=0)
    with pytest.raises(ValueError, match="quarantine_verifier_timeout_frac"):
        TrackerConfig(quarantine_verifier_timeout_frac=float("nan"))
    with pytest.raises(ValueError, match="quarantine_min_verifier_runs"):
        TrackerConfig(quarantine_min_verifier_runs=9, verifier_window=8)


def test_memory_is_bounded_by_max_tasks_and_the_windows() -> None:
    config = TrackerConfig(max_tasks=3, verifier_window=4, quarantine_min_verifier_runs=2, drift_window=2,
                           drift_baseline_attempts=1)  # fmt: skip
    tracker = TaskTracker(config)
    for step in range(10):
        tracker.observe(
            step,
            [attempt(f"t{step}", 1.0, verifier_s=1.0)] + [attempt("hot", 1.0, verifier_s=2.0)] * 7,
            {},
            {},
        )
    assert set(tracker.tasks) == {"t8", "t9", "hot"}  # the hot task is seen every step: never forgotten
    hot = tracker.tasks["hot"]
    assert len(hot.verifier_s) == 4 and len(hot.recent) == 2 and hot.attempts == 70


# ---- the files ----------------------------------------------------------------------------------


def vacuous_step(task: str = "bad") -> list[dict[str, Any]]:
    return [attempt(task, 1.0, exception="ContextLengthExceededError")] * 3 + [attempt("good", 1.0)]


def test_a_quarantine_is_written_to_the_live_list_in_the_audits_format(tmp_path: Path) -> None:
    health = track_step(tmp_path, TrackerConfig(), 7, vacuous_step(), {}, {})
    assert [e["task"] for e in health.quarantined] == ["bad"]
    live = json.loads((tmp_path / LIVE_QUARANTINE_FILE).read_text())["tasks"]
    assert live["bad"]["verdicts"] == ["vacuous"] and live["bad"]["rollout_id"] == 7
    assert live["bad"]["evidence"]["vacuous"]["vacuous_signature_attempts"] == 3
    assert dict(read_quarantine(tmp_path / LIVE_QUARANTINE_FILE)) == {"bad": ("vacuous",)}
    assert health.metrics["tasks/quarantined_new"] == 1 and health.metrics["tasks/quarantined_live"] == 1
    assert not list(tmp_path.glob(".*partial"))  # written atomically, nothing left behind


def test_the_state_survives_a_restart_and_a_cleared_task_needs_new_evidence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rl360_ext.tasks import tracker as module

    config = TrackerConfig(quarantine_vacuous_attempts=4)
    track_step(tmp_path, config, 1, vacuous_step(), {}, {})  # 3 signatures: not yet
    monkeypatch.setattr(module, "_trackers", {})  # a new process: only the state file remains
    assert json.loads((tmp_path / STATE_FILE).read_text())["tasks"]["bad"]["vacuous_signature"] == 3
    health = track_step(tmp_path, config, 2, vacuous_step()[:1], {}, {})
    assert [e["task"] for e in health.quarantined] == ["bad"]  # 3 + 1 across the restart
    (tmp_path / LIVE_QUARANTINE_FILE).write_text('{"tasks": {}}')  # the operator clears it
    health = track_step(tmp_path, config, 3, vacuous_step()[:1], {}, {})
    assert health.quarantined == [] and health.metrics["tasks/quarantined_live"] == 0
    health = track_step(tmp_path, config, 4, vacuous_step(), {}, {})
    assert [e["task"] for e in health.quarantined] == ["bad"]  # 1 + 3 new ones


def test_an_unreadable_state_file_starts_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rl360_ext.tasks import tracker as module

    monkeypatch.setattr(module, "_trackers", {})
    (tmp_path / STATE_FILE).write_text("{not json")
    health = track_step(tmp_path, TrackerConfig(), 1, [attempt("a")], {}, {})
    assert health.metrics["tasks/tracked_tasks"] == 1


def test_a_broken_live_list_is_never_overwritten_and_the_decision_waits(tmp_path: Path) -> None:
    (tmp_path / LIVE_QUARANTINE_FILE).write_text("[not the format")
    health = track_step(tmp_path, TrackerConfig(), 1, vacuous_step(), {}, {})
    assert health.quarantined == [] and health.metrics["tasks/quarantined_live"] == 0
    assert (tmp_path / LIVE_QUARANTINE_FILE).read_text() == "[not the format"  # the operator's to fix
    (tmp_path / LIVE_QUARANTINE_FILE).write_text('{"tasks": {}}')
    health = track_step(tmp_path, TrackerConfig(), 2, vacuous_step()[:1], {}, {})
    assert [e["task"] for e in health.quarantined] == ["bad"]
