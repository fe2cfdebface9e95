"""Observed weight pushes inside Miles: its updaters record rl360's `weights/*` fields per push.

Owns the observer that Miles loads through `--custom-megatron-init-path
rl360_ext.weights.miles_observer.install`: Miles calls `install(args)` on every training rank at
the end of `miles.backends.megatron_utils.initialize.init` (initialize.py:129-133 at Miles
31f1ca96), before `MegatronTrainRayActor.init` builds its `weight_updater` (actor.py:253-272), so
the observer wraps the updater *classes*: `UpdateWeightFromDistributed` (broadcast),
`UpdateWeightP2P` (p2p), `UpdateWeightFromDiskDelta` (disk-delta) and `UpdateWeightFromTensor`
(from-tensor). Per push (an `update_weights` call that advanced `weight_version`) it records the
fields rl360's own pushes report (`rl360_ext.weights.push.FencedPush.metrics`): path, reason
(`push_reason`: first, new_engines, stale, retry, steady), engines expected and reached (reached:
the engines whose `get_weight_version` reads the pushed version afterwards), the most update
calls per engine (transfer calls this rank sent to each engine: buckets for broadcast and p2p,
chunks for from-tensor, one reload for disk-delta), pause and duration seconds, and whether the
calls per engine exceed the path's rolling median (`is_degraded`). The metrics go, as numbers
(`MilesPush.logged_metrics`: path and reason one-hot), into the updater's
`update_weight_metrics`, which Miles drains with `pop_metrics()` into `log_perf_data`
at the end of the next training step (actor.py:616); the engine ids reached are in `PUSHES` and
in one log line per push. Only the rank that logs (`log_perf_data`'s primary rank:
log_utils.py:413-417) reads engine versions back.

The guard: every class must exist with the methods the wrappers and the actor rely on, and
`connect_rollout_engines` must take `rollout_engines` first; otherwise one warning names every
mismatch and nothing is installed (training goes on unobserved). A class whose module does not
import for want of a third-party package (disk-delta needs zstandard) cannot be chosen in this
process and is skipped. It changes nothing about how Miles pushes: wrappers call the original
method and re-raise its errors.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rl360_ext.weights.push import VERSION_READ_S, is_degraded, push_reason

logger = logging.getLogger(__name__)

TESTED_MILES_COMMIT = "31f1ca961a94cb860cec3b2dea34ec332bfa8f76"
_PACKAGE = "miles.backends.megatron_utils.update_weight"
REQUIRED_METHODS = (
    "update_weights",
    "connect_rollout_engines",
    "is_rollout_engines_fresh",
    "mark_engine_connection_stale",
    "pop_metrics",
)
_MARK = "__rl360_observed__"
_STATE = "_rl360_push_state"
PUSHES_KEPT = 256


@dataclass(frozen=True)
class UpdaterSpec:
    """One Miles updater class and how a push through it is measured."""

    module: str
    name: str
    path: str  # weights/path
    transfer: str  # one call = one update call to every engine
    pause: tuple[str, str] | None  # (starts the pause, ends the resume); None: the whole push

    def methods(self) -> tuple[str, ...]:
        return (*REQUIRED_METHODS, self.transfer, *(self.pause or ()))


UPDATERS = (
    UpdaterSpec(
        f"{_PACKAGE}.update_weight_from_distributed.broadcast",
        "UpdateWeightFromDistributed",
        "miles:broadcast",
        "_update_weight_implementation",
        ("_pause_and_prepare_engines", "_finalize_and_resume_engines"),
    ),
    UpdaterSpec(
        f"{_PACKAGE}.update_weight_from_distributed.p2p",
        "UpdateWeightP2P",
        "miles:p2p",
        "_update_weight_implementation",
        ("_pause_and_prepare_engines", "_finalize_and_resume_engines"),
    ),
    UpdaterSpec(
        f"{_PACKAGE}.update_weight_from_distributed.delta",
        "UpdateWeightFromDiskDelta",
        "miles:disk-delta",
        "_reload_engines",
        ("_reload_engines", "_reload_engines"),
    ),
    UpdaterSpec(
        f"{_PACKAGE}.update_weight_from_tensor",
        "UpdateWeightFromTensor",
        "miles:from-tensor",
        "_send_base_params",
        None,
    ),
)


@dataclass
class MilesPush:
    """One push through a Miles updater, as recorded on the logging rank."""

    path: str
    reason: str
    weight_version: str
    engines_expected: list[str]
    engines_reached: list[str]
    calls_per_engine_max: int
    pause_s: float | None
    duration_s: float
    degraded: bool
    error: str | None = None  # the push raised this (the record of a failed push is not logged to Miles)

    def metrics(self) -> dict[str, Any]:
        """The push's `weights/*` metrics, the keys rl360's own pushes log."""
        return {
            "weights/path": self.path,
            "weights/reason": self.reason,
            "weights/engines_expected": len(self.engines_expected),
            "weights/engines_reached": len(self.engines_reached),
            "weights/calls_per_engine_max": self.calls_per_engine_max,
            "weights/pause_s": self.pause_s,
            "weights/duration_s": self.duration_s,
            "weights/degraded": self.degraded,
        }

    def logged_metrics(self) -> dict[str, float]:
        """What goes into Miles' step log: numbers only, since its trackers take scalars
        (tensorboard's `add_scalar` per key: `miles/utils/tracking_utils/tensorboard_utils.py`).
        Path and reason are one-hot keys (`weights/path/<path>`, `weights/reason/<reason>`: 1.0),
        `degraded` is 0.0 or 1.0, and an unmeasured pause is left out."""
        logged: dict[str, float] = {
            f"weights/path/{self.path}": 1.0,
            f"weights/reason/{self.reason}": 1.0,
            "weights/degraded": float(self.degraded),
        }
        for key, value in self.metrics().items():
            if isinstance(value, int | float) and not isinstance(value, bool) and key not in logged:
                logged[key] = value
        return logged


PUSHES: deque[MilesPush] = deque(maxlen=PUSHES_KEPT)  # this process's pushes, oldest first


@dataclass
class _PushState:
    """Per updater instance: what the next push's reason and degradation depend on."""

    previous_engines: list[str] | None = None  # the engines of the last push that succeeded
    failed: bool = False  # the last push raised
    history: list[float] = field(default_factory=list)  # calls_per_engine_max of earlier pushes
    calls: Counter[str] = field(default_factory=Counter)  # this push's update calls per engine
    pause_started: float | None = None
    pause_s: float | None = None


def engine_id(engine: Any) -> str:
    """A Ray actor handle's actor id (hex): the same engine across calls, a new one after a restart."""
    actor_id = getattr(engine, "_actor_id", None)
    return actor_id.hex() if actor_id is not None else repr(engine)


def read_versions(engines: Sequence[Any], timeout_s: float = VERSION_READ_S) -> dict[str, str | None]:
    """Each engine's `get_weight_version` (a str), None for one that fails or is silent `timeout_s`."""
    if not engines:
        return {}
    import ray

    refs = {engine_id(engine): engine.get_weight_version.remote() for engine in engines}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    done = set(ready)
    versions: dict[str, str | None] = {}
    for key, ref in refs.items():
        try:
            value = ray.get(ref) if ref in done else None
        except Exception:  # a dead or failing engine reads as not reached
            value = None
        versions[key] = None if value is None else str(value)
    return versions


def is_logging_rank() -> bool:
    """The rank whose metrics Miles logs: `log_perf_data`'s primary rank (tp 0, last pipeline
    stage, data-parallel rank 0; log_utils.py:413-417)."""
    from miles.backends.training_utils.parallel import get_parallel_state

    state = get_parallel_state()
    return state.tp.rank == 0 and bool(state.is_pp_last_stage) and state.effective_dp_cp.rank == 0


def check_updater(cls: type, spec: UpdaterSpec) -> list[str]:
    """What about `cls` the observer does not expect (empty: it can be observed)."""
    problems = [
        f"{spec.name}.{method} is missing"
        for method in spec.methods()
        if not callable(getattr(cls, method, None))
    ]
    connect = getattr(cls, "connect_rollout_engines", None)
    if callable(connect):
        params = list(inspect.signature(connect).parameters)
        if params[1:2] != ["rollout_engines"]:
            problems.append(f"{spec.name}.connect_rollout_engines{params}: rollout_engines is not first")
    return problems


def resolve(specs: Sequence[UpdaterSpec] = UPDATERS) -> tuple[list[tuple[UpdaterSpec, type]], list[str]]:
    """The classes to observe, and every mismatch with what the observer expects. A module that
    fails to import on a third-party package is skipped (that updater cannot run here); a missing
    Miles module or class is a mismatch."""
    found: list[tuple[UpdaterSpec, type]] = []
    problems: list[str] = []
    for spec in specs:
        try:
            module = importlib.import_module(spec.module)
        except ImportError as error:
            missing = getattr(error, "name", None) or ""
            if missing == "miles" or missing.startswith("miles."):
                problems.append(f"{spec.module} does not import: {error}")
            else:
                logger.info("rl360 weight observer: %s not observed here: %s", spec.name, error)
            continue
        cls = getattr(module, spec.name, None)
        if not isinstance(cls, type):
            problems.append(f"{spec.module}.{spec.name} is not a class")
            continue
        problems += check_updater(cls, spec)
        found.append((spec, cls))
    return found, problems


def _state(updater: Any) -> _PushState:
    state = updater.__dict__.get(_STATE)
    if state is None:
        state = updater.__dict__[_STATE] = _PushState()
    return state


def _wrap(cls: type, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    original = getattr(cls, name)
    wrapper = functools.wraps(original)(make(original))
    setattr(wrapper, _MARK, True)
    setattr(cls, name, wrapper)


def _observe_push(spec: UpdaterSpec) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def update_weights(self: Any, *args: Any, **kwargs: Any) -> Any:
            state = _state(self)
            engines = list(getattr(self, "rollout_engines", None) or [])
            ids = [engine_id(engine) for engine in engines]
            logs = is_logging_rank()
            published = str(self.weight_version)
            needs_versions = logs and state.previous_engines is not None and not state.failed
            before = read_versions(engines) if needs_versions else {}  # only `stale` reads them
            reason = push_reason(int(state.failed), state.previous_engines, ids, before, published)
            state.calls, state.pause_started, state.pause_s = Counter(), None, None
            started = time.perf_counter()
            try:
                result = original(self, *args, **kwargs)
            except BaseException as error:
                state.failed = True
                if logs:
                    _record(self, spec, state, reason, ids, started, error=f"{type(error).__name__}: {error}")
                raise
            if str(self.weight_version) == published:  # not a push (disk-delta's baseline capture)
                return result
            state.failed = False
            if logs:
                push = _record(self, spec, state, reason, ids, started)
                self.__dict__.setdefault("update_weight_metrics", {}).update(push.logged_metrics())
            state.previous_engines = ids
            return result

        return update_weights

    return make


def _record(
    updater: Any,
    spec: UpdaterSpec,
    state: _PushState,
    reason: str,
    ids: list[str],
    started: float,
    error: str | None = None,
) -> MilesPush:
    duration = time.perf_counter() - started
    version = str(updater.weight_version)
    engines = list(getattr(updater, "rollout_engines", None) or [])
    reached = sorted(key for key, value in read_versions(engines).items() if value == version)
    calls_max = max((state.calls[key] for key in ids), default=0)
    push = MilesPush(
        path=spec.path,
        reason=reason,
        weight_version=version,
        engines_expected=sorted(ids),
        engines_reached=reached,
        calls_per_engine_max=calls_max,
        pause_s=duration if spec.pause is None else state.pause_s,
        duration_s=duration,
        degraded=is_degraded(calls_max, state.history),
        error=error,
    )
    if error is None:
        state.history.append(calls_max)
    PUSHES.append(push)
    line = json.dumps(asdict(push), default=str)
    (logger.warning if error or len(reached) < len(ids) else logger.info)("rl360 weight push: %s", line)
    return push


def _observe_transfer(original: Callable[..., Any]) -> Callable[..., Any]:
    def transfer(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls = _state(self).calls
        for engine in list(getattr(self, "rollout_engines", None) or []):
            calls[engine_id(engine)] += 1
        return original(self, *args, **kwargs)

    return transfer


def _observe_pause_start(original: Callable[..., Any]) -> Callable[..., Any]:
    def pause(self: Any, *args: Any, **kwargs: Any) -> Any:
        _state(self).pause_started = time.perf_counter()
        return original(self, *args, **kwargs)

    return pause


def _observe_pause_end(original: Callable[..., Any]) -> Callable[..., Any]:
    def resume(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        state = _state(self)
        if state.pause_started is not None:
            state.pause_s = time.perf_counter() - state.pause_started
        return result

    return resume


def _observe_bracket(original: Callable[..., Any]) -> Callable[..., Any]:
    return _observe_pause_end(_observe_pause_start(original))


def observe(cls: type, spec: UpdaterSpec) -> None:
    """Wrap `cls`'s push, transfer and pause methods (once; a second call changes nothing)."""
    if getattr(cls.__dict__.get("update_weights"), _MARK, False):
        return
    _wrap(cls, "update_weights", _observe_push(spec))
    _wrap(cls, spec.transfer, _observe_transfer)
    if spec.pause is not None:
        start, end = spec.pause
        if start == end:  # one method pauses and resumes (disk-delta's reload)
            _wrap(cls, start, _observe_bracket)
        else:
            _wrap(cls, start, _observe_pause_start)
            _wrap(cls, end, _observe_pause_end)


def install(args: Any = None) -> bool:
    """The `--custom-megatron-init-path` hook: observe every Miles updater class, or, when one is
    not what this observer expects, warn once and observe none. Returns whether it installed."""
    found, problems = resolve()
    if problems:
        logger.warning(
            "rl360 weight observer NOT installed (weight pushes are not observed; training is "
            "unaffected): Miles' updaters differ from commit %s: %s",
            TESTED_MILES_COMMIT[:12],
            "; ".join(problems),
        )
        return False
    for spec, cls in found:
        observe(cls, spec)
    logger.info("rl360 weight observer installed on %s", ", ".join(spec.name for spec, _ in found))
    return True
