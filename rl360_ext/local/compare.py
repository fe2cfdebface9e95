"""`rl360 demo --faults RATE --compare upstream[,clean]`: the fault A/B, live, one arm after the other.

Owns which arms a `--compare` value asks for, each arm's `DemoConfig` (derived from the one the
user gave, so every arm has the same seed, steps, tasks, attempts and settings), running them,
and the combined report. The arms:

- `rl360`: rl360's rules (`valid_group_advantages`; the trainer's `valid_sample_mean` reducer
  and `valid_token_tis`): infrastructure failures are masked out of the loss and the baseline;
- `upstream`: upstream Miles' defaults (`rl360_ext.local.arms`: failures scored 0, Miles'
  `_normalize_rewards_by_rollout` grouping, the default reducer that counts masked samples in the
  loss denominator, vanilla TIS), on the same faults;
- `clean`: rl360's rules with no faults at all (`--compare upstream,clean`).

How the arms share the machine: one after the other, each a whole `rl360 demo` run in its own
folder (`OUT/<arm>`: its own stack, engines, trainer weights and weight versions), so each gets
both cores and none waits on another's rollouts. What is the same in every arm: the seed, the
format warm start (so the same first policy), each step's quiz tasks and every fault aimed at
an attempt (`demo_plan.plan_step` is a function of the seed, the step and the task/attempt
counts; the clean arm draws the same tasks, with the fault rate 0), and each attempt's sampling
seed (`demo_plan.attempt_sampling_seed`, `seeded_sampling` on in every arm), so while two arms
hold the same weights (steps 0 and 1 generate on the warm-started weights under one-step-off)
an attempt that runs in both samples the same tokens. What is not: where the engines' 503s land
(seeded per engine, drawn per request in arrival order), and everything after the arms'
weights part; the report's standard errors say how much of a difference noise alone makes.
The dynamic filter is rl360's in every arm, so the arms differ only in the rules above.

Wall time: the sum of the arms' runs (each as long as a `rl360 demo` of the same size). It does
not own any hook or the report's layout (`rl360_ext.diagnostics.compare_report`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from rl360_ext.diagnostics.compare_report import write_compare
from rl360_ext.local.arms import RL360_RULES, UPSTREAM_RULES
from rl360_ext.local.demo import DemoResult, run_demo
from rl360_ext.local.demo_plan import DemoConfig
from rl360_ext.util.console import make_console

RL360_ARM = "rl360"
UPSTREAM_ARM = "upstream"
CLEAN_ARM = "clean"
COMPARABLE_ARMS = (UPSTREAM_ARM, CLEAN_ARM)  # what `--compare` may name; rl360's arm always runs first


@dataclass(frozen=True)
class ArmSpec:
    """One arm: whose rules it trains with, and whether it gets the run's faults."""

    name: str
    rules: str
    faults: bool


ARMS: dict[str, ArmSpec] = {
    RL360_ARM: ArmSpec(RL360_ARM, RL360_RULES, True),
    UPSTREAM_ARM: ArmSpec(UPSTREAM_ARM, UPSTREAM_RULES, True),
    CLEAN_ARM: ArmSpec(CLEAN_ARM, RL360_RULES, False),
}


def parse_compare(value: str) -> list[str]:
    """The arms a `--compare` value runs, rl360's first: "upstream" or "upstream,clean".

    A ValueError names `--compare` and the allowed arms."""
    names = [part.strip() for part in value.split(",") if part.strip()]
    unknown = [name for name in names if name not in COMPARABLE_ARMS]
    if unknown or not names:
        raise ValueError(
            f"--compare takes a comma-separated list of {', '.join(COMPARABLE_ARMS)}, got {value!r}"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"--compare names an arm twice: {value!r}")
    if UPSTREAM_ARM not in names:
        raise ValueError(f"--compare needs the {UPSTREAM_ARM!r} arm, got {value!r}")
    return [RL360_ARM, *names]


def arm_configs(base: DemoConfig, arms: Sequence[str]) -> dict[str, DemoConfig]:
    """Every arm's run settings: `base` with the arm's rules, its own folder, and no faults for clean."""
    configs = {}
    for name in arms:
        spec = ARMS[name]
        configs[name] = dataclasses.replace(
            base,
            out=base.out / name,
            rules=spec.rules,
            faults=base.faults if spec.faults else 0.0,
            seeded_sampling=True,
        )
    return configs


@dataclass
class CompareResult:
    out: Path
    arms: dict[str, DemoResult]
    wall_s: float
    report_path: Path
    json_path: Path
    summary: list[str]

    @property
    def problems(self) -> list[str]:
        return [f"{name}: {problem}" for name, result in self.arms.items() for problem in result.problems]


def run_compare(base: DemoConfig, arms: Sequence[str], console: Console | None = None) -> CompareResult:
    """Run every arm's demo in turn (`base.out/<arm>`), then write `compare.html` and `compare.json`."""
    console = console or make_console()
    configs = arm_configs(base, arms)
    started = time.monotonic()
    console.print(
        f"rl360 demo --compare: arms {', '.join(arms)}, one after the other, seed {base.seed}, "
        f"faults {base.faults:g} (clean: 0), output {base.out}"
    )
    results: dict[str, DemoResult] = {}
    for number, (name, config) in enumerate(configs.items(), start=1):
        console.rule(f"arm {number}/{len(configs)}: {name} (rules {config.rules}, faults {config.faults:g})")
        fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
        results[name] = run_demo(console=console, **fields)
    folders = [(name, config.out) for name, config in configs.items()]
    report, numbers, summary = write_compare(base.out, folders)
    wall_s = time.monotonic() - started
    console.rule("fault A/B")
    for line in summary:
        console.print(line)
    console.print(f"A/B done in {wall_s:.0f} s: {report}, {numbers}")
    return CompareResult(base.out, results, wall_s, report, numbers, summary)
