"""`rl360 demo --harbor-replicas 2 --session-servers 2`: the Harbor replicas are Ray actors of the
demo's Ray and both serve attempts; nothing the demo started is left."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from integration_tests.demo.demo_process import DEMO_RUN_S, assert_nothing_left, demo_argv, marked_env
from rl360_ext.rollout.metrics import read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(480)
def test_demo_scales_out_over_harbor_replicas_and_session_servers(tmp_path: Path) -> None:
    """Two Harbor replicas as Ray actors of the demo's Ray, both serving attempts: 6 attempts at
    once are more than the router's spill-over (4) lets one replica take alone."""
    out, token = tmp_path / "demo", uuid.uuid4().hex
    flags = ["--steps", "1", "--tasks", "3", "--attempts", "2"]
    flags += ["--harbor-replicas", "2", "--session-servers", "2"]
    run = subprocess.run(
        demo_argv(out, *flags), env=marked_env(token), capture_output=True, text=True, timeout=DEMO_RUN_S
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert_nothing_left(token, out)
    manifest = json.loads((out / "logs" / "services.json").read_text())
    assert len(manifest["session_servers"]) == 2, manifest
    assert not [s for s in manifest["services"] if s["name"].startswith("harbor")], manifest
    actors = manifest["harbor_replicas"]
    assert [a["index"] for a in actors] == [0, 1], actors
    assert len({a["pid"] for a in actors}) == 2 and len({a["url"] for a in actors}) == 2, actors
    assert all(a["loop"].startswith("asyncio") for a in actors), actors  # not uvloop
    summary = json.loads((out / "summary.json").read_text())
    served = {r["index"]: r["attempts"] for r in summary["harbor_replicas"]}
    assert sum(served.values()) == 6 and min(served.values()) >= 1, summary["harbor_replicas"]
    assert summary["harbor_replacements"] == []
    steps, attempts = read_metrics(out / "metrics.jsonl")
    assert [s["rollout_id"] for s in steps] == [0]
    assert len(attempts) == 6 and all(a["attempt_class"] for a in attempts)
    assert "Harbor pool attempts served" in output
