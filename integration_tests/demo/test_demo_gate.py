"""`rl360 demo --inject`: each injected fault, carried through the demo's real processes, fires the
step gate on its step with the rule that sees it, and only there.

One short demo (the CLI in its own process, 7 steps of the default 8 x 4 attempts: a group's
attempts share an engine, so the bad engine serves about half the groups) with all three faults
on different steps: a template drift (the sessions of step 2 render with a drifting template:
templates/drift), a bad push (one engine serves perturbed weights under the pushed version for
rollout 4: parity), a sandbox burst (step 6: provenance). The skipped steps' updates are dropped
(no optimizer step), their rollout metrics are still logged, and every other step trains.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from integration_tests.demo.demo_process import DEMO_RUN_S, assert_nothing_left, demo_argv, marked_env
from rl360_ext.rollout.metrics import read_records

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 7
EXPECTED = {2: "templates/drift", 4: "parity/", 6: "provenance/infra_rate"}  # a rule of this name or family


def test_injected_faults_fire_the_gate_on_their_step(tmp_path: Path) -> None:
    out, token = tmp_path / "demo", uuid.uuid4().hex
    flags = [
        "--steps", str(STEPS),
        "--inject", "template-drift:2", "--inject", "bad-push:4", "--inject", "burst:6",
    ]  # fmt: skip
    run = subprocess.run(
        demo_argv(out, *flags), env=marked_env(token), capture_output=True, text=True, timeout=DEMO_RUN_S
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert_nothing_left(token, out)

    gates = {g["rollout_id"]: g for g in read_records(out / "metrics.jsonl", "gate")}
    assert sorted(gates) == list(range(STEPS)), output[-4000:]
    for step, gate in gates.items():
        fired = {reason["rule"] for reason in gate["reasons"]}
        if step in EXPECTED:
            assert gate["action"] == "skip", (step, gate)
            assert any(rule.startswith(EXPECTED[step]) for rule in fired), (step, gate)
            assert gate["metrics"]["gate/skip"] == 1.0
        else:
            assert gate["action"] == "train" and not fired, (step, gate)
    assert "gate step 4: SKIP" in output

    train = {t["rollout_id"]: t["metrics"] for t in read_records(out / "metrics.jsonl", "train")}
    assert train[2].get("train/update_skipped") == 1.0 and train[4].get("train/update_skipped") == 1.0
    assert "train/optimizer_steps" not in train[4]  # no optimizer step on a skipped step
    assert train[3]["train/optimizer_steps"] >= 1
    steps = {s["rollout_id"] for s in read_records(out / "metrics.jsonl", "step")}
    assert steps == set(range(STEPS))  # the skipped steps' rollout metrics are logged
    injected = read_records(out / "metrics.jsonl", "inject")
    assert [(i["fault"], i["after_push"]) for i in injected] == [("bad-push", 2)]
