"""The names the demo's plan and both fault A/Bs share: the fault modes, the arms, the goal, the
live A/B's defaults (`rl360 demo --compare`'s `--seeds` and `--fault-modes`), the schedules the
offline A/B runs, and the parser of a comma-separated name list. Standard library only, so the CLI
imports it without the trainer.
"""

from __future__ import annotations

from collections.abc import Sequence

ONE_STEP_OFF, IN_FLIGHT = "one-step-off", "in-flight"  # when the demo pushes weights (the default first)
SCHEDULES = (ONE_STEP_OFF, IN_FLIGHT)

UNIFORM, BURST, CORRELATED, EXPLOITABLE = "uniform", "burst", "correlated", "exploitable"
FAULT_MODES = (UNIFORM, BURST, CORRELATED, EXPLOITABLE)
PLANNED_FAULT_MODES = (UNIFORM, EXPLOITABLE)  # modes whose infrastructure faults are the uniform ones
CRASH_MODES = (EXPLOITABLE,)  # modes where the quiz agent offers the crash tool (quiz_agent.CRASH_LETTER)
BURST_RATE = 0.9  # the burst step's fault probability per attempt
RL360, RL360_LIST, UPSTREAM, CLEAN = "rl360", "rl360-list", "upstream", "clean"
ZERO_SCORED, DENOMINATOR, VANILLA_TIS = "zero-scored", "denominator", "vanilla-tis"
ARM_NAMES = ("rl360", "rl360-list", "upstream", "clean", "zero-scored", "denominator", "vanilla-tis")
ABLATION_ARMS = ("zero-scored", "denominator", "vanilla-tis")  # each one upstream rule on top of rl360's
ON_POLICY = "on-policy"
GOAL = 0.8  # the unfiltered mean whose first step is "steps to goal" (offline and live A/B)
LIVE_SEEDS = 3  # `rl360 demo --compare`'s default --seeds
LIVE_FAULT_MODES = UNIFORM  # `rl360 demo --compare`'s default --fault-modes (one mode: the cheapest)
OFFLINE_SCHEDULES = (ONE_STEP_OFF, ON_POLICY)


def parse_names(value: str, known: Sequence[str], flag: str) -> tuple[str, ...]:
    """The comma-separated names of `value`, each one of `known`, no repeats; a ValueError names `flag`."""
    names = tuple(part.strip() for part in value.split(",") if part.strip())
    unknown = [n for n in names if n not in known]
    if not names or unknown or len(set(names)) != len(names):
        raise ValueError(
            f"{flag} takes a comma-separated list of {', '.join(known)} (no repeats), got {value!r}"
        )
    return names
