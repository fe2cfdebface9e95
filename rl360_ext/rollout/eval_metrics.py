"""Honest eval metrics: the `--custom-eval-rollout-log-function-path` hook.

Owns `log_eval_metrics(rollout_id, args, data, extra_metrics) -> bool`, the per-dataset eval
arithmetic (`dataset_metrics`, a pure function) and the unbiased pass@k estimator
(`unbiased_pass_at_k`). It does not decide validity (`rl360_ext.outcomes.provenance` does) and
does not run the eval (Miles' eval rollout calls the generate hook with `evaluation=True`).

Miles' contract at 31f1ca96: `miles/ray/rollout/metrics.py:21-24` calls
`custom_log_func(rollout_id, args, data, extra_metrics)` and skips its default logging when it
returns True. `data` is `{dataset name: {"rewards": [...], "truncated": [...], "samples":
[Sample, ...]}}` (`miles/rollout/inference_rollout/inference_rollout_eval.py:126-132`, sorted by
`Sample.index`), `extra_metrics` the eval rollout's metrics or None. Miles' default logs
`eval/<name>` as the mean reward with every None counted as 0.0 (`metrics.py:29-38`), so an
infrastructure outage reads as a worse policy. This hook returns True and logs, per dataset:

- `eval/<name>/pass_rate`: the fraction of valid attempts that pass (reward == 1, Miles' pass
  rule, `miles/utils/metric_utils.py:29`); `eval/<name>/mean_reward` over the same attempts;
- `eval/<name>/infra_rate` beside it (infra attempts / all attempts), `eval/<name>/attempts`,
  `eval/<name>/valid`, `eval/<name>/infra/<cause>` counts;
- `eval/<name>/pass@k`: per task (the attempt's `--rl360-task-key` metadata, else its prompt),
  the unbiased estimator 1 - C(n-c, k) / C(n, k) over that task's n valid attempts of which c
  pass, averaged over the tasks with n >= k (their count in `eval/<name>/pass@k_tasks`), for k
  the powers of two up to the most valid attempts any task has (Miles' ks,
  `metric_utils.py:22`);
- `eval/<name>/upstream`: Miles' own number (None counted as 0) and
  `eval/<name>/upstream_none_reward_ratio`, for comparison;
- Miles' default per-sample metrics (`_compute_metrics_from_samples`) over the valid samples,
  under `eval/<name>/`, when Miles is importable.

Everything goes to Miles' tracking against `eval/step` (`metrics.py:54-57`), and, with
`--rl360-metrics-path`, one `{"kind": "eval"}` line per dataset to the rl360 metrics JSONL.
Because the hook returns True, Miles' `log_eval_rollout_data` returns None (its CI metric
checker, `--ci-metric-checker-key`, then has nothing to read).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from rl360_ext.outcomes.provenance import INFRA_PREFIX, VALID, attempt_class
from rl360_ext.rollout.config import AgentConfig
from rl360_ext.rollout.metrics import SCHEMA_VERSION, append_records, metrics_path
from rl360_ext.rollout.rewards import flatten_group, reward_value

logger = logging.getLogger(__name__)

PASS_REWARD = 1.0  # Miles' pass rule: an attempt passes when its reward equals 1
EVAL_KIND = "eval"  # the JSONL record kind
EVAL_NOTE_KIND = "eval_note"  # a driver's JSONL line {"kind", "datasets": {name: what it holds}} (rl360 demo)


def unbiased_pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that k of n attempts drawn without replacement include a pass, given c
    passes: 1 - C(n-c, k) / C(n, k) (the unbiased pass@k estimator), as a stable product."""
    if not (0 <= c <= n) or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def _task_of(sample: Any, task_key: str) -> str:
    metadata = getattr(sample, "metadata", None) or {}
    task = metadata.get(task_key)
    return str(task) if task is not None else str(getattr(sample, "prompt", ""))


def _upstream(rewards: Sequence[Any]) -> tuple[float, float]:
    """Miles' default eval number and none-ratio (`miles/ray/rollout/metrics.py:29-38`)."""
    if not rewards:
        return 0.0, 0.0
    nones = sum(1 for r in rewards if r is None)
    return sum(0.0 if r is None else float(r) for r in rewards) / len(rewards), nones / len(rewards)


