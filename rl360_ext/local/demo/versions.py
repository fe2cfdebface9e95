"""The demo's weight schedules and the versions a step's turns must carry.

Schedules (`--schedule`): `one-step-off` is Miles' `train_async.py` (weights pushed only once no
rollout generates). `in-flight` pushes the weights step k's training produced as soon as they are
written, while rollout k+1 keeps generating: the engines pause (`--pause-mode in_place` keeps the
KV; `retract` recomputes it on the new weights), update and continue, so a trajectory's tokens
come from up to two policy versions and the trainer's TIS corrects for the hybrid behaviour
policy through the per-token `rollout_log_probs`. The version figures the comparison reports
(token age, mixed-version share, stale-KV share, R3 provenance) are the trainer's own metrics
(`rl360_ext.train.staleness`); this module only names the age buckets they use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rl360_ext.local.demo.modes import (
    IN_FLIGHT,
    ONE_STEP_OFF,
    SCHEDULES,
)
from rl360_ext.train.staleness import AGE_BUCKETS as STALENESS_AGE_BUCKETS

START, WAIT, TRAIN, PUSH = "start_rollout", "wait_rollout", "train", "push_weights"
INITIAL_WEIGHT_VERSION = "0"  # pushed before step 0, as Miles' train_async updates weights first


AGE_BUCKETS = STALENESS_AGE_BUCKETS  # staleness/token_age_hist/<bucket>


@dataclass(frozen=True)
class Event:
    """One action of the driver: `step` is the rollout step (None for the initial push)."""

    action: str
    step: int | None


def one_step_off_schedule(steps: int) -> list[Event]:
    """The driver's actions in order, as Miles' train_async.py orders them (update interval 1).

    Push the initial weights; start rollout 0; for each step k: wait for rollout k (unless the
    previous iteration already did), start rollout k+1, train on step k, wait for rollout k+1
    ("sync generate before update weights"), push the weights step k's training produced.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    events = [Event(PUSH, None), Event(START, 0)]
    waited: set[int] = set()
    for step in range(steps):
        if step not in waited:
            events.append(Event(WAIT, step))
            waited.add(step)
        if step + 1 < steps:
            events.append(Event(START, step + 1))
        events.append(Event(TRAIN, step))
        if step + 1 < steps:
            events.append(Event(WAIT, step + 1))
            waited.add(step + 1)
        events.append(Event(PUSH, step))
    return events


def in_flight_schedule(steps: int) -> list[Event]:
    """The in-flight driver's actions: push the initial weights; start rollout 0; for each step k:
    wait for rollout k, start rollout k+1, train on step k, push at once (rollout k+1 is still
    generating: the push pauses the engines, updates and continues them)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    events = [Event(PUSH, None), Event(START, 0)]
    for step in range(steps):
        events.append(Event(WAIT, step))
        if step + 1 < steps:
            events.append(Event(START, step + 1))
        events.append(Event(TRAIN, step))
        events.append(Event(PUSH, step))
    return events


def schedule_events(schedule: str, steps: int) -> list[Event]:
    """The driver's actions for `schedule` (SCHEDULES)."""
    if schedule == ONE_STEP_OFF:
        return one_step_off_schedule(steps)
    if schedule == IN_FLIGHT:
        return in_flight_schedule(steps)
    raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")


def versions_per_rollout(schedule: list[Event]) -> dict[int, list[str]]:
    """The versions each rollout may generate on: the last push before it started, then every push
    while it was in flight (in order). Under one-step-off each list has one entry."""
    current: str | None = None
    in_flight: set[int] = set()
    versions: dict[int, list[str]] = {}
    for event in schedule:
        if event.action == START:
            if current is None:
                raise ValueError(f"rollout {event.step} starts before any weights were pushed")
            versions[event.step] = [current]  # type: ignore[index]
            in_flight.add(event.step)  # type: ignore[arg-type]
        elif event.action == WAIT:
            in_flight.discard(event.step)  # type: ignore[arg-type]
        elif event.action == PUSH:
            current = pushed_version(event.step)
            for step in in_flight:
                versions[step].append(current)
    return versions


def max_token_age(schedule: str, steps: int) -> int:
    """The oldest token age a train step sees under `schedule` over `steps` steps: step k trains
    from the weights pushed as `pushed_version(k - 1)` (version k) on tokens of its rollout's
    versions (`versions_per_rollout`)."""
    per_rollout = versions_per_rollout(schedule_events(schedule, steps))
    return max(
        (step - min(int(v) for v in versions) for step, versions in per_rollout.items() if step < steps),
        default=0,
    )


def allowed_weight_versions(schedule: str, step: int, steps: int) -> list[str]:
    """The versions `step`'s turns may carry under `schedule` (one under one-step-off)."""
    return versions_per_rollout(schedule_events(schedule, max(steps, step + 1)))[step]


def pushed_version(after_step: int | None) -> str:
    """The weight version pushed after step `after_step`'s update (None: the initial push)."""
    return INITIAL_WEIGHT_VERSION if after_step is None else str(after_step + 1)


def expected_weight_version(step: int) -> str:
    """The version every turn of `step` must carry under Miles' one-step-off schedule.

    Step k+1 starts generating as soon as step k's rollout is done, so it overlaps step k's
    update; the push after step k's update waits for step k+1's rollout. Step k+2 therefore
    generates on step k's weights: steps 0 and 1 carry the initial version, step k >= 2 carries
    `pushed_version(k - 2)` (`versions_per_rollout(one_step_off_schedule(n))`: one version each).
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return INITIAL_WEIGHT_VERSION if step < 2 else pushed_version(step - 2)


def version_mismatches(samples: Sequence[Any], expected: str | Sequence[str]) -> list[str]:
    """One message per sample with a turn on a weight version outside `expected` (one or several)."""
    allowed = {expected} if isinstance(expected, str) else set(expected)
    expected = ",".join(sorted(allowed))
    problems = []
    for sample in samples:
        versions = [str(v) for v in getattr(sample, "weight_versions", None) or []]
        wrong = sorted({v for v in versions if v not in allowed})
        if wrong:
            problems.append(
                f"group {sample.group_index} attempt {sample.index}: turns on weight version(s) "
                f"{', '.join(wrong)}, expected {expected}"
            )
    return problems
