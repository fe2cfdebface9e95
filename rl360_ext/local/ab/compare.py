"""`rl360 demo --faults RATE --compare upstream[,rl360-list][,clean] --seeds S --fault-modes M,...`:
the fault A/B, live, over seeds and fault modes, one run after the other.

Owns which arms a `--compare` value asks for and which fault modes a `--fault-modes` value asks
for, each run's `DemoConfig` (derived from the one the user gave, so every run has the same steps,
tasks, attempts and settings), running them, and handing the folders to the combined report. The
arms:

- `rl360`: rl360's rules (`valid_group_advantages`; the trainer's `valid_sample_mean` reducer
  and `valid_token_tis`): infrastructure failures are masked out of the loss and the baseline;
- `upstream`: upstream Miles' defaults (`rl360_ext.local.demo.arms`: failures scored 0, Miles'
  `_normalize_rewards_by_rollout` grouping, the default reducer that counts masked samples in the
  loss denominator, vanilla TIS), on the same faults;
- `rl360-list`: rl360's rules on a Harbor server that attributes by the list of causes alone
  (`--attribution list`, rl360 before attribution by evidence: a crash of the policy's own sandbox
  is masked as infrastructure). It runs only in the modes with the crash tool (`exploitable`):
  elsewhere it would be rl360's arm exactly;
- `clean`: rl360's rules with no faults at all (`--compare upstream,clean`). It has no fault, so
  its runs are the same in every mode without the crash tool: it runs once per seed
  (`OUT/clean/seed-S`) and the report counts it under every such mode, as the offline A/B does;
  in `exploitable` it runs again, with the crash tool (`OUT/exploitable/clean/seed-S`).

The fault modes are the offline A/B's (`rl360_ext.local.demo.plan.attempt_fault`, the module
docstring of `rl360_ext.local.ab.offline`): `uniform` (planned sandbox, verifier and deadline
faults at RATE x 3/4, plus the engines' 503s at RATE / 4 per attempt), `burst` (only the middle
step: each attempt's sandbox fails to start with probability 0.9), `correlated` (a valid
attempt is marked a lost sandbox once it ran, with a probability that grows with its sandbox
calls; `demo.plan.correlated_fault`), `exploitable` (the uniform faults, and the quiz agent's
crash tool: `quiz_agent.CrashToolQuizAgent`, the first policy given the crash action,
`demo.crash_action_head`).

Seeds: `--seeds S` runs the seeds SEED .. SEED + S - 1 (`--seed` is the demo's, default 0) in every
arm and mode. A run's seed is the whole demo's seed: the format warm start (so the first policy),
each step's quiz tasks, every fault aimed at an attempt (`demo.plan.plan_step`,
`demo.plan.fault_uniforms`), each attempt's sampling seed (`demo.plan.attempt_sampling_seed`,
`seeded_sampling` on in every run) and the engines' 503s (keyed by that sampling seed:
`rl360_ext.reference.engine.faults.FaultKey.SAMPLING_SEED`, so a function of the seed, step, task and
attempt, not of the arrival order). So every arm of one seed asks the same quizzes, faults the
same attempts (while their actions agree: the correlated mode looks at the answer) and samples
the same tokens while their weights agree (steps 0 and 1 under one-step-off). What is not
paired: everything after the arms' weights part, which the intervals over seeds measure.

Layout: `OUT/<mode>/<arm>/seed-<S>` (each a whole `rl360 demo` run: its own stack, engines,
session servers, trainer weights and report; one local Ray hosts them all in turn),
`OUT/clean/seed-<S>`, and `OUT/compare.html` / `compare.json`. Wall time: runs x one demo of the
same size, one after the other (each gets both cores): S x (modes x 2 + 1 with clean, + 1 per crash
mode with rl360-list, + 1 per crash mode with clean) runs. It does not own any hook, the statistics
(`rl360_ext.local.ab.stats`) or the report's layout (`rl360_ext.local.ab.page`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from rl360_ext.local.ab.page import RunFolder, write_compare
from rl360_ext.local.ab.stats import results_table
from rl360_ext.local.demo.arms import RL360_RULES, UPSTREAM_RULES
from rl360_ext.local.demo.modes import (
    CLEAN,
    CRASH_MODES,
    GOAL,
    LIVE_FAULT_MODES,
    LIVE_SEEDS,
    RL360,
    RL360_LIST,
    UNIFORM,
    UPSTREAM,
)
from rl360_ext.local.demo.plan import TRAIN_GREEDY, DemoConfig
from rl360_ext.local.demo.run import DemoResult, run_demo
from rl360_ext.local.stack import shared_ray
from rl360_ext.outcomes.attribution import AttributionRule
from rl360_ext.util.console import make_console, print_table

# what `--compare` may name; rl360's arm always runs first
COMPARABLE_ARMS = (UPSTREAM, RL360_LIST, CLEAN)


@dataclass(frozen=True)
class ArmSpec:
    """One arm: whose rules it trains with, whether it gets the run's faults, the Harbor server's
    `--attribution` (None: the server's default), and whether it runs only where the crash tool is."""

    name: str
    rules: str
    faults: bool
    attribution: str | None = None
    crash_modes_only: bool = False


ARMS: dict[str, ArmSpec] = {
    RL360: ArmSpec(RL360, RL360_RULES, True),
    UPSTREAM: ArmSpec(UPSTREAM, UPSTREAM_RULES, True),
    RL360_LIST: ArmSpec(RL360_LIST, RL360_RULES, True, AttributionRule.LIST.value, True),
    CLEAN: ArmSpec(CLEAN, RL360_RULES, False),
}


def parse_compare(value: str) -> list[str]:
    """The arms a `--compare` value runs, rl360's first: "upstream", optionally with "rl360-list"
    and "clean".

    A ValueError names `--compare` and the allowed arms."""
    names = [part.strip() for part in value.split(",") if part.strip()]
    unknown = [name for name in names if name not in COMPARABLE_ARMS]
    if unknown or not names:
        raise ValueError(
            f"--compare takes a comma-separated list of {', '.join(COMPARABLE_ARMS)}, got {value!r}"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"--compare names an arm twice: {value!r}")
    if UPSTREAM not in names:
        raise ValueError(f"--compare needs the {UPSTREAM!r} arm, got {value!r}")
    return [RL360, *names]


@dataclass(frozen=True)
class CompareRun:
    """One run of the A/B: which mode, arm and seed, and its whole `DemoConfig`."""

    mode: str
    arm: str
    seed: int
    config: DemoConfig


def _mode_free(arm: str, mode: str) -> bool:
    """Whether `arm`'s runs are the same in every mode without the crash tool (the clean arm's)."""
    return not ARMS[arm].faults and mode not in CRASH_MODES


def arm_config(base: DemoConfig, arm: str, mode: str, seed: int) -> DemoConfig:
    """One run's settings: `base` with the arm's rules and attribution, the seed, the mode, seeded
    sampling, its own folder (`OUT/<mode>/<arm>/seed-<seed>`; the clean arm outside the crash
    modes: `OUT/clean/seed-<seed>`); the clean arm has no faults (but the crash tool, in a crash mode)."""
    spec = ARMS[arm]
    folder = base.out / (arm if _mode_free(arm, mode) else f"{mode}/{arm}") / f"seed-{seed}"
    return dataclasses.replace(
        base,
        out=folder,
        rules=spec.rules,
        faults=base.faults if spec.faults else 0.0,
        fault_mode=mode if spec.faults or mode in CRASH_MODES else UNIFORM,
        seed=seed,
        seeded_sampling=True,
        attribution=spec.attribution,
    )


def compare_runs(base: DemoConfig, arms: Sequence[str], modes: Sequence[str], seeds: int) -> list[CompareRun]:
    """Every run, seed by seed (stopped early, every arm and mode has the same seeds): each mode's
    faulted arms (rl360-list only in the crash modes); the clean arm once per seed in the first
    mode without the crash tool (it is the same in each) and once in every crash mode."""
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"--seeds must be an integer >= 1, got {seeds!r}")
    if not modes:
        raise ValueError("--fault-modes needs at least one mode")
    if any(ARMS[arm].crash_modes_only for arm in arms) and not set(modes) & set(CRASH_MODES):
        raise ValueError(
            f"--compare {RL360_LIST} needs a --fault-modes mode with the crash tool "
            f"({', '.join(CRASH_MODES)}): elsewhere it is rl360's arm exactly"
        )
    plain = [mode for mode in modes if mode not in CRASH_MODES]
    runs = []
    for seed in range(base.seed, base.seed + seeds):
        for mode in modes:
            for arm in arms:
                if ARMS[arm].crash_modes_only and mode not in CRASH_MODES:
                    continue
                if _mode_free(arm, mode) and mode != plain[0]:
                    continue
                runs.append(CompareRun(mode, arm, seed, arm_config(base, arm, mode, seed)))
    return runs


