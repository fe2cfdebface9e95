"""Rollout metrics: pre-filter reward over every group, valid samples only; JSONL the report reads."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.rollout.filters import check_valid_reward_nonzero_std
from rl360_ext.rollout.metrics import (
    METRICS_PATH_ENV,
    REGISTRY,
    FilterRegistry,
    GroupRecord,
    attempt_summary,
    log_rollout_metrics,
    read_metrics,
    step_metrics,
)

from .duck_samples import DuckSample, infra, valid

FILTER = "rl360_ext.rollout.filters.check_valid_reward_nonzero_std"


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(METRICS_PATH_ENV, raising=False)
    REGISTRY.drain()
    yield
    REGISTRY.drain()


def args(path: Path | None = None, **extra: Any) -> SimpleNamespace:
    fields = {"reward_key": None, "dynamic_sampling_filter_path": FILTER, "rl360_metrics_path": path, **extra}
    return SimpleNamespace(**fields)


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def reference_metrics(groups: list[GroupRecord], trained: list[dict]) -> dict[str, Any]:
    """Brute force over explicit loops (audit/* is checked against the audit's own tests)."""
    seen = [a for g in groups for a in g.attempts]
    ref: dict[str, Any] = {}
    valid_seen = [a["reward"] for a in seen if a["attempt_class"] == "valid"]
    valid_trained = [a["reward"] for a in trained if a["attempt_class"] == "valid"]
    ref["reward/unfiltered_mean"] = mean(valid_seen)
    ref["reward/kept_mean"] = mean(valid_trained)
    ref["reward/valid_fraction"] = len(valid_seen) / len(seen) if seen else None
    ref["infra/failure_rate"] = (len(seen) - len(valid_seen)) / len(seen) if seen else None
    ref["infra/masked_fraction"] = (len(trained) - len(valid_trained)) / len(trained) if trained else None
    ref["count/attempts"] = len(seen)
    ref["count/valid"] = len(valid_seen)
    ref["count/infra"] = len(seen) - len(valid_seen)
    ref["count/trained"] = len(trained)
    ref["count/masked"] = len(trained) - len(valid_trained)
    trained_groups = {a["group_index"] for a in trained}
    ref["count/kept_groups"] = len(trained_groups)
    compared = [a["render_mismatch"] for a in trained if a["render_mismatch"] is not None]
    ref["tito/render_mismatch_frac"] = sum(compared) / len(compared) if compared else None
    ref["count/dropped_groups"] = sum(1 for g in groups if not g.keep)
    ref["count/unused_groups"] = sum(1 for g in groups if g.keep and g.group_index not in trained_groups)
    for cls in {a["attempt_class"] for a in seen} - {"valid"}:
        cause = cls.split(":", 1)[1]
        n = sum(1 for a in seen if a["attempt_class"] == cls)
        ref[f"infra/{cause}_rate"] = n / len(seen)
        ref[f"count/infra/{cause}"] = n
    ref["count/policy_floor"] = sum(1 for a in seen if a["reward_source"] == "floor")
    for who in {a["attributed_to"] for a in seen if a["attributed_to"]}:
        mine = [a for a in seen if a["attributed_to"] == who]
        ref[f"attribution/{who}_rate"] = len(mine) / len(seen)
        for cause in {a["failure_cause"] for a in mine}:
            ref[f"count/attribution/{who}/{cause}"] = sum(1 for a in mine if a["failure_cause"] == cause)
    for reason in {g.reason for g in groups if not g.keep}:
        ref[f"count/dropped_groups/{reason}"] = sum(1 for g in groups if not g.keep and g.reason == reason)
    for domain in {a["domain"] for a in seen + trained if a["domain"] is not None}:
        in_seen = [a for a in seen if a["domain"] == domain]
        in_trained = [a for a in trained if a["domain"] == domain]
        ref[f"domain/{domain}/kept_mean"] = mean(
            [a["reward"] for a in in_trained if a["attempt_class"] == "valid"]
        )
        ref[f"domain/{domain}/unfiltered_mean"] = mean(
            [a["reward"] for a in in_seen if a["attempt_class"] == "valid"]
        )
        ref[f"domain/{domain}/attempts"] = len(in_seen)
        ref[f"domain/{domain}/valid_fraction"] = (
            sum(1 for a in in_seen if a["attempt_class"] == "valid") / len(in_seen) if in_seen else None
        )
    return ref


attempt_strategy = st.tuples(
    st.sampled_from(["valid", "valid", "floor", "infra:sandbox_lost", "infra:client_deadline"]),
    st.sampled_from([0.0, 0.5, 1.0]),
    st.sampled_from([None, "python", "rust"]),
)


@settings(max_examples=100)
@given(
    groups=st.lists(
        st.tuples(
            st.lists(attempt_strategy, min_size=1, max_size=5),
            st.sampled_from(["kept", "unused", "insufficient_valid_rewards", "zero_std_valid"]),
        ),
        max_size=6,
    )
)
def test_metrics_equal_a_brute_force_reference(
    groups: list[tuple[list[tuple[str, float, str]], str]],
) -> None:
    records, trained, index = [], [], 0
    for g, (members, verdict) in enumerate(groups):
        attempts = []
        for cls, reward, domain in members:
            if cls == "floor":  # a verifier timeout attributed to the policy, scored at the floor
                cause = {"failure_cause": "verifier_timeout", "reward_source": "floor"}
                sample = valid(g, index, 0.0, domain=domain, attributed_to="policy", **cause)
            elif cls == "valid":
                sample = valid(g, index, reward, domain=domain)
            else:
                sample = infra(
                    g, index, cls[6:], domain=domain, attributed_to="infrastructure", failure_cause=cls[6:]
                )
            attempts.append(attempt_summary(sample))
            index += 1
        keep = verdict in ("kept", "unused")
        records.append(GroupRecord(g, attempts, keep, None if keep else verdict))
        if verdict == "kept":
            trained.extend(attempts)
    metrics = step_metrics(trained, records)
    expected = reference_metrics(records, trained)
    own = {k: v for k, v in metrics.items() if not k.startswith(("audit/", "occupancy/", "tasks/"))}
    assert own == pytest.approx(expected)


def test_step_through_the_filter_and_the_log_hook(tmp_path: Path) -> None:
    """Dropped all-pass groups still count in unfiltered_mean; kept_mean and counts follow the batch."""
    path = tmp_path / "metrics.jsonl"
    a = args(path)
    kept = [valid(0, 0, 1.0, domain="py"), valid(0, 1, 0.0, domain="py"), infra(0, 2, "verifier_timeout")]
    all_pass = [valid(1, 3, 1.0, domain="rs"), valid(1, 4, 1.0, domain="rs")]
    broken = [valid(2, 5, 0.0), infra(2, 6, "no_sandbox"), infra(2, 7, "no_sandbox")]
    kept[0].prefix_cache_info = SimpleNamespace(cached_tokens=30, total_prompt_tokens=120)
    for group in (kept, all_pass, broken):
        check_valid_reward_nonzero_std(a, group)
    assert log_rollout_metrics(5, a, kept, {"rollout/dynamic_filter/drop_zero_std_valid": 1}, 12.5) is True

    steps, attempts = read_metrics(path)
    assert len(steps) == 1 and len(attempts) == 8
    step = steps[0]
    assert step["rollout_id"] == 5 and step["prefilter"] == "filter_hook" and step["rollout_time_s"] == 12.5
    assert step["miles_metrics"] == {"rollout/dynamic_filter/drop_zero_std_valid": 1}
    m = step["metrics"]
    assert m["reward/unfiltered_mean"] == pytest.approx(3 / 5)
    assert m["reward/kept_mean"] == pytest.approx(0.5)
    assert m["reward/valid_fraction"] == pytest.approx(5 / 8)
    assert m["infra/failure_rate"] == pytest.approx(3 / 8)
    assert m["infra/no_sandbox_rate"] == pytest.approx(2 / 8)
    assert m["infra/verifier_timeout_rate"] == pytest.approx(1 / 8)
    assert m["count/dropped_groups/zero_std_valid"] == 1
    assert m["count/dropped_groups/insufficient_valid_rewards"] == 1
    assert (m["count/kept_groups"], m["count/trained"], m["count/masked"]) == (1, 3, 1)
    assert m["domain/rs/unfiltered_mean"] == 1.0 and m["domain/rs/kept_mean"] is None
    assert m["domain/py/kept_mean"] == pytest.approx(0.5)
    assert m["audit/gradient_scale_upstream"] == pytest.approx(2 / 3)

    by_index = {r["index"]: r for r in attempts}
    assert by_index[0]["trained"] and by_index[0]["filter"] == "kept"
    assert (by_index[0]["cached_tokens"], by_index[0]["prompt_tokens"]) == (30, 120)
    assert by_index[0]["phase_timings"] == {"agent": 1.5, "verifier": 0.25}
    assert by_index[2]["attempt_class"] == "infra:verifier_timeout" and by_index[2]["reward"] is None
    assert by_index[3]["filter"] == "dropped" and by_index[3]["dropped_reason"] == "zero_std_valid"
    assert by_index[6]["dropped_reason"] == "insufficient_valid_rewards" and not by_index[6]["trained"]
    assert REGISTRY.drain() == ([], 0)


def test_env_path_and_attempt_lines_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "env.jsonl"
    monkeypatch.setenv(METRICS_PATH_ENV, str(path))
    a = SimpleNamespace(reward_key=None, dynamic_sampling_filter_path=None, rl360_metrics_attempts=False)
    log_rollout_metrics(0, a, [valid(0, 0, 1.0), valid(0, 1, 0.0)], None, 1.0)
    log_rollout_metrics(1, a, [valid(1, 2, 1.0), infra(1, 3)], None, 1.0)
    steps, attempts = read_metrics(path)
    assert [s["rollout_id"] for s in steps] == [0, 1] and attempts == []
    assert steps[1]["prefilter"] == "no_filter"
    assert steps[1]["metrics"]["reward/unfiltered_mean"] == steps[1]["metrics"]["reward/kept_mean"] == 1.0


def test_another_filter_makes_unfiltered_unavailable_not_guessed(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    a = args(
        path,
        dynamic_sampling_filter_path="miles.rollout.filter_hub.dynamic_sampling_filters.check_no_aborted",
    )
    log_rollout_metrics(3, a, [valid(0, 0, 1.0), valid(0, 1, 0.0)], {}, 1.0)
    step = read_metrics(path)[0][0]
    assert step["prefilter"] == "unavailable"
    assert step["metrics"]["reward/unfiltered_mean"] is None and step["metrics"]["reward/kept_mean"] == 0.5


def test_no_path_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert log_rollout_metrics(0, args(None), [valid(0, 0, 1.0)], {}, 1.0) is True
    assert list(tmp_path.iterdir()) == []


def test_registry_is_bounded_and_counts_overflow() -> None:
    registry = FilterRegistry(max_groups=2)
    for g in range(5):
        registry.record(GroupRecord(g, [], True, None))
    groups, overflowed = registry.drain()
    assert [g.group_index for g in groups] == [3, 4] and overflowed == 3
    assert registry.drain() == ([], 0)


def test_jsonl_lines_are_plain_json(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    log_rollout_metrics(0, args(path, dynamic_sampling_filter_path=None), [valid(0, 0, 1.0)], {}, 0.5)
    for line in path.read_bytes().splitlines():
        assert isinstance(orjson.loads(line), dict)


def test_a_json_line_that_is_not_an_object_is_named(tmp_path) -> None:
    from rl360_ext.rollout.metrics import read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kind": "step", "schema": 1, "rollout_id": 0, "metrics": {}}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2: not a JSON object"):
        read_metrics(path)


def test_render_mismatch_fraction_counts_only_compared_trajectories() -> None:
    drift = {"checked": True, "mismatch": True, "position": 7, "kind": "unclassified"}
    clean_record = {"checked": True, "mismatch": False}
    samples = [valid(0, 0, 1.0), valid(0, 1, 0.0), valid(0, 2, 1.0), valid(0, 3, 0.0)]
    for sample, record in zip(
        samples, [drift, clean_record, {"checked": False, "mismatch": False}, None], strict=True
    ):
        sample.metadata = {**(sample.metadata or {}), "template_drift": record}
    trained = [attempt_summary(s) for s in samples]
    assert [a["render_mismatch"] for a in trained] == [True, False, None, None]
    assert step_metrics(trained, None)["tito/render_mismatch_frac"] == 0.5


def test_the_hook_tracks_task_health_next_to_the_quarantine_file(tmp_path: Path) -> None:
    """With --rl360-quarantine-file, each step goes through the training-time tracker: its tasks/*
    metrics, the step record's task_health, and a task with the vacuous signature in 3 attempts
    (across two steps) on the live list the agent function honours."""
    from rl360_ext.tasks.health import TaskHealth, read_quarantine, write_outputs
    from rl360_ext.tasks.tracker import LIVE_QUARANTINE_FILE, STATE_FILE
    from rl360_ext.tasks.verdicts import TaskVerdict

    _, quarantine = write_outputs([TaskHealth("q", [TaskVerdict.OK], {"undecided": []})], tmp_path / "health")
    path = tmp_path / "m.jsonl"
    a = args(
        path,
        dynamic_sampling_filter_path=None,
        rl360_harbor_url="http://h",
        rl360_quarantine_file=str(quarantine),
    )

    def crashed(group: int, index: int) -> DuckSample:
        return valid(group, index, 1.0, task="q", exception_type="ContextLengthExceededError")

    log_rollout_metrics(0, a, [crashed(0, 0), crashed(0, 1), valid(0, 2, 0.0, task="q")], None, 1.0)
    assert not (quarantine.parent / LIVE_QUARANTINE_FILE).exists()
    log_rollout_metrics(1, a, [crashed(1, 0), valid(1, 1, 0.0, task="q")], None, 1.0)
    first, second = read_metrics(path)[0]
    assert first["metrics"]["tasks/quarantined_new"] == 0 and second["metrics"]["tasks/quarantined_new"] == 1
    assert second["metrics"]["tasks/tracked_tasks"] == 1
    (entry,) = second["task_health"]["quarantined"]
    assert entry["task"] == "q" and entry["verdicts"] == ["vacuous"]
    assert entry["evidence"]["vacuous"]["vacuous_signature_attempts"] == 3
    assert dict(read_quarantine(quarantine.parent / LIVE_QUARANTINE_FILE)) == {"q": ("vacuous",)}
    assert (quarantine.parent / STATE_FILE).exists()
