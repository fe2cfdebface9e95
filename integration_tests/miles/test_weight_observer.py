"""rl360's weight-push observer on Miles' own broadcast updater, pushing to Miles' mock engines on a
local Ray while engines are killed and replaced mid-run.

What is Miles' own: `install` through Miles' `load_function` (as `--custom-megatron-init-path`
loads it, initialize.py:129-133), `UpdateWeightFromDistributed` (its constructor,
`connect_rollout_engines`, the mixin's `update_weights`: pause, bucket transfers under the
rollout `Lock` actor, version update, resume), `update_weights_from_distributed` (one Ray call
per engine per bucket, then `dist.broadcast`), and `MockSGLangEngine`
(`miles/utils/test_utils/mock_sglang_engine.py`), extended here only to serve the weight version
it was last given, as SGLang does. What stands in, because it needs GPUs: the NCCL group (a
one-process gloo group; `connect_rollout_engines_from_distributed` is replaced by one that only
sends each engine its `init_weights_update_group` call) and the model's buckets (three fixed
tensors instead of Megatron's gathered parameters). The driver steps follow
`MegatronTrainRayActor.update_weights` (actor.py:748-778): reconnect when there are new engines
or the connection is stale, then `update_weights`.
"""

from __future__ import annotations

import os
import socket
import sys
from argparse import Namespace
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.slow

BUCKETS = 3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module", autouse=True)
def megatron_on_path() -> None:
    """Miles' updater modules import Megatron-core (the updaters' common.py)."""
    src = os.environ.get("MEGATRON_SRC")
    if not src:
        if os.environ.get("RL360_MILES_STRICT") == "1":
            raise pytest.UsageError("MEGATRON_SRC is not set: Miles' weight updaters import Megatron-core")
        pytest.skip(
            "MEGATRON_SRC is not set: Miles' weight updaters import Megatron-core; run run.sh with it"
        )
    if src not in sys.path:
        sys.path.append(src)


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


@pytest.fixture
def gloo_world(monkeypatch: pytest.MonkeyPatch, parallel_state: Any) -> Iterator[None]:
    """A one-process gloo world: Miles' barriers, `dist.get_rank()` and the broadcast run on it."""
    import miles.utils.distributed_utils as distributed_utils
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    monkeypatch.setattr(distributed_utils, "GLOO_GROUP", dist.group.WORLD)
    yield
    dist.destroy_process_group()


@pytest.fixture
def observed_classes() -> Iterator[None]:
    """The observer installed through Miles' `load_function`; the classes restored afterwards."""
    from miles.utils.misc import load_function

    from rl360_ext.weights import miles_observer

    found, problems = miles_observer.resolve()
    assert problems == [], problems
    saved = [(cls, {name: cls.__dict__.get(name) for name in spec.methods()}) for spec, cls in found]
    miles_observer.PUSHES.clear()
    assert load_function("rl360_ext.weights.miles_observer.install")(Namespace()) is True
    yield
    for cls, methods in saved:
        for name, method in methods.items():
            if cls.__dict__.get(name) is method:  # not wrapped
                continue
            if method is None:  # inherited: drop the wrapper the observer set on the class
                delattr(cls, name)
            else:
                setattr(cls, name, method)
    miles_observer.PUSHES.clear()


