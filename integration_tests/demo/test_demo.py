"""`rl360 demo` end to end, as a user runs it (the CLI in its own process), small.

Checks what the demo promises: the metrics JSONL agrees with its own per-attempt lines and with
the demo's summary, infrastructure attempts never reach a reward mean, every planned fault is
masked, weight versions advance on Miles' one-step-off schedule, the report has every chart, and
afterwards no process or listening port the demo opened is left. The other demo tests are one per
module, so the test workers run them side by side.
"""

from __future__ import annotations

import json
import math
import subprocess
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from integration_tests.demo.demo_process import DEMO_RUN_S, assert_nothing_left, demo_argv, marked_env
from rl360_ext.local.demo.plan import DemoConfig, plan_step
from rl360_ext.local.demo.versions import expected_weight_version
from rl360_ext.local.fixtures import quiz_task_names
from rl360_ext.rollout.metrics import read_metrics, read_records
from tests.diagnostics.report_fixtures import CHARTS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS, TASKS, ATTEMPTS, FAULTS = 3, 2, 3, 0.5


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _close(a: float | None, b: float | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and math.isclose(a, b, abs_tol=1e-9))


def _check_step(step: dict[str, Any], lines: list[dict[str, Any]], row: dict[str, Any]) -> None:
    """One step record against its attempt lines and the demo's own summary row."""
    metrics = step["metrics"]
    assert step["prefilter"] == "filter_hook"
    valid = [a for a in lines if a["attempt_class"] == "valid"]
    infra = [a for a in lines if a["attempt_class"] != "valid"]
    assert all(a["attempt_class"].startswith("infra:") for a in infra)
    assert all(a["reward"] is None for a in infra), "an infra attempt carries a reward"
    assert all(isinstance(a["reward"], float) and a["reward_source"] == "verifier" for a in valid)
    assert metrics["count/attempts"] == len(lines) == TASKS * ATTEMPTS
    assert metrics["count/valid"] == len(valid) and metrics["count/infra"] == len(infra)
    causes = Counter(a["attempt_class"].removeprefix("infra:") for a in infra)
    assert {
        k.removeprefix("count/infra/"): v for k, v in metrics.items() if k.startswith("count/infra/")
    } == causes
    assert _close(metrics["reward/unfiltered_mean"], _mean([a["reward"] for a in valid]))
    trained = [a for a in lines if a["trained"]]
    kept_valid = [a["reward"] for a in trained if a["attempt_class"] == "valid"]
    assert _close(metrics["reward/kept_mean"], _mean(kept_valid))  # infra attempts never in the kept mean
    assert metrics["count/trained"] == len(trained)
    assert metrics["count/masked"] == len(trained) - len(kept_valid)
    groups: dict[Any, list[dict[str, Any]]] = {}
    for attempt in lines:
        groups.setdefault(attempt["group_index"], []).append(attempt)
    assert len(groups) == TASKS
    kept_groups = 0
    for members in groups.values():
        verdicts = {a["filter"] for a in members}
        assert len(verdicts) == 1, f"one group, several filter verdicts: {verdicts}"
        rewards = [a["reward"] for a in members if a["attempt_class"] == "valid"]
        if verdicts == {"kept"}:
            kept_groups += 1
            assert len(rewards) >= 2 and len(set(rewards)) > 1
        else:
            assert verdicts == {"dropped"} and members[0]["dropped_reason"] in (
                "insufficient_valid_rewards",
                "zero_std_valid",
            )
    assert metrics["count/kept_groups"] == kept_groups
    # the demo's summary row is computed from the samples themselves, not from the JSONL
    assert row["attempts"] == len(lines) and row["valid"] == len(valid)
    assert row["infra_by_cause"] == dict(causes) and row["kept_groups"] == kept_groups
    assert _close(row["unfiltered_mean"], metrics["reward/unfiltered_mean"])
    assert _close(row["kept_mean"], metrics["reward/kept_mean"])


@pytest.mark.timeout(480)
def test_demo_runs_the_loop_in_order_and_leaves_nothing_behind(tmp_path: Path) -> None:
    out, token = tmp_path / "demo", uuid.uuid4().hex
    flags = [
        "--steps",
        str(STEPS),
        "--tasks",
        str(TASKS),
        "--attempts",
        str(ATTEMPTS),
        "--faults",
        str(FAULTS),
    ]
    run = subprocess.run(
        demo_argv(out, *flags), env=marked_env(token), capture_output=True, text=True, timeout=DEMO_RUN_S
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert "MISMATCH" not in output, output[-4000:]
    assert_nothing_left(token, out)

    steps, attempts = read_metrics(out / "metrics.jsonl")
    summary = json.loads((out / "summary.json").read_text())
    assert [s["rollout_id"] for s in steps] == list(range(STEPS))
    for step, row in zip(steps, summary["steps"], strict=True):
        _check_step(step, [a for a in attempts if a["rollout_id"] == step["rollout_id"]], row)

    # every fault the plan aimed at an attempt was masked as infrastructure
    config = DemoConfig(steps=STEPS, tasks=TASKS, attempts=ATTEMPTS, faults=FAULTS, out=out)
    planned = {
        a.index: a.fault for k in range(STEPS) for g in plan_step(k, config, quiz_task_names()) for a in g
    }
    by_index = {a["index"]: a for a in attempts}
    assert set(by_index) == set(planned)
    assert any(planned.values())
    for index, fault in planned.items():
        if fault is not None:
            assert by_index[index]["attempt_class"].startswith("infra:"), (fault, by_index[index])

    # weights: one push before step 0, one after each step's update; turns on the expected version
    pushes = read_records(out / "metrics.jsonl", "weight_push")
    assert [p["rollout_id"] for p in pushes] == [None, *range(STEPS)]
    assert [p["weight_version"] for p in pushes] == [str(v) for v in range(STEPS + 1)]
    for push in pushes:
        assert push["complete"] and push["engines_reached"] == push["engines_targeted"] == 2
        assert sorted(push["update_calls_per_engine"].values()) == [1, 1]
    seen = []
    for number, row in enumerate(summary["steps"]):
        assert row["version_problems"] == []
        if row["valid"]:
            assert row["versions_seen"] == [expected_weight_version(number)]
            seen.append(int(row["versions_seen"][0]))
    assert seen == sorted(seen) and seen[-1] > seen[0] == 0, summary["steps"]

    html = (out / "report.html").read_text()
    for chart in CHARTS:
        assert f'id="{chart}"' in html, chart
    assert summary["wall_s"] < DEMO_RUN_S
