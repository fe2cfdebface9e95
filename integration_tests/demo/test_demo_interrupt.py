"""`rl360 demo` stopped by Ctrl-C or SIGTERM in the middle of a rollout: it says so, exits with a
failure status, and leaves no process or listening port it opened."""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from integration_tests.demo.demo_process import (
    FIRST_ROLLOUT_S,
    assert_nothing_left,
    demo_argv,
    marked_env,
    with_ctrl_c,
)
from rl360_ext.rollout.metrics import read_records

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(420)
@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupt_mid_rollout_stops_every_process(tmp_path: Path, stop_signal: signal.Signals) -> None:
    out, token = tmp_path / "demo", uuid.uuid4().hex
    flags = ["--steps", "3", "--tasks", "4", "--attempts", "3", "--faults", "0.3"]
    process = subprocess.Popen(
        with_ctrl_c(demo_argv(out, *flags)),
        env=marked_env(token),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        metrics = out / "metrics.jsonl"
        deadline = time.monotonic() + FIRST_ROLLOUT_S
        while not (metrics.exists() and read_records(metrics, "weight_push")):  # initial push: rollouts start
            assert process.poll() is None, process.communicate()[0][-4000:]
            assert time.monotonic() < deadline, "the demo did not reach its first rollout"
            time.sleep(0.2)
        time.sleep(1.0)
        process.send_signal(stop_signal)
        output, _ = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode != 0, output[-4000:]
    assert "stopping every process the demo started" in output
    assert_nothing_left(token, out)