def _engine_class() -> Any:
    import ray
    from miles.utils.test_utils.mock_sglang_engine import MockSGLangEngine

    base = MockSGLangEngine.__ray_actor_class__

    class VersionedMockEngine(base):  # type: ignore[misc, valid-type]
        """Miles' mock engine, serving the weight version it was last given (as SGLang does)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.version = "default"

        def update_weight_version(self, weight_version: str) -> None:
            base.update_weight_version(self, weight_version=weight_version)
            self.version = weight_version

        def get_weight_version(self) -> str:
            self._record("get_weight_version", (), {})
            return self.version

    return ray.remote(num_cpus=0)(VersionedMockEngine)


def _connect_without_nccl(args: Any, group_name: str, rollout_engines: list[Any], *_: Any) -> None:
    """What `connect_rollout_engines_from_distributed` sends each engine, without the NCCL group:
    the broadcast then runs on the default (gloo, one process) group."""
    import ray

    ray.get(
        [
            e.init_weights_update_group.remote("127.0.0.1", 0, i + 1, 0, group_name)
            for i, e in enumerate(rollout_engines)
        ]
    )


def _push(updater: Any, engines: list[Any], new_engines: bool) -> None:
    """The steps of `MegatronTrainRayActor.update_weights` (actor.py:748-778) that reach the updater."""
    if new_engines or not updater.is_rollout_engines_fresh():
        updater.connect_rollout_engines(engines, updater.rollout_engine_lock)
    updater.update_weights()


def test_observer_follows_engines_killed_and_replaced_mid_run(
    local_ray: None, gloo_world: None, observed_classes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray
    import torch
    from miles.backends.megatron_utils.update_weight.update_weight_from_distributed import broadcast
    from miles.ray.utils import Lock
    from ray.exceptions import RayActorError

    from rl360_ext.weights.miles_observer import PUSHES, engine_id
    from rl360_ext.weights.push import FIRST, NEW_ENGINES, RETRY, STEADY

    monkeypatch.setattr(broadcast, "connect_rollout_engines_from_distributed", _connect_without_nccl)
    args = Namespace(
        pause_generation_mode="in_place", rollout_num_gpus_per_engine=1, update_weight_buffer_size=1 << 20
    )
    updater = broadcast.UpdateWeightFromDistributed(
        args, [], weights_getter=dict, model_name="qwen2", quantization_config=None
    )
    updater.rollout_engine_lock = Lock.options(num_cpus=0).remote()

    def buckets(transfer: Any, pbar: Any = None) -> None:
        for i in range(BUCKETS):
            transfer([(f"model.layers.{i}.mlp.weight", torch.full((4,), float(i)))], pbar)

    updater._gather_and_update_non_expert_weights = buckets
    updater._gather_and_update_expert_weights = lambda transfer, pbar=None: None
    Engine = _engine_class()
    e0, e1 = Engine.remote(None, rank=0), Engine.remote(None, rank=1)

    _push(updater, [e0, e1], new_engines=True)
    first = updater.pop_metrics()
    assert first["weights/path/miles:broadcast"] == 1.0
    assert first[f"weights/reason/{FIRST}"] == 1.0
    assert (first["weights/engines_expected"], first["weights/engines_reached"]) == (2, 2)
    assert first["weights/calls_per_engine_max"] == BUCKETS
    assert 0 < first["weights/pause_s"] <= first["weights/duration_s"]
    assert first["weights/degraded"] == 0.0

    _push(updater, [e0, e1], new_engines=False)
    assert updater.pop_metrics()[f"weights/reason/{STEADY}"] == 1.0

    ray.kill(e0)  # engine 0 dies between pushes; Miles' recovery starts a replacement
    e2 = Engine.remote(None, rank=0)
    _push(updater, [e2, e1], new_engines=True)
    replaced = updater.pop_metrics()
    assert replaced[f"weights/reason/{NEW_ENGINES}"] == 1.0
    assert PUSHES[-1].engines_reached == sorted([engine_id(e2), engine_id(e1)])
    assert engine_id(e0) not in PUSHES[-1].engines_expected
    calls = [name for name, _, _ in ray.get(e2.get_calls.remote())]
    assert calls.count("update_weights_from_distributed") == BUCKETS  # what calls_per_engine_max counted
    assert replaced["weights/calls_per_engine_max"] == BUCKETS

    ray.kill(e1)  # engine 1 dies before the next push reaches it: the push fails
    with pytest.raises(RayActorError):
        _push(updater, [e2, e1], new_engines=False)
    failed = PUSHES[-1]
    assert failed.error is not None and engine_id(e1) not in failed.engines_reached
    assert updater.pop_metrics() == {}  # a failed push is not logged as one

    e3 = Engine.remote(None, rank=1)
    _push(updater, [e2, e3], new_engines=True)
    retried = updater.pop_metrics()
    assert retried[f"weights/reason/{RETRY}"] == 1.0
    assert PUSHES[-1].engines_reached == sorted([engine_id(e2), engine_id(e3)])
    assert [p.weight_version for p in PUSHES] == ["1", "2", "3", "4", "5"]
