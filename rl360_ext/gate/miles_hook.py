"""The step gate inside Miles: `--custom-convert-samples-to-train-data-path`, the one hook that sees a
whole step before anything trains on it.

Owns `gated_train_data(args, samples) -> train_data`. At Miles 31f1ca96 `RolloutManager.generate`
logs the step (`log_rollout_data`, which runs rl360's `--custom-rollout-log-function-path` hook
and appends the step record to the rl360 metrics JSONL; miles/ray/rollout/rollout_manager.py:156)
and then converts the samples to train data (rollout_manager.py:157-163), calling this hook in
place of its own conversion (train_data_conversion.py:60-61; loaded at rollout_manager.py:92-94).
The hook reads that step record back (`rl360_ext.gate.evidence`), decides
(`rl360_ext.gate.rules.decide`), appends a `"kind": "gate"` record to the same JSONL, keeps the
gate's state in `<metrics path>.gate-state.json` (a resumed run keeps its baseline), and then:

- train: Miles' own conversion (`convert_samples_to_train_data` with no custom function, the
  `--custom-reward-post-process-path` hook loaded as Miles loads it), unchanged;
- skip, with patch 0011 (`patches/miles/`): `{STEP_ACTION_KEY: "skip", "sample_indices": ...}`;
  the patched loop trains nothing and pushes the unchanged weights. Without it, Miles has no way to
  drop an update from here: the train data comes back with every loss mask zeroed, so the step's
  gradient is zero, but the optimizer still steps (Adam's moments and weight decay move the
  weights) and the LR schedule advances: logged once as a warning;
- stop, with patch 0011: `{STEP_ACTION_KEY: "stop", ...}`; the patched loop saves a checkpoint
  and leaves its loop. Without it: `GateStop` is raised, which fails the generate call and ends
  the run without a checkpoint.

The guard (the weight observer's pattern): Miles' `convert_samples_to_train_data` must take the
parameters this hook passes, and the run must not use what the hook cannot hand on (unpatched Miles
calls the custom function without the step's `metadata`: `--use-dynamic-global-batch-size` and
multi-LoRA need it; 0011 passes it to a hook that names `metadata`); otherwise the first call
raises, naming what is missing. Runs in the
RolloutManager actor (one process: module state suffices).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from rl360_ext.errors import Rl360Error
from rl360_ext.gate.config import StepGate
from rl360_ext.gate.evidence import last_step_record, step_evidence
from rl360_ext.gate.rules import Action, GateState, GateVerdict, decide
from rl360_ext.rollout.metrics import append_records, attempt_summary, metrics_path
from rl360_ext.rollout.rewards import flatten_group

logger = logging.getLogger(__name__)

TESTED_MILES_COMMIT = "31f1ca961a94cb860cec3b2dea34ec332bfa8f76"
CONVERSION_MODULE = "miles.ray.rollout.train_data_conversion"
CONVERSION_PARAMETERS = (
    "args",
    "samples",
    "metadata",
    "custom_convert_samples_to_train_data_func",
    "custom_reward_post_process_func",
)
STATE_SUFFIX = ".gate-state.json"


class GateStop(Rl360Error, RuntimeError):
    """The gate stopped the run (Miles without patch 0011 has no clean way to stop from the hook)."""

    def __init__(self, verdict: GateVerdict) -> None:
        self.verdict = verdict
        super().__init__("rl360 step gate: stop: " + "; ".join(str(r) for r in verdict.reasons))


@dataclass
class _Gate:
    config: StepGate
    state: GateState
    state_path: Path | None
    last_rollout_id: Any = None
    warned: set[str] = field(default_factory=set)


_GATES: dict[Path | None, _Gate] = {}


def _gate(args: Any) -> _Gate:
    path = metrics_path(args)
    if path not in _GATES:
        state_path = None if path is None else path.with_name(path.name + STATE_SUFFIX)
        state = GateState()
        if state_path is not None and state_path.is_file():
            state = GateState.from_json(orjson.loads(state_path.read_bytes()))
        _GATES[path] = _Gate(StepGate.from_args(args), state, state_path)
    return _GATES[path]


def _miles_conversion(args: Any, metadata: Mapping[str, Any] | None) -> Any:
    """Miles' `convert_samples_to_train_data`, after the guard."""
    import importlib

    module = importlib.import_module(CONVERSION_MODULE)
    convert = module.convert_samples_to_train_data
    names = tuple(inspect.signature(convert).parameters)
    if names != CONVERSION_PARAMETERS:
        raise RuntimeError(
            f"rl360 step gate: {CONVERSION_MODULE}.convert_samples_to_train_data takes {names}, "
            f"expected {CONVERSION_PARAMETERS} (tested at Miles {TESTED_MILES_COMMIT[:8]})"
        )
    if metadata is None and getattr(args, "use_dynamic_global_batch_size", False):
        raise RuntimeError(
            "rl360 step gate: --use-dynamic-global-batch-size needs the step's metadata, which Miles "
            "hands --custom-convert-samples-to-train-data-path only with patch 0011"
        )
    if metadata is None and getattr(args, "multi_lora", False):
        raise RuntimeError("rl360 step gate: multi-LoRA needs the step's metadata: apply patch 0011")
    return module


