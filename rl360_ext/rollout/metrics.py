"""Honest rollout metrics: the `--custom-rollout-log-function-path` hook and its per-step JSONL.

Owns `log_rollout_metrics(rollout_id, args, samples, extra_metrics, rollout_time) -> bool`, the
per-process registry through which the rl360 dynamic filter hands the log hook every group it
saw (Miles drops filtered groups before the log function runs and passes it only the kept,
flattened samples), the metric arithmetic (`step_metrics`, a pure function), and the JSONL
format `rl360 report` reads (`read_metrics`). It does not decide validity (provenance does),
filter groups, or compute advantages.

Where the pre-filter groups come from: `rl360_ext.rollout.filters.check_valid_reward_nonzero_std`
records a compact summary of each group it judges (never the Sample objects) into this module's
registry; the log hook drains it once per step. Both run in the RolloutManager process (Miles
calls the rollout function in a thread of that actor), so a lock suffices. With no dynamic filter
configured the trained samples are every group; with another filter the pre-filter numbers are
reported as unavailable (null), never guessed. The registry holds at most
`MAX_PENDING_GROUPS` groups so a run without the log hook cannot grow it without bound.

Metric names (JSONL "metrics"; Miles tracking gets them with a "rollout/" prefix so wandb plots
them against rollout/step): reward/unfiltered_mean, reward/kept_mean, reward/valid_fraction,
infra/failure_rate, infra/<cause>_rate, infra/masked_fraction, attribution/<who>_rate,
count/attribution/<who>/<cause>, count/policy_floor, domain/<d>/{unfiltered_mean,
kept_mean,attempts,valid_fraction}, count/{attempts,valid,infra,trained,masked,kept_groups,
dropped_groups,unused_groups}, count/infra/<cause>, count/dropped_groups/<reason>,
tito/render_mismatch_frac (of trained attempts the session compared, the fraction whose tokens
drift from the canonical render of their final messages), audit/* (what upstream defaults would
have done to this step; see rl360_ext.rollout.audit), tasks/* (groups the filter would hide
as always-pass or always-fail, the vacuous-verifier signature, the verifier's p95 against each
task's timeout from the audit's task_health.jsonl next to `--rl360-quarantine-file`;
rl360_ext.tasks.signals; and, with that file, what the training-time tracker accumulates over the
run: tasks/{tracked_tasks,drift_tested_tasks,drift_down_tasks,drift_up_tasks,above_oracle_tasks,
always_pass_streak_tasks,always_fail_streak_tasks,quarantined_live,quarantined_new}, with the
tasks behind them in the step record's `task_health`; rl360_ext.tasks.tracker), and
occupancy/{queue,sandbox_setup,model,tools,verifier} over every attempt in flight
(rl360_ext.rollout.occupancy).
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from rl360_ext.outcomes.attribution import ATTRIBUTED_TO, EVIDENCE
from rl360_ext.outcomes.provenance import (
    DOMAIN,
    FAILURE_CAUSE,
    FLOOR,
    INFRA_PREFIX,
    PHASE_TIMINGS,
    REWARD_SOURCE,
    TIMELINE,
    VALID,
    attempt_class,
)
from rl360_ext.rollout.audit import AuditAttempt, audit_step
from rl360_ext.rollout.config import (
    AgentConfig,
    MetricsConfig,
    add_dataclass_arguments,
    env_name,
    tracker_config,
)
from rl360_ext.rollout.occupancy import step_occupancy
from rl360_ext.rollout.rewards import flatten_group, reward_value
from rl360_ext.tasks.health import TASK_HEALTH_FILE
from rl360_ext.tasks.signals import (
    oracle_tallies,
    task_signals,
    vacuous_signature_tasks,
    verifier_signals,
    verifier_timeouts,
)
from rl360_ext.tasks.tracker import StepHealth, TrackerConfig, track_step
from rl360_ext.templates.drift import DRIFT_KEY

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
METRICS_PATH_ENV = env_name("metrics_path")  # RL360_METRICS_PATH
METRICS_ATTEMPTS_ENV = env_name("metrics_attempts")  # RL360_METRICS_ATTEMPTS
MAX_PENDING_GROUPS = 16384
TEMPLATE_DRIFT = DRIFT_KEY  # metadata key: the session's drift record of the trajectory
TASK_KEY = "task"  # metadata key: the Harbor task (AgentConfig.task_key's default)
ROUTING_BYTES = "routing_bytes"  # metadata key: bytes of routing-replay (R3) data the attempt carried


@dataclass
class GroupRecord:
    """One group as the dynamic filter saw it: attempt summaries and the filter's decision."""

    group_index: Any
    attempts: list[dict[str, Any]]
    keep: bool
    reason: str | None


