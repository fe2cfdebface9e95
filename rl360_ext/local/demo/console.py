"""What the demo prints: the per-step lines (push, versions, train), the progress columns, the
summary and infrastructure tables, and the closing learning line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from rl360_ext.local.demo.summary import StepSummary
from rl360_ext.local.demo.trainer import CHANCE_LEVEL
from rl360_ext.local.demo.versions import AGE_BUCKETS

TRUST_METRICS = ("train/logprob_abs_diff_mean", "train/tis_clipfrac")


VERSION_METRIC_PREFIXES = ("staleness/", "kv/", "r3/")  # the trainer's version metrics


def push_line(version: str, after: str, metrics: Mapping[str, Any]) -> str:
    """One console line per weight push, from its `weights/*` metrics."""
    pause = metrics.get("weights/pause_s")
    fenced = metrics.get("weights/engines_fenced") or 0
    line = (
        f"weight push v{version}{after}: {metrics['weights/duration_s']:.2f} s "
        f"(paused {'n/a' if pause is None else f'{pause:.2f} s'}), path {metrics['weights/path']}, "
        f"reason {metrics['weights/reason']}, {metrics['weights/engines_reached']}/"
        f"{metrics['weights/engines_expected']} live engines reached, update calls per engine max "
        f"{metrics['weights/calls_per_engine_max']}, "
        f"stale-served tokens {metrics['weights/stale_served_tokens']}"
    )
    if fenced:
        line += f", {fenced} engine(s) fenced, {metrics['weights/attempts']} attempts"
    if metrics.get("weights/degraded"):
        line += " [bold red]DEGRADED[/] (calls per engine over 2x the path's rolling median)"
    return line


def version_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """The per-token version metrics of a train step, as the trainer logged them
    (`rl360_ext.train.staleness`: staleness/*, kv/*, r3/*)."""
    return {k: float(v) for k, v in metrics.items() if k.startswith(VERSION_METRIC_PREFIXES)}


def versions_line(step: int, figures: Mapping[str, float] | None) -> str:
    """One console line per train step: token ages, mixed versions, stale KV and R3 provenance of
    its trained samples (the trainer's metrics, `version_metrics`)."""
    if not figures or not figures.get("staleness/aged_tokens"):
        return f"versions step {step}: no trained token carries a version"

    def share(name: str) -> str:
        value = figures.get(name)
        return "-" if value is None else f"{value:.0%}"

    hist = " ".join(f"{b}:{share(f'staleness/token_age_hist/{b}')}" for b in AGE_BUCKETS)
    mean = figures.get("staleness/token_age_mean")
    return (
        f"versions step {step}: token age [{hist}] mean {'-' if mean is None else f'{mean:.2f}'}, "
        f"mixed-version samples {share('staleness/mixed_version_frac')}, "
        f"stale KV {share('kv/stale_prefix_tokens_frac')}, "
        f"R3 rows from a later prefill {share('r3/rows_from_later_prefill_frac')}"
    )


def train_line(step: int, metrics: dict[str, float], version: str) -> str:
    """One console line per train step: samples, the trust metrics, time, the weights written."""

    def value(name: str, fmt: str) -> str:
        number = metrics.get(name)
        return "-" if number is None else format(number, fmt)

    valid, masked = int(metrics.get("train/valid_samples", 0)), int(metrics.get("train/masked_samples", 0))
    if not valid:
        return f"train step {step}: no valid sample in the kept groups; weights v{version} unchanged"
    return (
        f"train step {step}: {valid} valid + {masked} masked samples; mismatch at the sampling version: "
        f"|Δ log p| mean {value('train/logprob_abs_diff_mean', '.1e')} max "
        f"{value('train/logprob_abs_diff_max', '.1e')} (first token of a turn "
        f"{value('train/logprob_abs_diff_first_token_mean', '.1e')}), top-k KL "
        f"{value('train/topk_kl', '.1e')} overlap {value('train/topk_overlap', '.3f')} TV <= "
        f"{value('train/tv_bound_max', '.1e')}, routing agreement "
        f"{value('train/routing_agreement', '.3f')}; policy lag: |Δ log p| mean "
        f"{value('train/policy_lag_abs_diff_mean', '.1e')} max "
        f"{value('train/policy_lag_abs_diff_max', '.1e')}, "
        f"KL {value('train/policy_lag_kl', '.1e')}; pg clip {value('train/pg_clipfrac', '.3f')}, TIS clip "
        f"{value('train/tis_clipfrac', '.3f')}, grad norm {value('train/grad_norm', '.2f')}, loss scale "
        f"{value('train/loss_scale', '.2f')}; {value('train/time_s', '.1f')} s -> weights v{version}"
    )


def harbor_pool_line(replicas: Sequence[Mapping[str, Any]], replacements: Sequence[Any]) -> str:
    """What each Harbor pool replica (a Ray actor) served, and how many the watchdog replaced."""
    served = ", ".join(
        f"replica {r['index']} (pid {r['pid']}, {r['url']}, generation {r['generation']}) {r['attempts']}"
        for r in replicas
    )
    return f"Harbor pool attempts served: {served}; replicas replaced by the watchdog: {len(replacements)}"


PROGRESS_COLUMNS = (
    TextColumn("[bold]{task.description}"),
    BarColumn(),
    MofNCompleteColumn(),
    TextColumn("{task.fields[phase]}"),
    TimeElapsedColumn(),
)


def summary_table(summaries: Sequence[StepSummary]) -> Table:
    def mean(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    table = Table(title="rl360 demo: per step")
    for column in (
        "step", "attempts", "valid", "infra", "kept groups",
        "mean (all)", "mean (kept)", "rollout s", "train s", "weights", "push after", "gate",
    ):  # fmt: skip
        table.add_column(column, justify="left" if column.startswith(("weights", "push")) else "right")
    for s in summaries:
        version = ",".join(s.versions_seen) or "-"
        version_cell = (
            version if not s.version_problems else f"[bold red]{version} (expected {s.expected_version})[/]"
        )
        push = "-" if s.push_duration_s is None else f"v{s.push_version} in {s.push_duration_s:.2f} s"
        if s.push_complete is False:
            push = f"[bold red]{push} INCOMPLETE[/]"
        table.add_row(
            str(s.step),
            str(s.attempts),
            str(s.valid),
            str(s.infra),
            f"{s.kept_groups}/{s.groups}",
            mean(s.unfiltered_mean),
            mean(s.kept_mean),
            seconds(s.rollout_time_s),
            seconds(s.train_time_s),
            version_cell,
            push,
            s.gate or "-",
        )
    return table


def infra_table(summaries: Sequence[StepSummary]) -> Table | None:
    """Infrastructure failures by cause (rows) and step (columns); None when there were none."""
    causes = sorted({cause for s in summaries for cause in s.infra_by_cause})
    if not causes:
        return None
    table = Table(title="infrastructure failures by cause (masked, out of every mean)")
    table.add_column("cause")
    for s in summaries:
        table.add_column(f"step {s.step}", justify="right")
    for cause in causes:
        table.add_row(f"infra:{cause}", *(str(s.infra_by_cause.get(cause, 0)) for s in summaries))
    return table


def learning_line(summaries: Sequence[StepSummary], wall_s: float, goal: float = 0.8) -> str:
    """Where the policy got: first and last unfiltered means, the first step at `goal`, time split."""
    means = [(s.step, s.unfiltered_mean) for s in summaries if s.unfiltered_mean is not None]
    if not means:
        return "learning: no step had a valid attempt"
    reached = next((step for step, mean in means if mean >= goal), None)
    rollout = sum(s.rollout_time_s or 0.0 for s in summaries)
    train = sum(s.train_time_s or 0.0 for s in summaries)
    goal_text = f"first at >= {goal:g} in step {reached}" if reached is not None else f"never >= {goal:g}"
    return (
        f"learning: unfiltered mean {means[0][1]:.3f} (step {means[0][0]}) -> {means[-1][1]:.3f} "
        f"(step {means[-1][0]}), best {max(m for _, m in means):.3f}, {goal_text}; chance "
        f"{CHANCE_LEVEL:.2f}; {wall_s:.0f} s wall; rollouts {rollout:.0f} s, training {train:.0f} s "
        "(training overlaps the next rollout)"
    )