def step_action_key() -> str | None:
    """The train-data key patch 0011 reads (`STEP_ACTION_KEY`), None on an unpatched Miles."""
    import importlib

    return getattr(importlib.import_module(CONVERSION_MODULE), "STEP_ACTION_KEY", None)


def _evidence(gate: _Gate, args: Any, samples: Sequence[Any]) -> tuple[Any, dict[str, Any]]:
    path = metrics_path(args)
    record = None if path is None else last_step_record(path)
    if record is None:
        _warn(gate, "no_record", "rl360 step gate: no rl360 step record (--rl360-metrics-path): no evidence")
        return None, {}
    rollout_id = record.get("rollout_id")
    if rollout_id is not None and rollout_id == gate.last_rollout_id:
        _warn(gate, "same_record", "rl360 step gate: the step record was not renewed this step: no evidence")
        return None, {}
    reward_key = getattr(args, "reward_key", None)
    tasks = [attempt_summary(sample, reward_key).get("task") for sample in samples]
    return rollout_id, step_evidence(record, tasks)


def _warn(gate: _Gate, key: str, message: str) -> None:
    if key not in gate.warned:
        gate.warned.add(key)
        logger.warning(message)


def _record(gate: _Gate, args: Any, rollout_id: Any, verdict: GateVerdict) -> None:
    if gate.state_path is not None:  # replaced whole, so a crash mid-write leaves the last state
        partial = gate.state_path.with_name(gate.state_path.name + ".partial")
        partial.write_bytes(orjson.dumps(verdict.state.to_json()))
        partial.replace(gate.state_path)
    path = metrics_path(args)
    if path is not None:
        append_records(path, [verdict.record(rollout_id)])
    level = logging.INFO if verdict.action is Action.TRAIN else logging.WARNING
    logger.log(
        level,
        "rl360 step gate, rollout %s: %s %s",
        rollout_id,
        verdict.action.value,
        "; ".join(str(r) for r in verdict.reasons),
    )


def gated_train_data(
    args: Any, samples: Sequence[Any], metadata: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Miles' `--custom-convert-samples-to-train-data-path` hook: `f(args, samples) -> train_data`
    (patch 0011 also hands it the step's `metadata`)."""
    module = _miles_conversion(args, metadata)
    gate = _gate(args)
    flat = flatten_group(samples)
    rollout_id, evidence = _evidence(gate, args, flat)
    verdict = decide(evidence, gate.state, gate.config)
    gate.state = verdict.state
    if rollout_id is not None:
        gate.last_rollout_id = rollout_id
    _record(gate, args, rollout_id, verdict)
    key = step_action_key()
    if verdict.action is not Action.TRAIN and key is not None:
        return {key: verdict.action.value, "sample_indices": [sample.index for sample in flat]}
    if verdict.action is Action.STOP:
        raise GateStop(verdict)
    post_process = None
    if (hook := getattr(args, "custom_reward_post_process_path", None)) is not None:
        from miles.utils.misc import load_function

        post_process = load_function(hook)
    data = module.convert_samples_to_train_data(
        args,
        flat,
        metadata=dict(metadata or {}),
        custom_convert_samples_to_train_data_func=None,
        custom_reward_post_process_func=post_process,
    )
    if verdict.action is Action.SKIP:
        _warn(
            gate,
            "masked_skip",
            "rl360 step gate: Miles without patch 0011 cannot drop an update; the "
            "skipped step trains with zero loss masks (the optimizer still steps)",
        )
        data["loss_masks"] = [[0] * len(mask) for mask in data["loss_masks"]]
        if "rollout_mask_sums" in data:
            data["rollout_mask_sums"] = [0] * len(data["rollout_mask_sums"])
    return data
