"""`rl360 demo --harbor-replicas 2` with one replica's process SIGKILLed while it runs sandboxes:
its attempts are masked, the pool's watchdog replaces it on the same URL, the run completes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from integration_tests.demo.demo_process import (
    DEMO_RUN_S,
    FIRST_ROLLOUT_S,
    assert_nothing_left,
    demo_argv,
    marked_env,
    sandboxes_under,
)
from rl360_ext.rollout.metrics import read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(480)
def test_a_replica_killed_mid_step_is_replaced_and_its_attempts_are_masked(tmp_path: Path) -> None:
    """SIGKILL one Harbor replica's process while it runs sandboxes: the step completes with that
    replica's attempts masked as infra, the pool's watchdog replaces it on the same URL, and the
    next step's attempts are all graded."""
    out, token = tmp_path / "demo", uuid.uuid4().hex
    flags = ["--steps", "2", "--tasks", "3", "--attempts", "2", "--harbor-replicas", "2"]
    process = subprocess.Popen(
        demo_argv(out, *flags),
        env=marked_env(token),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        manifest_path, deadline = out / "logs" / "services.json", time.monotonic() + FIRST_ROLLOUT_S
        victim = None
        while victim is None:
            assert process.poll() is None, process.communicate()[0][-4000:]
            assert time.monotonic() < deadline, "no replica ran a sandbox"
            with contextlib.suppress(OSError, ValueError, KeyError):
                for replica in json.loads(manifest_path.read_text())["harbor_replicas"]:
                    if sandboxes_under(replica["pid"]):
                        victim = replica
                        break
            time.sleep(0.05)
        os.kill(victim["pid"], signal.SIGKILL)
        output, _ = process.communicate(timeout=DEMO_RUN_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, output[-4000:]
    assert_nothing_left(token, out)
    summary = json.loads((out / "summary.json").read_text())
    (replacement,) = summary["harbor_replacements"]
    assert replacement["index"] == victim["index"] and replacement["url"] == victim["url"], replacement
    served = {r["index"]: r for r in summary["harbor_replicas"]}
    assert served[victim["index"]]["generation"] == 1 and served[victim["index"]]["pid"] != victim["pid"]
    first, second = summary["steps"]
    lost = first["infra_by_cause"].get("sandbox_lost", 0) + first["infra_by_cause"].get("no_sandbox", 0)
    assert lost >= 1, first
    assert second["valid"] == second["attempts"] == 6, second
    _, attempts = read_metrics(out / "metrics.jsonl")
    masked = [a for a in attempts if a["attempt_class"] in ("infra:sandbox_lost", "infra:no_sandbox")]
    assert len(masked) == lost and all(a["reward"] is None and not a["trained"] for a in masked), masked
