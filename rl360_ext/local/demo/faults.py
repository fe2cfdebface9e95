"""`rl360 demo --inject FAULT:STEP`: the faults that should trip the step gate, parsed and checked.

Owns the fault names and `parse_injections` (each value `KIND:STEP`; a ValueError names the value
and says what is wrong), and `injected(injections, kind, step)`. Pure: how each fault reaches the
demo's real paths is `rl360_ext.local.demo.gate` (bad push, template drift) and
`rl360_ext.local.demo.plan.plan_step` (burst).

- `burst:STEP`: most of that step's attempts (each with probability `ab.config.BURST_RATE`) run
  the sandbox-start fault task, so they fail as infrastructure (the public run's step-70 outage);
- `bad-push:STEP`: one engine loads perturbed weights, under the right version label, in the push
  that rollout STEP generates on: its samples disagree with the trainer (parity);
- `template-drift:STEP`: rollout STEP's sessions render with a template that renders an empty
  assistant turn with a space (the append-only checker's generated conversations miss it), so the
  trajectories' tokens drift from the canonical render (`tito/render_mismatch_frac`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

BURST = "burst"
BAD_PUSH = "bad-push"
TEMPLATE_DRIFT = "template-drift"
INJECT_KINDS = (BURST, BAD_PUSH, TEMPLATE_DRIFT)


@dataclass(frozen=True)
class Injection:
    """One `--inject` fault: its kind (INJECT_KINDS) and the rollout step it hits."""

    kind: str
    step: int

    def __post_init__(self) -> None:
        if self.kind not in INJECT_KINDS:
            raise ValueError(f"--inject: fault must be one of {', '.join(INJECT_KINDS)}, got {self.kind!r}")
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 0:
            raise ValueError(f"--inject {self.kind}: step must be an integer >= 0, got {self.step!r}")

    def __str__(self) -> str:
        return f"{self.kind}:{self.step}"


def parse_injection(value: str) -> Injection:
    """One `KIND:STEP` value; a ValueError names the value."""
    kind, colon, step = str(value).strip().partition(":")
    if not colon:
        kinds = ", ".join(INJECT_KINDS)
        raise ValueError(f"--inject {value!r}: expected FAULT:STEP with FAULT one of {kinds}")
    if kind not in INJECT_KINDS:
        raise ValueError(f"--inject {value!r}: unknown fault {kind!r}; one of {', '.join(INJECT_KINDS)}")
    if not step.strip().isdigit():
        raise ValueError(f"--inject {value!r}: STEP must be a rollout step (an integer >= 0), got {step!r}")
    return Injection(kind, int(step))


def parse_injections(values: Iterable[str] | None) -> tuple[Injection, ...]:
    """Every `--inject` value (each may also be a comma-separated list), in step order; a fault
    given twice for the same step is an error naming it."""
    found: list[Injection] = []
    for value in values or ():
        for part in str(value).split(","):
            if not part.strip():
                raise ValueError(f"--inject {value!r}: an empty FAULT:STEP")
            injection = parse_injection(part)
            if injection in found:
                raise ValueError(f"--inject {injection}: given twice")
            found.append(injection)
    return tuple(sorted(found, key=lambda i: (i.step, i.kind)))


def check_injections(injections: Sequence[Injection], steps: int) -> None:
    """Each injection is an `Injection` on a step the run has; a ValueError names the one that is not."""
    for injection in injections:
        if not isinstance(injection, Injection):
            raise ValueError(f"--inject: expected FAULT:STEP values, got {injection!r}")
        if injection.step >= steps:
            raise ValueError(
                f"--inject {injection}: step {injection.step} is past the run's last step ({steps - 1})"
            )


def injected(injections: Sequence[Injection], kind: str, step: int) -> bool:
    """Whether `kind` is injected at rollout `step`."""
    return Injection(kind, step) in injections
