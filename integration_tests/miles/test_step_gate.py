"""The rl360 step gate inside Miles: `--custom-convert-samples-to-train-data-path
rl360_ext.gate.miles_hook.gated_train_data`.

- Unpatched Miles (MILES_SRC as is): Miles' `convert_samples_to_train_data` call site with the hook
  loaded by `load_function`, after Miles' `log_rollout_data` ran rl360's log hook on the same
  groups: a clean step's train data is exactly Miles' own conversion; a burst against the baseline
  comes back with every loss mask zeroed (the most an unpatched Miles allows); three in a row raise
  `GateStop`. Each verdict is a `"kind": "gate"` line in the metrics JSONL.
- Patched with 0011: Miles' own `train.py` loop and `RolloutManager.generate` run a plan of clean and
  burst steps (`step_gate_driver.py`, in a subprocess on a patched copy): a skipped step never
  reaches the actor's `train`, the loop goes on, and the third skip in a row stops the run after a
  checkpoint, with the rollout manager disposed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PATCHES = sorted((ROOT / "patches" / "miles").glob("*.patch"))
HOOK = "rl360_ext.gate.miles_hook.gated_train_data"
FILTER = "rl360_ext.rollout.filters.check_valid_reward_nonzero_std"
POST_PROCESS = "rl360_ext.rollout.rewards.valid_group_advantages"
LOG_FUNCTION = "rl360_ext.rollout.metrics.log_rollout_metrics"


@pytest.fixture(autouse=True)
def _empty_filter_registry() -> None:
    from rl360_ext.rollout.metrics import REGISTRY

    REGISTRY.drain()


def _groups(make_sample, kind: str, rollout_id: int) -> list[list]:
    base = 100 * rollout_id
    if kind == "clean":
        return [[make_sample(g, base + 4 * g + i, float(i % 2 == 0)) for i in range(4)] for g in range(4)]
    return [
        [
            make_sample(g, base + 4 * g, 1.0),
            make_sample(g, base + 4 * g + 1, 0.0),
            make_sample(g, base + 4 * g + 2, infra="sandbox_lost"),
            make_sample(g, base + 4 * g + 3, infra="no_sandbox"),
        ]
        for g in range(4)
    ]


def _logged_step(args, rollout_id: int, groups: list[list]) -> list:
    """The rl360 filter through Miles' call site, then Miles' log call site (rl360's log hook)."""
    from miles.ray.rollout.metrics import log_rollout_data
    from miles.rollout.filter_hub.base_types import call_dynamic_filter
    from miles.utils.misc import load_function

    kept = [g for g in groups if call_dynamic_filter(load_function(FILTER), args, g).keep]
    samples = [s for g in kept for s in g]
    log_rollout_data(rollout_id, args, samples, {}, 1.0)
    return samples


def _convert(args, samples, custom: str | None):
    from miles.ray.rollout.train_data_conversion import convert_samples_to_train_data
    from miles.utils.misc import load_function

    return convert_samples_to_train_data(
        args,
        samples,
        metadata={},
        custom_convert_samples_to_train_data_func=load_function(custom) if custom else None,
        custom_reward_post_process_func=load_function(POST_PROCESS),
    )


def test_gate_in_unpatched_miles_trains_masks_a_burst_and_stops(
    make_args, make_sample, tmp_path: Path
) -> None:
    import miles.ray.rollout.train_data_conversion as conversion

    from rl360_ext.gate.miles_hook import GateStop
    from rl360_ext.rollout.metrics import read_records

    if hasattr(conversion, "STEP_ACTION_KEY"):
        pytest.skip("MILES_SRC carries patch 0011: the unpatched path is not reachable")
    metrics = tmp_path / "metrics.jsonl"
    args = make_args(
        dynamic_sampling_filter_path=FILTER, custom_rollout_log_function_path=LOG_FUNCTION,
        custom_reward_post_process_path=POST_PROCESS, custom_convert_samples_to_train_data_path=HOOK,
        rl360_metrics_path=str(metrics), rl360_metrics_attempts=False,
    )  # fmt: skip
    for rollout_id in range(3):
        samples = _logged_step(args, rollout_id, _groups(make_sample, "clean", rollout_id))
        gated = _convert(args, samples, HOOK)
        plain = _convert(args, samples, None)
        assert gated.keys() == plain.keys() and gated == plain
        assert sum(map(sum, gated["loss_masks"])) == 64  # 16 samples of 4 response tokens

    samples = _logged_step(args, 3, _groups(make_sample, "burst", 3))
    gated, plain = _convert(args, samples, HOOK), _convert(args, samples, None)
    assert sum(map(sum, plain["loss_masks"])) == 32  # the valid half: what Miles alone would train on
    assert sum(map(sum, gated["loss_masks"])) == 0
    assert sum(gated["rollout_mask_sums"]) == 0
    assert {k: v for k, v in gated.items() if k not in ("loss_masks", "rollout_mask_sums")} == {
        k: v for k, v in plain.items() if k not in ("loss_masks", "rollout_mask_sums")
    }

    _convert(args, _logged_step(args, 4, _groups(make_sample, "burst", 4)), HOOK)
    with pytest.raises(GateStop, match="consecutive_skips"):
        _convert(args, _logged_step(args, 5, _groups(make_sample, "burst", 5)), HOOK)

    gates = read_records(metrics, "gate")
    assert [g["action"] for g in gates] == ["train"] * 3 + ["skip", "skip", "stop"]
    dynamic = make_args(**{**vars(args), "use_dynamic_global_batch_size": True})
    with pytest.raises(RuntimeError, match="use-dynamic-global-batch-size"):
        _convert(dynamic, samples, HOOK)  # unpatched Miles does not hand the hook its metadata
    assert [g["rollout_id"] for g in gates] == list(range(6))
    burst = gates[3]["reasons"][0]
    assert (burst["rule"], burst["metric"], burst["value"], burst["bound"]) == (
        "provenance/infra_burst", "infra/failure_rate", 0.5, 0.2,
    )  # fmt: skip
    assert gates[3]["metrics"]["gate/skip"] == 1.0
    saved = json.loads((tmp_path / "metrics.jsonl.gate-state.json").read_text())
    assert saved["consecutive_skips"] == 3 and saved["infra_rates"] == [0.0, 0.0, 0.0]
    from rl360_ext.gate import miles_hook

    miles_hook._GATES.clear()  # a restarted RolloutManager: the baseline and the streak come back
    assert miles_hook._gate(args).state.to_json() == saved


@pytest.fixture(scope="module")
def patched_miles(miles_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("miles-gate-patched")
    for name in ("miles", "tests", "examples"):
        shutil.copytree(miles_root / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "train.py", "train_async.py"):
        shutil.copy2(miles_root / name, root / name)
    result = subprocess.run(
        ["git", "apply", *map(str, PATCHES)], cwd=root, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    return root


def _drive(patched: Path, tmp_path: Path, plan: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(patched), str(ROOT)])}
    result = subprocess.run(
        [sys.executable, str(HERE / "step_gate_driver.py"), str(tmp_path / "metrics.jsonl"), ",".join(plan)],
        cwd=patched,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_patched_miles_loop_skips_a_step_and_stops_cleanly(patched_miles: Path, tmp_path: Path) -> None:
    plan = ["clean", "clean", "clean", "burst", "clean", "burst", "burst", "burst", "clean", "clean"]
    out = _drive(patched_miles, tmp_path, plan)
    events = [tuple(e) for e in out["events"]]
    trained = [e[1] for e in events if e[0] == "train"]
    assert trained == [0, 1, 2, 4]  # 3 skipped; 5 and 6 skipped; 7 stops
    assert all(e[2] == 48 for e in events if e[0] == "train")
    assert [e[1] for e in events if e[0] == "generate"] == list(range(8))  # nothing after the stop
    assert events[-3:] == [("save", 7), ("rollout_save", 7), ("dispose",)]
    assert ("update_weights", 3) in events  # a skipped step still pushes (the unchanged weights)
    assert out["objects_left"] == 0

    from rl360_ext.rollout.metrics import read_records

    gates = read_records(tmp_path / "metrics.jsonl", "gate")
    assert [g["action"] for g in gates] == ["train"] * 3 + ["skip", "train", "skip", "skip", "stop"]
    assert gates[-1]["reasons"][-1]["rule"] == "gate/consecutive_skips"


def test_patched_miles_loop_without_a_fault_never_gates(patched_miles: Path, tmp_path: Path) -> None:
    out = _drive(patched_miles, tmp_path, ["clean"] * 6)
    assert [e[1] for e in out["events"] if e[0] == "train"] == list(range(6))
    assert out["events"][-1] == ["dispose"]
