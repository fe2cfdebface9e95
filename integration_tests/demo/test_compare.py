"""`rl360 demo --faults RATE --compare upstream`, end to end and tiny: both arms run on the same
plan, each with its own rules, and the combined report holds both.

Checks: every planned fault is an infrastructure failure in both arms; an attempt valid in both
arms on step 0 (both hold the warm-started weights) got the same reward, since its sampling seed
is the same; rl360's gradient scale is 1 and upstream's the valid share; rl360's advantage shift
is 0; compare.html has the three charts and compare.json both arms.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from integration_tests.components import bwrap_problem, skip_if_missing
from rl360_ext.local.demo_plan import DemoConfig, plan_step
from rl360_ext.local.fixtures import quiz_task_names
from rl360_ext.local.stack import demo_stack_config, preflight
from rl360_ext.rollout.metrics import read_metrics, read_records
from rl360_ext.util.prereqs import Unavailable
from rl360_ext.util.procs import rl360_argv

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS, TASKS, ATTEMPTS, FAULTS = 1, 3, 3, 0.5


@pytest.fixture(autouse=True)
def _needs_the_stack() -> None:
    try:
        preflight(demo_stack_config(DemoConfig()))
    except Unavailable as exc:
        pytest.skip(str(exc))
    skip_if_missing(bwrap_problem)


@pytest.mark.timeout(720)
def test_compare_upstream_runs_both_arms_on_one_plan(tmp_path: Path) -> None:
    out = tmp_path / "ab"
    flags = ["--steps", str(STEPS), "--tasks", str(TASKS), "--attempts", str(ATTEMPTS), "--engines", "1"]
    argv = rl360_argv("demo", "--out", str(out), *flags, "--faults", str(FAULTS), "--compare", "upstream")
    run = subprocess.run(
        argv, capture_output=True, text=True, timeout=660, env={**os.environ, "COLUMNS": "160"}
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert "MISMATCH" not in output, output[-4000:]

    config = DemoConfig(steps=STEPS, tasks=TASKS, attempts=ATTEMPTS, faults=FAULTS, out=out)
    planned = {
        a.index: a.fault for k in range(STEPS) for g in plan_step(k, config, quiz_task_names()) for a in g
    }
    assert any(planned.values())
    attempts = {}
    for arm in ("rl360", "upstream"):
        path = out / arm / "metrics.jsonl"
        _, lines = read_metrics(path)
        attempts[arm] = {a["index"]: a for a in lines}
        assert set(attempts[arm]) == set(planned)
        for index, fault in planned.items():
            if fault is not None:
                assert attempts[arm][index]["attempt_class"].startswith("infra:"), (arm, fault)
        (train,) = read_records(path, "train")
        metrics = train["metrics"]
        valid, masked = metrics["train/valid_samples"], metrics["train/masked_samples"]
        if valid:
            expected = 1.0 if arm == "rl360" else valid / (valid + masked)
            assert metrics["train/loss_scale"] == pytest.approx(expected, abs=1e-9), (arm, metrics)
        (advantage,) = read_records(path, "advantage")
        if arm == "rl360" and advantage["metrics"]:
            assert advantage["metrics"]["advantage/shift"] == pytest.approx(0.0, abs=1e-9)
        summary = json.loads((out / arm / "summary.json").read_text())
        assert summary["config"]["rules"] == arm and summary["config"]["seeded_sampling"] is True

    both = [i for i in planned if all(attempts[arm][i]["attempt_class"] == "valid" for arm in attempts)]
    assert both, "no attempt was valid in both arms"
    assert [attempts["rl360"][i]["reward"] for i in both] == [attempts["upstream"][i]["reward"] for i in both]

    html = (out / "compare.html").read_text()
    for chart in ("chart-compare-learning", "chart-compare-scale", "chart-compare-shift"):
        assert f'id="{chart}"' in html, chart
    numbers = json.loads((out / "compare.json").read_text())
    assert [arm["name"] for arm in numbers["arms"]] == ["rl360", "upstream"]
    assert len(numbers["summary"]) == 3
