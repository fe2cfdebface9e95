"""A version-aware data buffer for Miles' fully-async rollout: `--custom-async-data-buffer-path`.

Miles' contract (radixark/miles 31f1ca96, `miles/rollout/fully_async_data_buffer.py`): a class
constructed with `DataBufferConstructorInput(args, unused_handler_fn)`, with `async put(input:
DataBufferInput)` (a finished group and its prompt group), `async get(current_version=None,
**context) -> DataBufferInput` (one group to train on; `FullyAsyncRolloutFn._next_group` passes the
rollout manager's engine weight version) and `get_metrics() -> dict` (once per training step,
window counters reset there). `FullyAsyncRolloutFn.__call__` (`miles/rollout/fully_async_rollout.py`)
loads it with `load_function(args.custom_async_data_buffer_path)` and it "takes over
dataflow/staleness control". `unused_handler_fn` is `--async-unused-samples-handler`: `retry`
recycles the prompt group into the data source (`FullyAsyncRolloutFn._recycle`), `drop` ignores it.

Owns `VersionAwareDataBuffer`, its settings (`VersionBufferConfig`, `--rl360-<field>` flags or
`RL360_<FIELD>`), and the pure decisions it makes from the per-token version arrays
(`sglang.versions`, `metadata[VERSIONS_KEY]`): `oldest_token_version` of a group, `judge_group`,
`mask_stale_tokens`. Put, capacity, aborted-group and dynamic-filter handling stay Miles'
`DefaultDataBuffer`'s, which this class wraps; on get it judges each group Miles hands out:

- a group whose oldest trained output token (a loss-masked-in response token with a version) is
  more than `max_token_age` (K, default 4) versions behind `current_version` is not trained:
  `requeue` hands its prompt group to Miles' unused handler (regenerated under `retry`), `drop`
  discards it. Each such group is logged as a structured `stale_group` record (logger, and the
  rl360 metrics JSONL when `--rl360-metrics-path` / $RL360_METRICS_PATH is set) and counted.
- with `mask_token_age` (k) set, a kept group's trained tokens more than k versions behind get
  loss mask 0. Miles computes `rollout_mask_sums` from the loss masks after the rollout function
  returns (`convert_samples_to_train_data`) and rl360's reducers (`rl360_ext.train.reducers`)
  divide by `mask.sum()`, so a masked token leaves both the numerator and the denominator; a
  sample left with no trained token is an invalid sample for rl360's reducers and TIS metrics
  (Miles' default reducer still counts it in its sample normalizer).

Groups without version arrays pass unjudged (counted), as Miles passes a group without a numeric
weight version. `get_metrics` adds the buffer's counters and the `staleness/*`, `kv/*`, `r3/*`
metrics (`rl360_ext.train.staleness`) of the groups it handed out, aged at their get's version.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from rl360_ext.rollout.config import MetricsConfig, add_dataclass_arguments, env_name, flag_dest
from rl360_ext.rollout.metrics import append_records
from rl360_ext.rollout.rewards import flatten_group
from rl360_ext.sglang.versions import UNVERSIONED
from rl360_ext.train.staleness import TrainedSample, staleness_metrics, trained_sample

logger = logging.getLogger(__name__)

REQUEUE = "requeue"
DROP = "drop"
STALE_ACTIONS = (REQUEUE, DROP)
STALE_GROUP_KIND = "stale_group"  # metrics JSONL record kind of a group the buffer did not train
TOKEN_AGE_EXCEEDED = "oldest_token_age_exceeds_max"
METRIC_PREFIX = "rollout/fully_async/rl360/"
MAX_RECENT_RECORDS = 256


@dataclass(frozen=True)
class VersionBufferConfig:
    """Settings of `VersionAwareDataBuffer`; every field is `--rl360-<field>` or `RL360_<FIELD>`."""

    max_token_age: int = field(
        default=4,
        metadata={
            "help": "K: a group whose oldest trained output token is more than K policy versions "
            "behind the current one is not trained."
        },
    )
    stale_group_action: str = field(
        default=REQUEUE,
        metadata={
            "help": "What happens to a group beyond --rl360-max-token-age: 'requeue' hands its prompts "
            "to Miles' --async-unused-samples-handler (regenerated under retry), 'drop' discards it.",
            "choices": STALE_ACTIONS,
        },
    )
    mask_token_age: int | None = field(
        default=None,
        metadata={
            "help": "k: in the groups kept, loss-mask out trained tokens more than k versions behind "
            "(the loss denominators follow the mask). Unset: no token masking."
        },
    )

    def __post_init__(self) -> None:
        if self.max_token_age < 0:
            raise ValueError(f"--rl360-max-token-age (max_token_age) must be >= 0, got {self.max_token_age}")
        if self.stale_group_action not in STALE_ACTIONS:
            raise ValueError(
                f"--rl360-stale-group-action (stale_group_action) must be one of {STALE_ACTIONS}, "
                f"got {self.stale_group_action!r}"
            )
        if self.mask_token_age is not None and self.mask_token_age < 0:
            raise ValueError(
                f"--rl360-mask-token-age (mask_token_age) must be >= 0, got {self.mask_token_age}"
            )

    @classmethod
    def from_args(cls, args: Any, environ: Mapping[str, str] | None = None) -> VersionBufferConfig:
        """Each field from its flag in Miles' args, else `RL360_<FIELD>`, else its default."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for spec in fields(cls):
            value = getattr(args, flag_dest(spec.name), None)
            text = env.get(env_name(spec.name))
            if value is None and text:
                if spec.name == "stale_group_action":
                    value = text.strip()
                else:
                    try:
                        value = int(text)
                    except ValueError:
                        raise ValueError(f"${env_name(spec.name)} must be an integer, got {text!r}") from None
            if value is not None:
                values[spec.name] = value
        return cls(**values)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The buffer's `--rl360-*` flags (call from a generate function's `add_arguments`)."""
    group = parser.add_argument_group("rl360 version-aware data buffer (rl360_ext.rollout.version_buffer)")
    add_dataclass_arguments(group, VersionBufferConfig)


# ---- pure decisions ----------------------------------------------------------------------------


def _trained(samples: Iterable[Any]) -> list[TrainedSample]:
    trained = []
    for position, sample in enumerate(samples):
        item = trained_sample(sample, f"group[{position}]")
        if item is not None:
            trained.append(item)
    return trained


def oldest_token_version(group: Any) -> int | None:
    """The oldest version among the group's trained output tokens; None when none carries one."""
    oldest: int | None = None
    for item in _trained(flatten_group(group)):
        token = item.versions.token_version[item.trained_positions]
        token = token[token != UNVERSIONED]
        if len(token):
            low = int(token.min())
            oldest = low if oldest is None else min(oldest, low)
    return oldest


