"""One demo step reduced to the row of the summary table: its samples, the filter's decisions and
the weight push (`summarize_step`, `attach_push`). Validity comes only from
`rl360_ext.outcomes.provenance`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rl360_ext.local.demo.versions import version_mismatches
from rl360_ext.outcomes.provenance import VALID, attempt_class, infra_cause
from rl360_ext.rollout.rewards import reward_value


@dataclass
class StepSummary:
    """One row of the end-of-run table."""

    step: int
    attempts: int
    valid: int
    infra_by_cause: dict[str, int]
    groups: int
    kept_groups: int
    unfiltered_mean: float | None
    kept_mean: float | None
    expected_version: str
    versions_seen: list[str]
    version_problems: list[str] = field(default_factory=list)
    versions: dict[str, float] | None = None  # the train step's staleness/kv/r3 metrics
    trust: dict[str, float] | None = None  # the train step's |delta log p| and TIS clip fraction
    rollout_time_s: float | None = None
    train_time_s: float | None = None
    push_version: str | None = None
    push_duration_s: float | None = None
    push_complete: bool | None = None
    gate: str | None = None  # the step gate's verdict (`demo.gate.verdict_cell`), None: gate off

    @property
    def infra(self) -> int:
        return sum(self.infra_by_cause.values())


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize_step(
    step: int,
    groups: Sequence[Sequence[Any]],
    kept: Sequence[bool],
    expected_version: str | Sequence[str],
    rollout_time_s: float | None = None,
) -> StepSummary:
    """The step's row from its samples (per group) and the filter's keep decision per group.

    unfiltered mean: valid rewards of every group; kept mean: valid rewards of kept groups. Infra
    attempts count in neither, whatever reward field they carry.
    """
    if len(groups) != len(kept):
        raise ValueError(f"{len(groups)} groups but {len(kept)} filter decisions")
    samples = [s for group in groups for s in group]
    causes = Counter(c for s in samples if (c := infra_cause(s)) is not None)
    valid_rewards = [reward_value(s) for s in samples if attempt_class(s) == VALID]
    kept_rewards = [
        reward_value(s)
        for group, keep in zip(groups, kept, strict=True)
        if keep
        for s in group
        if attempt_class(s) == VALID
    ]
    versions = sorted({str(v) for s in samples for v in (getattr(s, "weight_versions", None) or [])})
    return StepSummary(
        step=step,
        attempts=len(samples),
        valid=len(valid_rewards),
        infra_by_cause=dict(sorted(causes.items())),
        groups=len(groups),
        kept_groups=sum(1 for keep in kept if keep),
        unfiltered_mean=_mean(valid_rewards),
        kept_mean=_mean(kept_rewards),
        expected_version=(
            expected_version if isinstance(expected_version, str) else ",".join(expected_version)
        ),
        versions_seen=versions,
        version_problems=version_mismatches(samples, expected_version),
        rollout_time_s=rollout_time_s,
    )


def attach_push(summary: StepSummary, push: Mapping[str, Any]) -> None:
    """Record the weight push that followed the step's update (a WeightPush.to_dict())."""
    summary.push_version = push.get("weight_version")
    summary.push_duration_s = push.get("duration_s")
    summary.push_complete = push.get("complete")
