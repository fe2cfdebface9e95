"""Phase occupancy: where in-flight trajectories spend their time (queue, sandbox, model, tools, verifier).

Owns turning one attempt's timings into its phases and a step's attempts into
`occupancy/<phase>`: the share of in-flight trajectory-time spent in each phase (RL360's "about
70% of the trajectories in flight were waiting on the model" and "about 0.5% on sandbox setup").
An attempt's timings come from the Harbor /run server (`queue`, `environment_setup`,
`agent_setup`, `agent`, `verifier`, in that order) and from the session server, which
knows each turn's model time (`model`: the sum of its turns' engine latencies). Sandbox setup is
environment plus agent setup; tools is the agent's execution time not spent waiting on the
model. It also lays a step's attempts on one clock (`timeline`): how many trajectories were in
each phase at each moment, for the report's chart. It does not collect timings
(`rl360_ext.rollout.generate` does) or draw charts (`rl360_ext.diagnostics`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PHASES = ("queue", "sandbox_setup", "model", "tools", "verifier")
MODEL_TIME = "model"  # phase_timings key the generate hook adds: seconds spent waiting on the model


def _seconds(timings: Mapping[str, Any], key: str) -> float:
    value = timings.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0.0
    return max(0.0, float(value))


def attempt_phases(timings: Mapping[str, Any] | None) -> dict[str, float]:
    """Seconds in each phase of one attempt (0 for a phase it never reached)."""
    timings = timings or {}
    agent = _seconds(timings, "agent")
    model = min(_seconds(timings, MODEL_TIME), agent) if agent else _seconds(timings, MODEL_TIME)
    return {
        "queue": _seconds(timings, "queue"),
        "sandbox_setup": _seconds(timings, "environment_setup") + _seconds(timings, "agent_setup"),
        "model": model,
        "tools": max(0.0, agent - model),
        "verifier": _seconds(timings, "verifier"),
    }


def step_occupancy(timings: Iterable[Mapping[str, Any] | None]) -> dict[str, float | None]:
    """`occupancy/<phase>` for one step: each phase's share of all in-flight trajectory-time."""
    totals = dict.fromkeys(PHASES, 0.0)
    for one in timings:
        for phase, seconds in attempt_phases(one).items():
            totals[phase] += seconds
    whole = sum(totals.values())
    return {f"occupancy/{phase}": (totals[phase] / whole if whole > 0 else None) for phase in PHASES}


@dataclass(frozen=True)
class Interval:
    """One attempt in one phase from `start` to `end` (seconds on the step's clock)."""

    phase: str
    start: float
    end: float


def attempt_intervals(started_at: float, timings: Mapping[str, Any] | None) -> list[Interval]:
    """An attempt's phases laid end to end from `started_at` (its arrival at the Harbor server).

    The agent phase is split into the model's share and the tools' share in that order: the
    timings say how long each took, not how they interleaved.
    """
    phases = attempt_phases(timings)
    intervals, clock = [], started_at
    for phase in PHASES:
        if phases[phase] > 0:
            intervals.append(Interval(phase, clock, clock + phases[phase]))
            clock += phases[phase]
    return intervals


def timeline(
    attempts: Sequence[tuple[float, Mapping[str, Any] | None]], points: int = 60
) -> list[dict[str, float]]:
    """In-flight trajectories per phase at `points` evenly spaced moments of the step.

    `attempts` are `(started_at, phase_timings)` pairs; each row is `{"t": seconds since the
    first arrival, <phase>: count, ...}`.
    """
    intervals = [i for started, timings in attempts for i in attempt_intervals(started, timings)]
    if not intervals or points < 2:
        return []
    first = min(i.start for i in intervals)
    last = max(i.end for i in intervals)
    span = last - first
    if span <= 0:
        return []
    rows = []
    for k in range(points):
        moment = first + span * k / (points - 1)
        row = {"t": moment - first, **dict.fromkeys(PHASES, 0.0)}
        for interval in intervals:
            if interval.start <= moment < interval.end or (k == points - 1 and interval.end == moment):
                row[interval.phase] += 1
        rows.append(row)
    return rows
