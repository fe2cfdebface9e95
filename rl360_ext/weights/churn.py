"""Engine churn plans: which engine event happens at which step (`rl360 demo --engine-churn`).

Owns parsing and checking a churn SPEC, a comma-separated list of `kill:STEP` (an engine dies
mid-rollout of that step and a replacement starts) and `hang:STEP` (an engine stops answering at
the weight push after that step's training, and hangs on shutdown), e.g. `kill:1,hang:2,kill:3`.
Every error names the flag and the entry it rejects. It runs nothing: the local stack carries the
events out (`rl360_ext.local.demo.churn`), the push fences what does not answer
(`rl360_ext.weights.push.push_with_fencing`).
"""

from __future__ import annotations

from dataclasses import dataclass

KILL, HANG = "kill", "hang"
CHURN_KINDS = (KILL, HANG)
FLAG = "--engine-churn"


@dataclass(frozen=True)
class ChurnEvent:
    kind: str  # CHURN_KINDS
    step: int  # the rollout step (kill) or the push after that step's training (hang)

    def __str__(self) -> str:
        return f"{self.kind}:{self.step}"


def parse_churn(spec: str | None, steps: int | None = None) -> tuple[ChurnEvent, ...]:
    """The events of `spec` in step order; `""` or None: none. With `steps`, every STEP must be a
    step the run has (0 to steps - 1). At most one event per step. ValueError names the entry."""
    if spec is None or not spec.strip():
        return ()
    events: dict[int, ChurnEvent] = {}
    for entry in (part.strip() for part in spec.split(",")):
        if not entry:
            raise ValueError(
                f"{FLAG}: empty entry in {spec!r} (expected kill:STEP or hang:STEP, comma-separated)"
            )
        kind, sep, step_text = entry.partition(":")
        kind = kind.strip().lower()
        if not sep or kind not in CHURN_KINDS:
            raise ValueError(f"{FLAG}: {entry!r} is not kill:STEP or hang:STEP")
        step_text = step_text.strip()
        if not step_text.isdecimal():
            raise ValueError(f"{FLAG}: {entry!r}: STEP must be a non-negative integer, got {step_text!r}")
        step = int(step_text)
        if steps is not None and step >= steps:
            raise ValueError(f"{FLAG}: {entry!r}: STEP must be below --steps ({steps}), got {step}")
        if step in events:
            raise ValueError(
                f"{FLAG}: {entry!r}: step {step} already has {events[step]} (one event per step)"
            )
        events[step] = ChurnEvent(kind, step)
    return tuple(events[step] for step in sorted(events))