@dataclass(frozen=True)
class Verdict:
    """What `judge_group` decided: keep or not, and the facts it decided on."""

    keep: bool
    oldest_token_version: int | None
    token_age: int | None  # current version - oldest token version; None when either is unknown
    reason: str | None = None


def judge_group(group: Any, current_version: int | None, config: VersionBufferConfig) -> Verdict:
    """Keep a group unless its oldest trained output token is more than K versions behind."""
    oldest = oldest_token_version(group)
    if oldest is None or current_version is None:
        return Verdict(True, oldest, None)
    age = current_version - oldest
    if age > config.max_token_age:
        return Verdict(False, oldest, age, TOKEN_AGE_EXCEEDED)
    return Verdict(True, oldest, age)


def mask_stale_tokens(sample: Any, current_version: int, max_age: int) -> int:
    """Set loss mask 0 on the sample's trained tokens more than `max_age` versions behind
    `current_version`; the number of tokens masked. A sample without version arrays is left alone."""
    item = trained_sample(sample)
    if item is None:
        return 0
    positions = item.trained_positions
    token = item.versions.token_version[positions]
    stale = (token != UNVERSIONED) & (current_version - token > max_age)
    if not stale.any():
        return 0
    mask = np.array(item.loss_mask, copy=True)
    mask[positions[stale] - item.prompt_length] = 0
    current = sample.loss_mask
    if isinstance(current, np.ndarray):
        sample.loss_mask = mask.astype(current.dtype)
    else:
        sample.loss_mask = [int(v) for v in mask]
    return int(stale.sum())


# ---- the Miles buffer ----------------------------------------------------------------------------


