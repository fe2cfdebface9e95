"""`rl360 demo --compare schedules`: the demo once per schedule side (one-step-off, in-flight
under each pause mode), same seed and settings, then the trainer's version figures side by side.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from rl360_ext.local.demo.modes import IN_FLIGHT, ONE_STEP_OFF
from rl360_ext.local.demo.plan import PAUSE_MODES, DemoConfig
from rl360_ext.local.demo.run import DemoResult, run_demo
from rl360_ext.local.demo.summary import StepSummary
from rl360_ext.local.demo.versions import AGE_BUCKETS
from rl360_ext.local.stack import shared_ray
from rl360_ext.util.console import make_console, print_table

COMPARE_FILE = "compare.json"


def _weighted(steps: Sequence[StepSummary], name: str, weight: str | None) -> float | None:
    """`name` over the steps that report it, weighted by the step's `weight` metric (its
    population: tokens, rows) or, with None, each step alike."""
    total = weights = 0.0
    for s in steps:
        figures = s.versions or {}
        if (value := figures.get(name)) is None:
            continue
        w = 1.0 if weight is None else figures.get(weight, 0.0)
        total, weights = total + value * w, weights + w
    return total / weights if weights else None


def _mid_rollout(in_flight: dict[str, Any] | None) -> bool:
    """Whether an in-flight push went out while its rollout's trajectories were under way: the
    engines were generating, or had answered a request of it, and the rollout was not done."""
    if not in_flight or in_flight.get("rollout_done"):
        return False
    return in_flight.get("running_requests", 0) > 0 or in_flight.get("requests_answered", 0) > 0


def schedule_figures(result: DemoResult) -> dict[str, Any]:
    """One schedule's side of `--compare schedules`, from its step summaries (the trainer's
    version metrics per step, pooled over steps by their populations)."""
    steps = result.summaries
    hist: Counter[str] = Counter()
    for s in steps:
        figures = s.versions or {}
        aged = figures.get("staleness/aged_tokens", 0.0)
        for bucket in AGE_BUCKETS:
            hist[bucket] += round(figures.get(f"staleness/token_age_hist/{bucket}", 0.0) * aged)

    def trust(name: str) -> float | None:
        values = [v for s in steps if s.trust and (v := s.trust.get(name)) is not None and not math.isnan(v)]
        return sum(values) / len(values) if values else None

    rollout = [s.rollout_time_s for s in steps if s.rollout_time_s is not None]
    later = "r3/rows_from_later_prefill_frac"
    return {
        "wall_s": result.wall_s,
        "loop_s_per_step": result.loop_s / len(steps) if steps and result.loop_s else None,
        "engine_idle_share": result.engine_idle_share,
        "rollout_s_mean": sum(rollout) / len(rollout) if rollout else None,
        "pushes_mid_rollout": sum(1 for p in result.pushes if _mid_rollout(p.get("in_flight"))),
        "token_age_hist": {bucket: hist.get(bucket, 0) for bucket in AGE_BUCKETS},
        "token_age_mean": _weighted(steps, "staleness/token_age_mean", "staleness/aged_tokens"),
        "mixed_version_frac": _weighted(steps, "staleness/mixed_version_frac", None),
        "stale_kv_frac": _weighted(steps, "kv/stale_prefix_tokens_frac", "kv/context_tokens"),
        "r3_later_prefill_frac": _weighted(steps, later, "r3/rows"),
        "r3_later_prefill_frac_cache_hit": _weighted(steps, f"{later}/cache_hit", None),
        "r3_later_prefill_frac_cache_miss": _weighted(steps, f"{later}/cache_miss", None),
        "logprob_abs_diff_mean": trust("train/logprob_abs_diff_mean"),
        "tis_clipfrac": trust("train/tis_clipfrac"),
        "learning_curve": [s.unfiltered_mean for s in steps],
        "problems": len(result.problems),
    }


def compare_table(figures: dict[str, dict[str, Any]]) -> Table:
    """The schedules side by side."""
    table = Table(title="schedules compared")
    table.add_column("figure", justify="left")
    for name in figures:
        table.add_column(name, justify="right")

    def cell(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.3f}"
        if isinstance(value, dict):
            return " ".join(f"{k}:{v}" for k, v in value.items())
        if isinstance(value, list):
            return " ".join("-" if v is None else f"{v:.2f}" for v in value)
        return str(value)

    first = next(iter(figures.values()))
    for key in first:
        table.add_row(key, *(cell(side[key]) for side in figures.values()))
    return table


def schedule_sides() -> list[tuple[str, str, str]]:
    """(side name, schedule, pause mode) of `--compare schedules`: one-step-off, then in-flight
    under each pause mode (the pause mode only matters when a push lands mid-rollout)."""
    sides = [(ONE_STEP_OFF, ONE_STEP_OFF, PAUSE_MODES[0])]
    sides += [(f"{IN_FLIGHT} {mode}", IN_FLIGHT, mode) for mode in PAUSE_MODES]
    return sides


def compare_schedules(config: DemoConfig, console: Console | None = None) -> dict[str, dict[str, Any]]:
    """`rl360 demo --compare schedules`: the demo once per side of `schedule_sides`
    (OUT/<schedule>[-<pause mode>]), same seed and settings, then the figures side by side
    (printed, and written to OUT/compare.json)."""
    console = console or make_console()
    figures: dict[str, dict[str, Any]] = {}
    with shared_ray():  # started once for the sides, each with its own session servers
        for side, schedule, mode in schedule_sides():
            folder = config.out / side.replace(" ", "-")
            side_config = dataclasses.replace(config, out=folder, schedule=schedule, pause_mode=mode)
            figures[side] = schedule_figures(run_demo(side_config, console, reuse_ray=True))
    print_table(console, compare_table(figures))
    config.out.mkdir(parents=True, exist_ok=True)
    (config.out / COMPARE_FILE).write_text(json.dumps(figures, indent=2) + "\n")
    return figures
