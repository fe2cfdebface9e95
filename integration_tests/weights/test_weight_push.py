"""A weight push through the real SMG gateway's RL fan-out reaches every tiny engine once."""

from __future__ import annotations

import httpx
import pytest
from typer.testing import CliRunner

from rl360_ext.cli import app
from rl360_ext.local.services import start_engine, start_smg
from rl360_ext.util.procs import running
from rl360_ext.weights.push import FANOUT_PATH, WeightPushError, push_weights_from_disk

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_push_reaches_every_engine_once(tmp_path) -> None:
    weights = tmp_path / "step-1.npz"
    result = CliRunner().invoke(app, ["engine", "save-weights", str(weights), "--perturb", "0.01"])
    assert result.exit_code == 0, result.output
    engines = [start_engine(tmp_path / "logs", name=f"engine{i}") for i in range(2)]
    with running(*engines):
        gateway = start_smg([e.url for e in engines], tmp_path / "logs", extra=["--enable-rl"])
        with running(gateway):
            push = push_weights_from_disk(gateway.url, str(weights), "step-1")
            assert push.path == FANOUT_PATH
            assert push.complete, push.to_dict()
            assert push.engines_targeted == push.engines_reached == 2
            assert push.update_calls_per_engine == {e.url: 1 for e in engines}
            assert push.control_calls_per_engine == {e.url: 3 for e in engines}
            for engine in engines:
                assert httpx.get(engine.url + "/model_info").json()["weight_version"] == "step-1"
            reply = httpx.post(
                gateway.url + "/generate",
                json={"input_ids": [1, 5, 6], "sampling_params": {"max_new_tokens": 2}},
                timeout=30,
            ).json()
            assert reply["meta_info"]["weight_version"] == "step-1"

            missing = push_weights_from_disk(gateway.url, str(tmp_path / "absent.npz"), "step-2")
            assert not missing.complete
            assert {f["call"] for f in missing.failures} == {"update_weights_from_disk"}
            assert set(missing.engine_versions.values()) == {"step-1"}

            with pytest.raises(WeightPushError, match=r"no_workers_match|400"):
                push_weights_from_disk(gateway.url, str(weights), "step-3", selector="engine=vllm")