def _miles_default_buffer(input: Any) -> Any:
    try:
        from miles.rollout.fully_async_data_buffer import DefaultDataBuffer
    except ImportError as error:
        raise RuntimeError(
            "VersionAwareDataBuffer wraps Miles' DefaultDataBuffer (miles.rollout.fully_async_data_buffer), "
            "which is not importable here; pass `inner=` to use another buffer"
        ) from error
    return DefaultDataBuffer(input)


@dataclass
class _Window:
    """Counters and handed-out samples since the last `get_metrics`."""

    groups_consumed: int = 0
    groups_unversioned: int = 0
    groups_stale_requeued: int = 0
    groups_stale_dropped: int = 0
    tokens_masked: int = 0
    samples_fully_masked: int = 0
    consumed: list[TrainedSample] = field(default_factory=list)
    consumed_versions: list[int] = field(default_factory=list)


class VersionAwareDataBuffer:
    """Miles' fully-async data buffer, judging each group by its per-token versions on get."""

    def __init__(self, input: Any, inner: Any | None = None) -> None:
        self._args = input.args
        self._handle_unused = input.unused_handler_fn
        self.config = VersionBufferConfig.from_args(input.args)
        self._metrics_path = MetricsConfig.from_args(input.args).metrics_path
        self._inner = inner if inner is not None else _miles_default_buffer(input)
        self._window = _Window()
        self.recent_records: deque[dict[str, Any]] = deque(maxlen=MAX_RECENT_RECORDS)

    async def put(self, input: Any) -> None:
        await self._inner.put(input)

    async def get(self, current_version: int | None = None, **context: Any) -> Any:
        while True:
            entry = await self._inner.get(current_version=current_version, **context)
            verdict = judge_group(entry.group, current_version, self.config)
            if verdict.keep:
                self._consume(entry, current_version, verdict)
                return entry
            self._reject(entry, current_version, verdict)

    def _consume(self, entry: Any, current_version: int | None, verdict: Verdict) -> None:
        window = self._window
        window.groups_consumed += 1
        if verdict.oldest_token_version is None:
            window.groups_unversioned += 1
        samples = flatten_group(entry.group)
        if current_version is None:
            return
        if self.config.mask_token_age is not None:
            for sample in samples:
                masked = mask_stale_tokens(sample, current_version, self.config.mask_token_age)
                window.tokens_masked += masked
                if masked and trained_sample(sample) is None:
                    window.samples_fully_masked += 1
        trained = _trained(samples)
        window.consumed += trained
        window.consumed_versions += [current_version] * len(trained)

    def _reject(self, entry: Any, current_version: int | None, verdict: Verdict) -> None:
        action = self.config.stale_group_action
        samples = flatten_group(entry.group)
        record = {
            "kind": STALE_GROUP_KIND,
            "time": time.time(),
            "reason": verdict.reason,
            "action": action,
            "group_index": getattr(samples[0], "group_index", None) if samples else None,
            "sample_indices": [getattr(s, "index", None) for s in samples],
            "current_version": current_version,
            "oldest_token_version": verdict.oldest_token_version,
            "token_age": verdict.token_age,
            "max_token_age": self.config.max_token_age,
        }
        logger.info("rl360 version buffer: %s", orjson.dumps(record).decode())
        self.recent_records.append(record)
        if self._metrics_path:
            append_records(Path(self._metrics_path), [record])
        if action == REQUEUE:
            self._window.groups_stale_requeued += 1
            self._handle_unused(entry.prompt_group)
        else:
            self._window.groups_stale_dropped += 1

    def get_metrics(self) -> dict[str, float]:
        """Miles' buffer metrics, this buffer's counters and the handed-out groups' staleness."""
        metrics = dict(self._inner.get_metrics())
        window, self._window = self._window, _Window()
        for spec in fields(window):
            if spec.name not in ("consumed", "consumed_versions"):
                metrics[f"{METRIC_PREFIX}{spec.name}"] = float(getattr(window, spec.name))
        metrics[f"{METRIC_PREFIX}max_token_age"] = float(self.config.max_token_age)
        if window.consumed:
            metrics.update(staleness_metrics(window.consumed, window.consumed_versions))
        return metrics
