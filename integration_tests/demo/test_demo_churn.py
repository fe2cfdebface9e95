"""`rl360 demo --engine-churn kill:0,hang:1`, small: an engine is killed mid-rollout of step 0 and
replaced, and at the push after step 1 the replacement stops answering (and hangs on shutdown).

Checks the issue's invariants: every push completes and reaches every live engine (the hung one is
fenced within the confirm timeout and the push retried on the refreshed set), every push reports
its path and reason, no token is stale-served, each replacement joined on the weights published
before it (loaded directly, then added to the gateway), the run completes with no version
mismatch, and nothing the demo started is left (the hung engine was killed, not waited on).
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from integration_tests.demo.demo_process import assert_nothing_left, demo_argv, marked_env
from rl360_ext.rollout.metrics import read_records
from rl360_ext.weights.push import FANOUT_PATH

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 2


@pytest.mark.timeout(450)
def test_churn_kill_and_hang(tmp_path: Path) -> None:
    out, token = tmp_path / "demo", uuid.uuid4().hex
    flags = ["--steps", str(STEPS), "--tasks", "2", "--attempts", "2", "--engine-churn", "kill:0,hang:1"]
    run = subprocess.run(
        demo_argv(out, *flags), env=marked_env(token), capture_output=True, text=True, timeout=420
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert "MISMATCH" not in output, output[-4000:]
    assert_nothing_left(token, out)

    pushes = read_records(out / "metrics.jsonl", "weight_push")
    assert [p["weight_version"] for p in pushes] == [str(v) for v in range(STEPS + 1)]
    for push in pushes:
        metrics = push["metrics"]
        assert push["complete"], push
        assert metrics["weights/path"] == FANOUT_PATH
        assert metrics["weights/engines_reached"] == metrics["weights/engines_expected"] >= 1, metrics
        assert metrics["weights/stale_served_tokens"] == 0, metrics
    reasons = [p["metrics"]["weights/reason"] for p in pushes]
    assert reasons[:2] == ["first", "new_engines"], reasons  # the kill's replacement joined before push 1
    hung = pushes[-1]["metrics"]
    assert hung["weights/engines_fenced"] == 1 and hung["weights/attempts"] == 2, hung

    events = read_records(out / "metrics.jsonl", "engine_churn")
    by_event = {e["event"]: e for e in events}
    assert [e["event"] for e in events] == ["kill", "hang", "fence", "replace"], events
    assert by_event["kill"]["replacement_version"] == "0"  # the weights published when it joined
    assert by_event["fence"]["url"] == by_event["hang"]["url"]
    assert by_event["fence"]["shutdown"] == "sigkill"  # it hung on shutdown; the fence did not wait on it
    assert by_event["replace"]["replacement_version"] == str(STEPS)
    assert "fenced" in output and "engine churn: killed engine0" in output
