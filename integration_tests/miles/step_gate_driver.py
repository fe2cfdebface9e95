"""Runs Miles' own `train.py` loop and `RolloutManager.generate` (patched with 0011) with the rl360 step
gate as `--custom-convert-samples-to-train-data-path`; prints one JSON line of what happened.

Run by test_step_gate.py in a subprocess, with the patched Miles copy first on PYTHONPATH:
`python step_gate_driver.py METRICS_PATH PLAN` where PLAN is a comma-separated list of steps,
`clean` or `burst`, one per rollout. What is not Miles' code here, and why:
- the GPU side: placement groups, the Megatron actor (`FakeActor`: records `train`, `save_model`
  and `update_weights` calls, and reads the train data it is handed from the object store) and the
  SGLang engines (no `start_rollout_servers`: the rollout function is replaced by `_get_rollout_data`
  returning real `Sample`s from the plan, after rl360's filter judged each group);
- two modules that do not import on a CPU machine (torchvision, via SGLang's image processors):
  `miles.ray.rollout.rollout_server` and `miles.ray.rollout.server_group`, only imported for names;
- the object store: an in-process dict (Miles' backends are Ray and Mooncake).
Everything else is Miles' code: `train.train(args)`'s loop, `RolloutManager.generate`,
`log_rollout_data` (-> rl360's log hook), `convert_samples_to_train_data` (-> the gate hook), and
`remove_rollout_data_refs`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import types
from argparse import Namespace
from pathlib import Path
from typing import Any

HOOK = "rl360_ext.gate.miles_hook.gated_train_data"


def _stub(name: str, **attrs: Any) -> None:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module


_stub("miles.ray.rollout.rollout_server", RolloutServer=object, start_rollout_servers=None)
_stub("miles.ray.rollout.server_group", ServerGroup=object)

from miles.ray.rollout import rollout_manager  # noqa: E402
from miles.utils import object_store  # noqa: E402
from miles.utils.misc import load_function  # noqa: E402
from miles.utils.types import Sample  # noqa: E402

from rl360_ext.outcomes.infra import mark_infra_sample  # noqa: E402
from rl360_ext.outcomes.provenance import ATTEMPT_CLASS, REWARD_SOURCE, VALID  # noqa: E402
from rl360_ext.rollout.filters import check_valid_reward_nonzero_std  # noqa: E402

EVENTS: list[list[Any]] = []


class DictStore(object_store.BaseObjectStore):
    def __init__(self) -> None:
        self.values: dict[int, Any] = {}

    def put(self, value: Any, value_spec: Any = None) -> Any:
        key = len(self.values) + 1
        self.values[key] = value
        return object_store.Box(key)

    def get(self, ref: Any) -> Any:
        return object_store.ObjectStoreGetResult(value=self.values[ref.inner], release_fn=lambda _: None)

    def remove(self, ref: Any) -> None:
        self.values.pop(ref.inner)


def _sample(group: int, index: int, reward: float | None, infra: str | None = None) -> Sample:
    sample = Sample(
        group_index=group, index=index, prompt="p", tokens=[1, 2, 3, 4, 5, 6], response="xyz",
        response_length=3, loss_mask=[1, 1, 1], rollout_log_probs=[-0.5] * 3,
        status=Sample.Status.COMPLETED, metadata={},
    )  # fmt: skip
    if infra is None:
        sample.reward = reward
        sample.metadata[REWARD_SOURCE] = "verifier"
        sample.metadata[ATTEMPT_CLASS] = VALID
    else:
        sample.status = Sample.Status.FAILED
        mark_infra_sample(sample, infra)
    return sample


def _groups(kind: str, rollout_id: int) -> list[list[Sample]]:
    """4 groups of 4: clean (rewards 1, 0, 1, 0) or a burst (2 of 4 lost to the sandbox in each)."""
    base = rollout_id * 100
    groups = []
    for g in range(4):
        if kind == "clean":
            group = [_sample(g, base + 4 * g + i, float(i % 2 == 0)) for i in range(4)]
        else:
            group = [_sample(g, base + 4 * g, 1.0), _sample(g, base + 4 * g + 1, 0.0)]
            group += [_sample(g, base + 4 * g + i, None, "sandbox_lost") for i in (2, 3)]
        groups.append(group)
    return groups


class FakeActor:
    async def train(self, rollout_id: int, pack: dict[str, Any]) -> None:
        with object_store.get_instance().get(pack["data_ref"]) as data:
            assert data["dynamic_global_batch_size"] == 16  # the step's metadata reached the hook
            EVENTS.append(["train", rollout_id, sum(map(sum, data["loss_masks"]))])

    async def save_model(self, rollout_id: int, force_sync: bool = False) -> None:
        EVENTS.append(["save", rollout_id])

    async def update_weights(self, rollout_id: int | None = None) -> None:
        EVENTS.append(["update_weights", rollout_id])

    async def clear_memory(self) -> None:
        return None


class Remote:
    """An awaitable `.remote(...)` over a local coroutine function, as Ray's actor handles are used."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def _manager(args: Namespace, plan: list[str]) -> Any:
    cls = rollout_manager.RolloutManager.__ray_metadata__.modified_class
    manager = object.__new__(cls)
    manager.args = args
    manager.servers = {}
    manager.data_source = None
    manager._rollout_ft_enabled = False
    manager._health_monitors = []
    manager.custom_reward_post_process_func = load_function(args.custom_reward_post_process_path)
    convert = load_function(args.custom_convert_samples_to_train_data_path)
    manager.custom_convert_samples_to_train_data_func = convert

    async def get_rollout_data(rollout_id: int) -> Any:
        groups = _groups(plan[rollout_id], rollout_id)
        kept = [g for g in groups if check_valid_reward_nonzero_std(args, g).keep]
        EVENTS.append(["generate", rollout_id])
        return [s for g in kept for s in g], {"dynamic_global_batch_size": 16}, {}

    manager._get_rollout_data = get_rollout_data

    async def generate(rollout_id: int) -> Any:
        return await cls.generate(manager, rollout_id)

    async def noop(*_: Any, **__: Any) -> None:
        return None

    async def dispose() -> None:
        EVENTS.append(["dispose"])

    async def save(rollout_id: int) -> None:
        EVENTS.append(["rollout_save", rollout_id])

    return types.SimpleNamespace(
        generate=Remote(generate), dispose=Remote(dispose), save=Remote(save), eval=Remote(noop),
        onload_weights=Remote(noop), onload_kv=Remote(noop), offload=Remote(noop),
    )  # fmt: skip