class FilterRegistry:
    """Groups judged by the filter since the last drain (thread-safe, bounded)."""

    def __init__(self, max_groups: int = MAX_PENDING_GROUPS) -> None:
        self._lock = threading.Lock()
        self._groups: deque[GroupRecord] = deque(maxlen=max_groups)
        self._overflowed = 0

    def record(self, group: GroupRecord) -> None:
        with self._lock:
            if len(self._groups) == self._groups.maxlen:
                self._overflowed += 1
            self._groups.append(group)

    def drain(self) -> tuple[list[GroupRecord], int]:
        """The recorded groups and how many older ones were dropped for space; empties the registry."""
        with self._lock:
            groups, overflowed = list(self._groups), self._overflowed
            self._groups.clear()
            self._overflowed = 0
        return groups, overflowed


REGISTRY = FilterRegistry()


def record_filter_decision(args: Any, group: Sequence[Any], keep: bool, reason: str | None) -> None:
    """Called by the rl360 dynamic filter for every group it judges."""
    reward_key = getattr(args, "reward_key", None)
    attempts = [attempt_summary(sample, reward_key) for sample in group]
    group_index = attempts[0]["group_index"] if attempts else None
    REGISTRY.record(GroupRecord(group_index=group_index, attempts=attempts, keep=keep, reason=reason))


def _status(sample: Any) -> str | None:
    status = getattr(sample, "status", None)
    return None if status is None else str(getattr(status, "value", status))


def _cache_counts(sample: Any, metadata: Mapping[str, Any]) -> tuple[int | None, int | None]:
    info = getattr(sample, "prefix_cache_info", None)
    if info is not None and getattr(info, "total_prompt_tokens", 0):
        return int(info.cached_tokens), int(info.total_prompt_tokens)
    cached, prompt = metadata.get("cached_tokens"), metadata.get("prompt_tokens")
    return (None if cached is None else int(cached)), (None if prompt is None else int(prompt))


def _routing_bytes(metadata: Mapping[str, Any]) -> int | None:
    value = metadata.get(ROUTING_BYTES)
    return None if value is None else int(value)


def attempt_summary(sample: Any, reward_key: str | None = None) -> dict[str, Any]:
    """The per-attempt record (also a JSONL "attempt" line without the step fields)."""
    metadata = getattr(sample, "metadata", None) or {}
    cls = attempt_class(sample)
    cached_tokens, prompt_tokens = _cache_counts(sample, metadata)
    return {
        "group_index": getattr(sample, "group_index", None),
        "index": getattr(sample, "index", None),
        "attempt_class": cls,
        "reward": reward_value(sample, reward_key) if cls == VALID else None,
        "reward_source": metadata.get(REWARD_SOURCE),
        "failure_cause": metadata.get(FAILURE_CAUSE),
        "attributed_to": metadata.get(ATTRIBUTED_TO),
        "evidence": metadata.get(EVIDENCE),
        "exception_type": metadata.get("exception_type"),
        "task": metadata.get(TASK_KEY),
        "domain": metadata.get(DOMAIN),
        "status": _status(sample),
        "response_length": getattr(sample, "response_length", None),
        "phase_timings": metadata.get(PHASE_TIMINGS),
        "started_at": (metadata.get(TIMELINE) or {}).get("received_at"),
        "cached_tokens": cached_tokens,
        "prompt_tokens": prompt_tokens,
        "non_generation_time": getattr(sample, "non_generation_time", None),
        "routing_bytes": _routing_bytes(metadata),
        "render_mismatch": _render_mismatch(metadata),
    }