def dataset_metrics(
    name: str, entry: Mapping[str, Any], *, reward_key: str | None, task_key: str
) -> dict[str, Any]:
    """The metrics of one eval dataset (keys `eval/<name>/...`; see the module docstring).

    Raises ValueError naming the dataset when the entry has no `samples` list: without the
    samples a None reward cannot be told apart from an infrastructure failure.
    """
    samples = entry.get("samples")
    if not isinstance(samples, list):
        raise ValueError(
            f"eval dataset {name!r}: data[{name!r}]['samples'] must be the list of Samples "
            f"(Miles' eval rollout puts it there); got {type(samples).__name__}"
        )
    flat = flatten_group(samples)
    prefix = f"eval/{name}/"
    valid_rewards: list[float] = []
    per_task: dict[str, list[bool]] = {}
    causes: Counter[str] = Counter()
    for sample in flat:
        cls = attempt_class(sample)
        if cls != VALID:
            causes[cls.removeprefix(INFRA_PREFIX)] += 1
            continue
        reward = reward_value(sample, reward_key)
        valid_rewards.append(reward)
        per_task.setdefault(_task_of(sample, task_key), []).append(reward == PASS_REWARD)
    total, valid = len(flat), len(valid_rewards)
    passes = sum(1 for r in valid_rewards if r == PASS_REWARD)
    upstream, none_ratio = _upstream(list(entry.get("rewards") or []))
    metrics: dict[str, Any] = {
        f"{prefix}pass_rate": passes / valid if valid else None,
        f"{prefix}mean_reward": sum(valid_rewards) / valid if valid else None,
        f"{prefix}infra_rate": (total - valid) / total if total else None,
        f"{prefix}attempts": total,
        f"{prefix}valid": valid,
        f"{prefix}tasks": len(per_task),
        f"{prefix}upstream": upstream,
        f"{prefix}upstream_none_reward_ratio": none_ratio,
    }
    for cause, count in sorted(causes.items()):
        metrics[f"{prefix}infra/{cause}"] = count
    most = max((len(v) for v in per_task.values()), default=0)
    k = 1
    while k <= most:
        estimates = [unbiased_pass_at_k(len(v), sum(v), k) for v in per_task.values() if len(v) >= k]
        metrics[f"{prefix}pass@{k}"] = sum(estimates) / len(estimates)
        metrics[f"{prefix}pass@{k}_tasks"] = len(estimates)
        k *= 2
    return metrics


def eval_metrics(args: Any, data: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Every dataset's metrics (`dataset_metrics`), reading the reward key as Miles' eval does."""
    reward_key = getattr(args, "eval_reward_key", None) or getattr(args, "reward_key", None)
    task_key = AgentConfig.from_args(args).task_key
    metrics: dict[str, Any] = {}
    for name, entry in data.items():
        metrics |= dataset_metrics(str(name), entry, reward_key=reward_key, task_key=task_key)
    return metrics


def log_eval_metrics(
    rollout_id: int,
    args: Any,
    data: Mapping[str, Mapping[str, Any]],
    extra_metrics: Mapping[str, Any] | None = None,
) -> bool:
    """Miles' `--custom-eval-rollout-log-function-path` hook; returns True (replaces the default)."""
    metrics = eval_metrics(args, data)
    path = metrics_path(args)
    if path is not None:
        now = time.time()
        append_records(
            path,
            [
                {
                    "kind": EVAL_KIND,
                    "schema": SCHEMA_VERSION,
                    "rollout_id": rollout_id,
                    "time": now,
                    "dataset": str(name),
                    "metrics": {
                        key.removeprefix(f"eval/{name}/"): value
                        for key, value in metrics.items()
                        if key.startswith(f"eval/{name}/")
                    },
                }
                for name in data
            ],
        )
    logger.info("rl360 eval %s: %s", rollout_id, {k: v for k, v in metrics.items() if v is not None})
    _log_to_miles_tracking(rollout_id, args, data, metrics, extra_metrics)
    return True


def _log_to_miles_tracking(
    rollout_id: int,
    args: Any,
    data: Mapping[str, Mapping[str, Any]],
    metrics: Mapping[str, Any],
    extra_metrics: Mapping[str, Any] | None,
) -> None:
    try:
        from miles.utils.metric_utils import compute_rollout_step
        from miles.utils.tracking_utils import tracking
    except ImportError:
        return
    log_dict: dict[str, Any] = dict(extra_metrics or {})
    log_dict.update({key: value for key, value in metrics.items() if value is not None})
    for name, entry in data.items():
        log_dict.update(_miles_sample_metrics(args, str(name), entry.get("samples") or []))
    log_dict["eval/step"] = compute_rollout_step(args, rollout_id)
    tracking.log(args, log_dict, step_key="eval/step")


def _miles_sample_metrics(args: Any, name: str, samples: Sequence[Any]) -> dict[str, Any]:
    """Miles' default per-sample eval metrics over the valid samples (private Miles helpers: when
    missing or changed, skipped with a warning instead of failing the eval)."""
    valid = [s for s in flatten_group(samples) if attempt_class(s) == VALID]
    if not valid:
        return {}
    try:
        from miles.ray.rollout.metrics import _compute_metrics_from_samples
        from miles.utils.metric_utils import dict_add_prefix

        return dict_add_prefix(_compute_metrics_from_samples(args, valid), f"eval/{name}/")
    except Exception as error:  # private upstream helpers: degrade to rl360's own metrics, loudly
        logger.warning("rl360 eval metrics: Miles' default sample metrics failed for %s: %r", name, error)
        return {}
