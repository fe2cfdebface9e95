"""The settings of `rl360 ab` (the fault A/B offline, `rl360_ext.local.ab.offline`): one dataclass
whose fields are the command's flags (`rl360_ext.cli.fields.config_command`). Standard library
only (the names it checks are `rl360_ext.local.demo.modes`'), so the CLI imports it without the
trainer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rl360_ext.local.demo.modes import (
    ARM_NAMES,
    CLEAN,
    EXPLOITABLE,
    FAULT_MODES,
    GOAL,
    OFFLINE_SCHEDULES,
    ONE_STEP_OFF,
    RL360,
    RL360_LIST,
    UNIFORM,
    UPSTREAM,
    parse_names,
)


@dataclass(frozen=True)
class OfflineConfig:
    """What `rl360 ab` runs; the constructor rejects values it cannot run, naming the option."""

    seeds: int = 10
    """Seeds per arm and fault mode (run seeds first_seed .. first_seed + seeds - 1)."""
    first_seed: int = 0
    """The first run seed: tasks, faults and sampling of each run come from it (the demo's plan)."""
    fault_mode: str = ",".join(FAULT_MODES)
    """Fault modes, comma-separated: uniform, burst, correlated, exploitable (the uniform faults
    plus a crash tool the policy can call; docs/demo.md, `ab.offline`)."""
    arms: str = f"{RL360},{RL360_LIST},{UPSTREAM},{CLEAN}"
    """Arms, comma-separated: rl360 (attribution by evidence), rl360-list (rl360 with the list rule:
    a crash of the policy's own sandbox is masked as infrastructure), upstream, clean, and the
    ablations zero-scored, denominator, vanilla-tis (each one upstream rule on top of rl360's)."""
    list_modes: str = EXPLOITABLE
    """Fault modes the rl360-list arm runs in, comma-separated; in a mode without the crash tool it
    is rl360 exactly (an infrastructure fault is masked under both rules)."""
    ablation_modes: str = UNIFORM
    """Fault modes the ablation arms (zero-scored, denominator, vanilla-tis) run in, comma-separated;
    the other arms run in every --fault-mode."""
    faults: float = 0.3
    """The fault rate of the uniform and correlated modes (the live A/B's --faults)."""
    steps: int = 20
    """Rollout steps per run."""
    tasks: int = 8
    """Task groups per step."""
    attempts: int = 4
    """Attempts per task group."""
    goal: float = GOAL
    """The unfiltered mean whose first step is 'steps to goal'."""
    schedule: str = ONE_STEP_OFF
    """one-step-off (the demo's default: step k samples on step k-2's weights) or on-policy."""
    init_seed: int = 0
    """Seed of the warm-started first policy (the demo's --seed): the same in every run."""
    lr: float = 1e-3
    """The reference trainer's AdamW learning rate (the demo's --lr)."""
    head_lr: float = 2e-2
    """Learning rate of the embedding and LM head (the demo's --head-lr)."""
    temperature: float = 1.0
    """Sampling temperature of the training attempts."""
    max_new_tokens: int = 2
    """The answer turn's token budget (the demo's)."""
    workers: int = 1
    """Processes running the seeds (forked after the warm start)."""
    gradient_draws: int = 0
    """Independent one-step batches from the first policy for the gradient bias/variance
    measurement and each arm's advantages against the clean arm's (0: skip both)."""
    out: str = "runs/ab"
    """Output folder for ab.json."""

    def __post_init__(self) -> None:
        for name, least in (
            ("seeds", 1),
            ("steps", 1),
            ("tasks", 1),
            ("attempts", 2),
            ("max_new_tokens", 1),
            ("workers", 1),
            ("gradient_draws", 0),
            ("first_seed", 0),
            ("init_seed", 0),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"--{name.replace('_', '-')} must be an integer >= {least}, got {value!r}")
        for name in ("faults", "goal"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0.0 <= value <= 1.0):
                raise ValueError(f"--{name} must be in [0, 1], got {value!r}")
        for name in ("lr", "head_lr", "temperature"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"--{name.replace('_', '-')} must be a finite number > 0, got {value!r}")
        if self.schedule not in OFFLINE_SCHEDULES:
            raise ValueError(
                f"--schedule must be one of {', '.join(OFFLINE_SCHEDULES)}, got {self.schedule!r}"
            )
        names_of = (self.mode_names, self.arm_names, self.ablation_mode_names, self.list_mode_names)
        for names in names_of:  # each raises if bad
            assert names

    @property
    def mode_names(self) -> tuple[str, ...]:
        return parse_names(self.fault_mode, FAULT_MODES, "--fault-mode")

    @property
    def arm_names(self) -> tuple[str, ...]:
        return parse_names(self.arms, ARM_NAMES, "--arms")

    @property
    def ablation_mode_names(self) -> tuple[str, ...]:
        return parse_names(self.ablation_modes, FAULT_MODES, "--ablation-modes")

    @property
    def list_mode_names(self) -> tuple[str, ...]:
        return parse_names(self.list_modes, FAULT_MODES, "--list-modes")

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.first_seed, self.first_seed + self.seeds))