def _render_mismatch(metadata: Mapping[str, Any]) -> bool | None:
    """Whether the session found the trajectory's tokens drift from the canonical render (None:
    not compared), from `rl360_ext.templates.drift`'s record."""
    record = metadata.get(TEMPLATE_DRIFT)
    if not isinstance(record, Mapping) or not record.get("checked"):
        return None
    return bool(record.get("mismatch"))


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _rewards(attempts: Iterable[Mapping[str, Any]]) -> list[float]:
    return [a["reward"] for a in attempts if a["attempt_class"] == VALID]


def step_metrics(
    trained: Sequence[Mapping[str, Any]],
    seen: Sequence[GroupRecord] | None,
    verifier_timeouts_s: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """All metrics of one step from the trained attempts and the groups the filter saw (None: unknown);
    `verifier_timeouts_s`: each task's verifier timeout, from the task audit."""
    kept_rewards = _rewards(trained)
    trained_groups = {a["group_index"] for a in trained}
    metrics: dict[str, Any] = {
        "reward/kept_mean": _mean(kept_rewards),
        "count/trained": len(trained),
        "count/masked": len(trained) - len(kept_rewards),
        "infra/masked_fraction": (len(trained) - len(kept_rewards)) / len(trained) if trained else None,
        "count/kept_groups": len(trained_groups),
    }
    seen_attempts = None if seen is None else [a for group in seen for a in group.attempts]
    compared = [a["render_mismatch"] for a in trained if a.get("render_mismatch") is not None]
    metrics["tito/render_mismatch_frac"] = sum(compared) / len(compared) if compared else None
    metrics.update(_prefilter_metrics(seen, seen_attempts, trained_groups))
    metrics.update(_domain_metrics(trained, seen_attempts))
    if seen is not None:
        metrics.update(task_signals([group.attempts for group in seen]))
    in_flight = trained if seen_attempts is None else seen_attempts
    metrics.update(verifier_signals(in_flight, verifier_timeouts_s or {}))
    metrics.update(step_occupancy(a.get("phase_timings") for a in in_flight))
    audit = audit_step(
        [
            AuditAttempt(
                group=a["group_index"],
                valid=a["attempt_class"] == VALID,
                masked=a["attempt_class"] != VALID,
                reward=a["reward"],
            )
            for a in trained
        ],
        unfiltered_mean=metrics["reward/unfiltered_mean"],
    )
    metrics["audit/gradient_scale_upstream"] = audit.gradient_scale_upstream
    metrics["audit/advantage_shift_whole_batch"] = audit.advantage_shift_whole_batch
    metrics["audit/advantage_shift_group_masked_zero"] = audit.advantage_shift_group_masked_zero
    metrics["audit/logged_mean_upstream"] = audit.logged_mean_upstream
    metrics["audit/logged_mean_bias"] = audit.logged_mean_bias
    return metrics


def _prefilter_metrics(
    seen: Sequence[GroupRecord] | None, attempts: Sequence[Mapping[str, Any]] | None, trained_groups: set[Any]
) -> dict[str, Any]:
    keys = ("reward/unfiltered_mean", "reward/valid_fraction", "infra/failure_rate", "count/attempts")
    if seen is None or attempts is None:
        return dict.fromkeys(
            (*keys, "count/valid", "count/infra", "count/dropped_groups", "count/unused_groups")
        )
    rewards = _rewards(attempts)
    total = len(attempts)
    causes = Counter(a["attempt_class"][len(INFRA_PREFIX) :] for a in attempts if a["attempt_class"] != VALID)
    reasons = Counter(group.reason or "unspecified" for group in seen if not group.keep)
    metrics: dict[str, Any] = {
        "reward/unfiltered_mean": _mean(rewards),
        "reward/valid_fraction": len(rewards) / total if total else None,
        "infra/failure_rate": (total - len(rewards)) / total if total else None,
        "count/attempts": total,
        "count/valid": len(rewards),
        "count/infra": total - len(rewards),
        "count/dropped_groups": sum(reasons.values()),
        "count/unused_groups": sum(1 for g in seen if g.keep and g.group_index not in trained_groups),
    }
    for cause, count in sorted(causes.items()):
        metrics[f"infra/{cause}_rate"] = count / total
        metrics[f"count/infra/{cause}"] = count
    metrics.update(attribution_metrics(attempts))
    for reason, count in sorted(reasons.items()):
        metrics[f"count/dropped_groups/{reason}"] = count
    return metrics


def attribution_metrics(attempts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Who the step's failed attempts belong to: `attribution/<who>_rate` over every attempt,
    `count/attribution/<who>/<cause>` (the failure cause, else the resource a limit hit named) and
    `count/policy_floor` (scored at the task's floor: the policy's failure left nothing to grade)."""
    total = len(attempts)
    pairs: Counter[tuple[str, str]] = Counter()
    for attempt in attempts:
        who = attempt.get("attributed_to")
        if isinstance(who, str):
            evidence = attempt.get("evidence") or {}
            pairs[(who, attempt.get("failure_cause") or evidence.get("resource") or "unspecified")] += 1
    metrics: dict[str, Any] = {"count/policy_floor": sum(a.get("reward_source") == FLOOR for a in attempts)}
    for who in sorted({who for who, _ in pairs}):
        metrics[f"attribution/{who}_rate"] = sum(n for (w, _), n in pairs.items() if w == who) / total
    for (who, cause), count in sorted(pairs.items()):
        metrics[f"count/attribution/{who}/{cause}"] = count
    return metrics


def _domain_metrics(
    trained: Sequence[Mapping[str, Any]], seen: Sequence[Mapping[str, Any]] | None
) -> dict[str, Any]:
    metrics: dict[str, Any] = {}
    domains = sorted({a["domain"] for a in [*trained, *(seen or [])] if a["domain"] is not None}, key=str)
    for domain in domains:
        kept = [a for a in trained if a["domain"] == domain]
        metrics[f"domain/{domain}/kept_mean"] = _mean(_rewards(kept))
        if seen is None:
            continue
        attempts = [a for a in seen if a["domain"] == domain]
        rewards = _rewards(attempts)
        metrics[f"domain/{domain}/unfiltered_mean"] = _mean(rewards)
        metrics[f"domain/{domain}/attempts"] = len(attempts)
        metrics[f"domain/{domain}/valid_fraction"] = len(rewards) / len(attempts) if attempts else None
    return metrics


# ---- the hook ------------------------------------------------------------------------------

_warned: set[str] = set()


def _warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(message, *args)


def audited_verifier_timeouts(args: Any) -> dict[str, float]:
    """Each task's verifier timeout from the audit's task_health.jsonl, which `rl360 tasks audit`
    writes next to the quarantine.json the agent function honours ({} without one)."""
    quarantine = AgentConfig.from_args(args).quarantine_file
    return {} if quarantine is None else verifier_timeouts(Path(quarantine).with_name(TASK_HEALTH_FILE))


def track_task_health(rollout_id: int, args: Any, groups: Sequence[GroupRecord]) -> StepHealth | None:
    """The step through the training-time task-health tracker (`rl360_ext.tasks.tracker`), whose
    files live next to `--rl360-quarantine-file`; None without one. The groups are those the
    filter saw (the trained ones when another filter ran: then zero-variance groups are missing).
    A file the tracker cannot write is logged, never a stopped step."""
    quarantine = AgentConfig.from_args(args).quarantine_file
    if quarantine is None:
        return None
    directory = Path(quarantine).parent
    audit = directory / TASK_HEALTH_FILE
    try:
        return track_step(
            directory,
            tracker_config(args),
            rollout_id,
            (a for group in groups for a in group.attempts),
            verifier_timeouts(audit),
            oracle_tallies(audit),
        )
    except OSError as exc:
        _warn_once("task_health", "rl360 metrics: task health not tracked: %r", exc)
        return None


def log_rollout_metrics(
    rollout_id: int,
    args: Any,
    samples: Sequence[Any],
    extra_metrics: Mapping[str, Any] | None,
    rollout_time: float,
) -> bool:
    """Miles' `--custom-rollout-log-function-path` hook. Returns True: it replaces Miles' default logging.

    Appends the step (and, unless disabled, one line per attempt) to the JSONL at
    `args.rl360_metrics_path` or $RL360_METRICS_PATH, and logs to Miles' tracking backends
    (wandb/tensorboard/...) when Miles is importable, together with Miles' own sample and perf
    metrics computed over the valid samples.
    """
    reward_key = getattr(args, "reward_key", None)
    flat = flatten_group(samples)
    trained = [attempt_summary(sample, reward_key) for sample in flat]
    groups, overflowed = REGISTRY.drain()
    if groups:
        seen: list[GroupRecord] | None = groups
        prefilter = "filter_hook"
    elif getattr(args, "dynamic_sampling_filter_path", None) is None:
        seen, prefilter = _groups_of(trained), "no_filter"
    else:
        seen, prefilter = None, "unavailable"
        _warn_once(
            "prefilter",
            "rl360 metrics: dynamic filter %s is not rl360's; reward/unfiltered_mean is unavailable",
            args.dynamic_sampling_filter_path,
        )
    if overflowed:
        logger.warning(
            "rl360 metrics: %d filtered groups were dropped from the registry (bounded)", overflowed
        )
    metrics = step_metrics(trained, seen, audited_verifier_timeouts(args))
    health = track_task_health(rollout_id, args, seen if seen is not None else _groups_of(trained))
    if health is not None:
        metrics.update(health.metrics)
    path = metrics_path(args)
    if path is not None:
        step = {
            "kind": "step",
            "schema": SCHEMA_VERSION,
            "rollout_id": rollout_id,
            "time": time.time(),
            "rollout_time_s": rollout_time,
            "prefilter": prefilter,
            "registry_overflowed_groups": overflowed,
            "metrics": metrics,
            "vacuous_signature_tasks": None
            if seen is None
            else vacuous_signature_tasks([g.attempts for g in seen]),
            "task_health": None if health is None else health.record(),
            "miles_metrics": dict(extra_metrics or {}),
        }
        attempts = _attempt_lines(rollout_id, trained, seen) if _attempts_enabled(args) else []
        append_records(path, [step, *attempts])
    logger.info("rl360 rollout %s: %s", rollout_id, {k: v for k, v in metrics.items() if v is not None})
    _log_to_miles_tracking(rollout_id, args, flat, metrics, extra_metrics, rollout_time)
    return True


def _groups_of(trained: Sequence[dict[str, Any]]) -> list[GroupRecord]:
    groups: dict[Any, list[dict[str, Any]]] = {}
    for attempt in trained:
        groups.setdefault(attempt["group_index"], []).append(attempt)
    return [GroupRecord(group_index=g, attempts=a, keep=True, reason=None) for g, a in groups.items()]


def _attempt_lines(
    rollout_id: int, trained: Sequence[dict[str, Any]], seen: Sequence[GroupRecord] | None
) -> list[dict[str, Any]]:
    lines = [
        {
            "kind": "attempt",
            "rollout_id": rollout_id,
            **a,
            "trained": True,
            "filter": "kept",
            "dropped_reason": None,
        }
        for a in trained
    ]
    trained_groups = {a["group_index"] for a in trained}
    for group in seen or []:
        if group.keep and group.group_index in trained_groups:
            continue
        verdict = "unused" if group.keep else "dropped"
        lines.extend(
            {
                "kind": "attempt",
                "rollout_id": rollout_id,
                **a,
                "trained": False,
                "filter": verdict,
                "dropped_reason": group.reason,
            }
            for a in group.attempts
        )
    return lines


def metrics_path(args: Any) -> Path | None:
    """The JSONL path: `args.rl360_metrics_path`, else $RL360_METRICS_PATH, else None (no file)."""
    value = MetricsConfig.from_args(args).metrics_path
    return Path(value) if value else None


def _attempts_enabled(args: Any) -> bool:
    return MetricsConfig.from_args(args).metrics_attempts


def append_records(path: Path, records: Sequence[Mapping[str, Any]]) -> None:
    """Append JSON lines in one write (numpy scalars allowed; anything else unknown becomes its str)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = b"".join(
        orjson.dumps(r, option=orjson.OPT_SERIALIZE_NUMPY, default=str) + b"\n" for r in records
    )
    with path.open("ab") as handle:
        handle.write(payload)


def records_by_kind(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Every record of an rl360 metrics JSONL grouped by its `kind`, each list in file order (one pass)."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for record in iter_records(path):
        grouped.setdefault(str(record.get("kind")), []).append(record)
    return grouped


def read_metrics(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(step records, attempt records) of an rl360 metrics JSONL, in file order."""
    grouped = records_by_kind(path)
    return grouped.get("step", []), grouped.get("attempt", [])


def read_records(path: Path, kind: str) -> list[dict[str, Any]]:
    """Records of one other `kind` in file order, e.g. the "weight_push" lines a driver appends."""
    return records_by_kind(path).get(kind, [])


def iter_records(path: Path) -> Iterator[dict[str, Any]]:
    with Path(path).open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not a JSON line ({error})") from error
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{number}: not a JSON object")
            yield record


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags for the metrics hook, derived from `MetricsConfig` and the task-health tracker's
    `TrackerConfig` (call from a generate function's `add_arguments`)."""
    add_dataclass_arguments(parser, MetricsConfig)
    add_dataclass_arguments(parser, TrackerConfig)


# ---- Miles tracking --------------------------------------------------------------------------


def _log_to_miles_tracking(
    rollout_id: int,
    args: Any,
    samples: Sequence[Any],
    metrics: Mapping[str, Any],
    extra_metrics: Mapping[str, Any] | None,
    rollout_time: float,
) -> None:
    try:
        from miles.utils.metric_utils import compute_rollout_step
        from miles.utils.tracking_utils import tracking
    except ImportError:
        return
    log_dict: dict[str, Any] = dict(extra_metrics or {})
    log_dict.update({f"rollout/{key}": value for key, value in metrics.items() if value is not None})
    log_dict.update(_miles_sample_metrics(args, samples, rollout_time))
    log_dict["rollout/step"] = compute_rollout_step(args, rollout_id)
    tracking.log(args, log_dict, step_key="rollout/step")


def _miles_sample_metrics(args: Any, samples: Sequence[Any], rollout_time: float) -> dict[str, Any]:
    """Miles' default per-sample (over valid samples) and perf metrics, so replacing its logger loses nothing.

    These are private Miles helpers; when they are missing or change shape the metrics are
    skipped with one warning instead of failing the step.
    """
    try:
        from miles.ray.rollout.metrics import (
            _compute_metrics_from_samples,
            _compute_perf_metrics_from_samples,
        )
        from miles.utils.metric_utils import dict_add_prefix
    except ImportError as error:
        _warn_once(
            "miles_metrics_import", "rl360 metrics: Miles' default sample metrics unavailable: %s", error
        )
        return {}
    valid = [s for s in samples if attempt_class(s) == VALID]
    try:
        result = dict_add_prefix(_compute_perf_metrics_from_samples(args, samples, rollout_time), "perf/")
        if valid:
            result |= dict_add_prefix(_compute_metrics_from_samples(args, valid), "rollout/")
    except Exception as error:  # private upstream helpers: degrade to our own metrics, loudly
        _warn_once("miles_metrics_call", "rl360 metrics: Miles' default sample metrics failed: %r", error)
        return {}
    return result