def main() -> None:
    metrics_path, plan = Path(sys.argv[1]), sys.argv[2].split(",")
    args = Namespace(
        num_rollout=len(plan), start_rollout_id=0, rollout_batch_size=4, n_samples_per_prompt=4,
        global_batch_size=16, use_dynamic_global_batch_size=True, delay_split_train_data_by_dp=True,
        fully_async=False, control_server_port=None, offload_rollout=False, offload_train=False,
        check_weight_update_equal=False, eval_interval=None, skip_eval_before_train=True,
        use_critic=False, save="/unused", save_interval=None, save_trigger_sentinel=None,
        debug_exit_after_rollout=None, ci_test=False, debug_train_only=True, object_store_backend="ray",
        custom_convert_samples_to_train_data_path=HOOK,
        custom_reward_post_process_path="rl360_ext.rollout.rewards.valid_group_advantages",
        custom_rollout_log_function_path="rl360_ext.rollout.metrics.log_rollout_metrics",
        dynamic_sampling_filter_path="rl360_ext.rollout.filters.check_valid_reward_nonzero_std",
        rl360_metrics_path=str(metrics_path), rl360_metrics_attempts=False, reward_key=None,
        advantage_estimator="grpo", rewards_normalization=True, grpo_std_normalization=True,
        save_debug_rollout_data=None, load_debug_rollout_data=None, save_debug_trajectory_data=None,
        use_wandb=False, use_tensorboard=False, wandb_always_use_train_step=False,
        log_reward_category=None, sglang_speculative_algorithm=None, rollout_num_gpus=None,
        mini_ft_controller_enable=None,
    )  # fmt: skip
    train_py = Path(rollout_manager.__file__).parents[3] / "train.py"
    spec = importlib.util.spec_from_file_location("miles_train", train_py)
    assert spec is not None and spec.loader is not None
    train_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_module)
    store = DictStore()
    object_store._create_instance = lambda *_, **__: store
    actor = FakeActor()
    train_module.create_placement_groups = lambda args: {"rollout": None}
    train_module.create_rollout_manager = lambda args, pg: (_manager(args, plan), len(plan))

    async def create_training_models(args: Any, pgs: Any, manager: Any) -> Any:
        return actor, None

    train_module.create_training_models = create_training_models
    train_module.init_tracking = lambda args: None
    asyncio.run(train_module.train(args))
    print(json.dumps({"events": EVENTS, "objects_left": len(store.values)}))


if __name__ == "__main__":
    main()
