"""`rl360 demo --schedule in-flight`, small: the push after step 0 lands while step 1 generates.

One in-flight push (two steps, in_place: the demo's default; retract is measured in
docs/demo.md). Checks that every push completes, that the push after step 0 waited for the
engines to generate rollout 1 (requests running, or the rollout already done), that each step's
turns carry only the versions the in-flight schedule allows, that the per-step version figures
are the trainer's staleness metrics, and that nothing the demo started is left.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from integration_tests.demo.demo_process import assert_nothing_left, demo_argv, marked_env
from rl360_ext.local.demo.modes import IN_FLIGHT
from rl360_ext.local.demo.versions import AGE_BUCKETS, allowed_weight_versions
from rl360_ext.rollout.metrics import read_records

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 2


@pytest.mark.timeout(480)
def test_in_flight_step(tmp_path: Path) -> None:
    pause_mode = "in_place"
    out, token = tmp_path / "demo", uuid.uuid4().hex
    flags = ["--steps", str(STEPS), "--tasks", "2", "--attempts", "2", "--schedule", IN_FLIGHT]
    run = subprocess.run(
        demo_argv(out, *flags, "--pause-mode", pause_mode),
        env=marked_env(token),
        capture_output=True,
        text=True,
        timeout=420,  # a small run while the other test workers share the 2 cores
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert "MISMATCH" not in output, output[-4000:]
    assert_nothing_left(token, out)

    pushes = read_records(out / "metrics.jsonl", "weight_push")
    assert [p["weight_version"] for p in pushes] == [str(v) for v in range(STEPS + 1)]
    assert all(p["complete"] for p in pushes), pushes
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["schedule"] == IN_FLIGHT and summary["config"]["pause_mode"] == pause_mode
    for step, row in enumerate(summary["steps"]):
        allowed = allowed_weight_versions(IN_FLIGHT, step, STEPS)
        assert row["expected_version"] == ",".join(allowed)
        assert set(row["versions_seen"]) <= set(allowed), row
        if row["kept_groups"]:  # figures are the trainer's, over the samples trained on
            hist = [row["versions"][f"staleness/token_age_hist/{bucket}"] for bucket in AGE_BUCKETS]
            assert row["versions"]["staleness/aged_tokens"] > 0 and sum(hist) == pytest.approx(1.0)
    assert "versions step 1:" in output
    # the push after step 0 waited for rollout 1 to be generating (the old schedule sent it at
    # once, during rollout 1's sandbox setup): it went out with requests running, or, where a
    # rollout here is shorter than a train step (2 s attempts), only once that rollout was done
    landed = pushes[1]["in_flight"]
    assert landed["running_requests"] > 0 or landed["requests_answered"] > 0 or landed["rollout_done"], landed