def report_folders(runs: Sequence[CompareRun], modes: Sequence[str]) -> list[RunFolder]:
    """The report's (mode, arm, seed, folder) rows: the clean arm's runs without the crash tool
    under every mode without it."""
    folders = []
    for mode in modes:
        for run in runs:
            shared = _mode_free(run.arm, run.mode) and _mode_free(run.arm, mode)
            if run.mode == mode or shared:
                folders.append(RunFolder(mode, run.arm, run.seed, run.config.out))
    return folders


@dataclass
class CompareResult:
    out: Path
    runs: dict[tuple[str, str, int], DemoResult]
    wall_s: float
    report_path: Path
    json_path: Path
    summary: list[str]

    @property
    def problems(self) -> list[str]:
        return [
            f"{mode} {arm} seed {seed}: {problem}"
            for (mode, arm, seed), result in self.runs.items()
            for problem in result.problems
        ]


def run_compare(
    base: DemoConfig,
    arms: Sequence[str],
    modes: Sequence[str] = (LIVE_FAULT_MODES,),
    seeds: int = LIVE_SEEDS,
    console: Console | None = None,
) -> CompareResult:
    """Run every (seed, mode, arm) demo in turn, then write `compare.html` and `compare.json`."""
    console = console or make_console()
    runs = compare_runs(base, arms, modes, seeds)
    started = time.monotonic()
    console.print(
        f"rl360 demo --compare: {len(runs)} runs, one after the other (arms {', '.join(arms)}; modes "
        f"{', '.join(modes)}; seeds {base.seed}..{base.seed + seeds - 1}), faults {base.faults:g} "
        f"(clean: 0), output {base.out}"
    )
    results: dict[tuple[str, str, int], DemoResult] = {}
    with shared_ray():  # started once: each run's session servers and Harbor actors are its own
        for number, run in enumerate(runs, start=1):
            config = run.config
            mode = run.mode if ARMS[run.arm].faults else "no faults"
            console.rule(
                f"run {number}/{len(runs)}: seed {run.seed}, {mode}, {run.arm} (rules {config.rules}, "
                f"faults {config.faults:g}), {time.monotonic() - started:.0f} s in"
            )
            results[(run.mode, run.arm, run.seed)] = run_demo(config, console, reuse_ray=True)
    eval_dataset = TRAIN_GREEDY if base.eval_interval is not None else None
    report, numbers, document = write_compare(
        base.out, report_folders(runs, modes), base.steps, GOAL, eval_dataset
    )
    wall_s = time.monotonic() - started
    console.rule("fault A/B")
    title = f"fault A/B live: mean [95% t-interval] over {seeds} seeds ({base.steps} steps)"
    print_table(console, results_table(document["table"], title, GOAL))
    for line in document["summary"]:
        console.print(line)
    console.print(f"A/B done in {wall_s:.0f} s ({len(runs)} runs): {report}, {numbers}")
    return CompareResult(base.out, results, wall_s, report, numbers, document["summary"])
