"""`rl360 demo --schedule in-flight`, small: the push after step 0 lands while step 1 generates.

Checks that every push completes with the pause mode asked for (in_place keeps the prefix cache,
since SGLang refuses that flush), that each step's turns carry only the versions the in-flight
schedule allows, that the per-step version figures were computed from the samples' version
arrays, and that nothing the demo started is left.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from integration_tests.demo.test_demo import _assert_nothing_left, _demo_argv, _env, _needs_the_stack
from rl360_ext.local.demo_plan import AGE_BUCKETS, IN_FLIGHT, allowed_weight_versions
from rl360_ext.rollout.metrics import read_records

pytestmark = [pytest.mark.integration, pytest.mark.slow]
__all__ = ["_needs_the_stack"]  # the stack/bwrap skip fixture (autouse) applies here too

STEPS = 2


@pytest.mark.parametrize("pause_mode", ["in_place", "retract"])
def test_in_flight_step(tmp_path: Path, pause_mode: str) -> None:
    out, token = tmp_path / "demo", uuid.uuid4().hex
    flags = ["--steps", str(STEPS), "--tasks", "2", "--attempts", "2", "--schedule", IN_FLIGHT]
    run = subprocess.run(
        _demo_argv(out, *flags, "--pause-mode", pause_mode),
        env=_env(token),
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert "MISMATCH" not in output, output[-4000:]
    _assert_nothing_left(token, out)

    pushes = read_records(out / "metrics.jsonl", "weight_push")
    assert [p["weight_version"] for p in pushes] == [str(v) for v in range(STEPS + 1)]
    assert all(p["complete"] for p in pushes), pushes
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["schedule"] == IN_FLIGHT and summary["config"]["pause_mode"] == pause_mode
    for step, row in enumerate(summary["steps"]):
        allowed = allowed_weight_versions(IN_FLIGHT, step, STEPS)
        assert row["expected_version"] == ",".join(allowed)
        assert set(row["versions_seen"]) <= set(allowed), row
        figures = row["versions"]
        assert figures is not None and set(figures["token_age_hist"]) == set(AGE_BUCKETS)
        if row["kept_groups"]:  # figures are over the samples trained on
            assert figures["samples"] > 0 and sum(figures["token_age_hist"].values()) > 0
    assert "versions step 1:" in output
