"""Task health during training, from the policy's own attempts: the per-step `tasks/*` metrics.

Owns reading a step's groups (each the attempts at one task, before the dynamic-sampling filter
drops any) for what the filter would hide and what marks a vacuous verifier:
- `tasks/always_pass_groups`, `tasks/always_fail_groups`: groups whose valid attempts (at least
  two) all got the maximum, or all the floor; the filter drops both as zero-variance, so a task
  the policy can never fail or never pass disappears from the metrics unless counted here;
- `tasks/vacuous_signature_attempts`: valid attempts whose reward is above the floor although the
  attempt ended in an exception (a policy failure Harbor still graded, e.g. the agent crashed):
  marin #7784's signature of a verifier that passes whatever it is given; `vacuous_signature_tasks`
  names those tasks (sorted, at most `MAX_NAMED`) for the step record, since metrics stay numbers;
- `tasks/verifier_p95_s`: the 95th percentile (nearest rank) of the verifier phase over every
  attempt whose verifier ran, valid or not (one cut off at its timeout is the point), and with
  the audit's `task_health.jsonl` (each task's `verifier_timeout_s`, `verifier_timeouts`):
  `tasks/verifier_p95_timeout_frac`, the largest per-task p95 over that task's timeout, and
  `tasks/verifier_near_timeout_tasks`, the tasks whose p95 is over `NEAR_TIMEOUT` of it.
It is also the one home of what those words mean for one attempt (`valid_reward`, `passed`,
`at_floor`, `vacuous_signature`, `verifier_seconds`) and of reading the audit's task_health.jsonl
during training (`audited`: each task's verifier timeout and oracle tally, cached by the file's
identity), which the cross-step tracker (`rl360_ext.tasks.tracker`) reuses.
Which attempts are valid is `attempt_class` as recorded (`rl360_ext.outcomes`), never decided here.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from rl360_ext.outcomes.provenance import VALID

MAX_NAMED = 20
NEAR_TIMEOUT = 0.5  # a task's verifier p95 over this fraction of its timeout is near it
_TOLERANCE = 1e-9
_log = logging.getLogger(__name__)


def task_signals(
    groups: Sequence[Sequence[Mapping[str, Any]]], max_reward: float = 1.0, floor_reward: float = 0.0
) -> dict[str, int]:
    """The step's `tasks/*` metrics from its groups of attempt summaries (`attempt_class`,
    `reward`, `exception_type`)."""
    always_pass = always_fail = 0
    for group in groups:
        rewards = [r for a in group if (r := valid_reward(a)) is not None]
        if len(rewards) >= 2:
            always_pass += all(passed(r, max_reward) for r in rewards)
            always_fail += all(at_floor(r, floor_reward) for r in rewards)
    return {
        "tasks/groups": len(groups),
        "tasks/always_pass_groups": always_pass,
        "tasks/always_fail_groups": always_fail,
        "tasks/vacuous_signature_attempts": len(_vacuous(groups, floor_reward)),
    }


def vacuous_signature_tasks(
    groups: Sequence[Sequence[Mapping[str, Any]]], floor_reward: float = 0.0
) -> list[str]:
    """The tasks (`task` field) with the vacuous-verifier signature, sorted, at most `MAX_NAMED`."""
    named = {str(a["task"]) for a in _vacuous(groups, floor_reward) if a.get("task") is not None}
    return sorted(named)[:MAX_NAMED]


def _vacuous(groups: Sequence[Sequence[Mapping[str, Any]]], floor_reward: float) -> list[Mapping[str, Any]]:
    """Valid attempts above the floor that ended in an exception."""
    return [a for group in groups for a in group if vacuous_signature(a, floor_reward)]


def vacuous_signature(attempt: Mapping[str, Any], floor_reward: float = 0.0) -> bool:
    """A valid attempt above the floor that ended in an exception (marin #7784's signature)."""
    return bool(
        valid_reward(attempt) is not None
        and attempt.get("exception_type")
        and attempt["reward"] > floor_reward + _TOLERANCE
    )


def valid_reward(attempt: Mapping[str, Any]) -> float | None:
    """The reward of a valid attempt, None for any other (its class as recorded)."""
    return attempt.get("reward") if attempt.get("attempt_class") == VALID else None


def passed(reward: float, max_reward: float = 1.0) -> bool:
    """A reward at the maximum: the attempt passed."""
    return reward >= max_reward - _TOLERANCE


def at_floor(reward: float, floor_reward: float = 0.0) -> bool:
    """A reward at (or below) the floor: the attempt failed outright."""
    return reward <= floor_reward + _TOLERANCE


def p95(values: Sequence[float]) -> float | None:
    """The nearest-rank 95th percentile, or None for no values."""
    ordered = sorted(values)
    return ordered[math.ceil(0.95 * len(ordered)) - 1] if ordered else None


def verifier_seconds(attempt: Mapping[str, Any]) -> float | None:
    """The attempt's verifier phase in seconds, None when its verifier did not run (or no timing)."""
    value = (attempt.get("phase_timings") or {}).get("verifier")
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def verifier_signals(
    attempts: Iterable[Mapping[str, Any]], timeouts: Mapping[str, float]
) -> dict[str, float | int | None]:
    """The step's verifier-duration metrics from attempt summaries (`task`, `phase_timings`) and
    each task's verifier timeout (empty: the two timeout metrics are None)."""
    by_task: dict[str, list[float]] = defaultdict(list)
    every: list[float] = []
    for attempt in attempts:
        seconds = verifier_seconds(attempt)
        if seconds is None:
            continue
        every.append(seconds)
        if attempt.get("task") is not None:
            by_task[str(attempt["task"])].append(seconds)
    fractions = [
        p95(seconds) / timeouts[task]  # type: ignore[operator]
        for task, seconds in by_task.items()
        if timeouts.get(task, 0) > 0
    ]
    return {
        "tasks/verifier_p95_s": p95(every),
        "tasks/verifier_p95_timeout_frac": max(fractions) if fractions else None,
        "tasks/verifier_near_timeout_tasks": sum(f > NEAR_TIMEOUT for f in fractions) if timeouts else None,
    }


def verifier_timeouts(task_health: Path) -> dict[str, float]:
    """Each audited task's verifier timeout (`evidence.verifier_timeout_s`) from the audit's
    task_health.jsonl, re-read when the file changes; {} (with a warning for a file that is not
    one) when there is none: the metrics hook never stops training over it."""
    return {
        task: entry.verifier_timeout_s
        for task, entry in audited(task_health).items()
        if entry.verifier_timeout_s
    }


def oracle_tallies(task_health: Path) -> dict[str, tuple[int, int]]:
    """Each audited task's oracle tally (`evidence.oracle`: passed, valid) from task_health.jsonl,
    for tasks whose oracle had a valid run; {} without the file, as `verifier_timeouts`."""
    return {task: entry.oracle for task, entry in audited(task_health).items() if entry.oracle is not None}


@dataclass(frozen=True)
class Audited:
    """What the training-time signals read of one task's audit entry."""

    verifier_timeout_s: float | None
    oracle: tuple[int, int] | None  # (passed, valid) oracle runs


def audited(task_health: Path) -> Mapping[str, Audited]:
    """The audit's entries by task, cached by the file's identity, size and mtime: a step re-reads
    the file only when the audit rewrote it."""
    try:
        stat = task_health.stat()
    except OSError:
        return {}
    return _audited(str(task_health), stat.st_ino, stat.st_mtime_ns, stat.st_size)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


@functools.lru_cache(maxsize=4)
def _audited(path: str, inode: int, mtime_ns: int, size: int) -> Mapping[str, Audited]:
    found: dict[str, Audited] = {}
    try:
        for line in Path(path).read_text().splitlines():
            if not line.strip():
                continue
            entry = json.loads(line)
            evidence = entry["evidence"]
            timeout = evidence.get("verifier_timeout_s")
            oracle = evidence.get("oracle")
            tally = None
            if isinstance(oracle, Mapping):
                passes, valid = _count(oracle.get("passed")), _count(oracle.get("valid"))
                if passes is not None and valid and passes <= valid:
                    tally = (passes, valid)
            ok = isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0
            found[str(entry["task"])] = Audited(float(timeout) if ok else None, tally)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        _log.warning("%s is not a task_health.jsonl of rl360 tasks audit (%r): not read", path, exc)
        return MappingProxyType({})
    return MappingProxyType(found)
