"""Realistic runs for the step-report tests, written by the real hooks, and a reader for the page.

`write_run` drives the rl360 dynamic filter and metrics hook over duck-typed samples the way
Miles' rollout loop calls them (filter every group, log the kept ones), appends weight-push
records built with the real `WeightPush`, and keeps a brute-force account of what should appear
on each chart, computed from the samples and the filter's decisions, not from the JSONL.
`parse_page` reads the marks, no-data notes and tables back out of the HTML; `CHARTS` lists the
chart sections every page must hold.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rl360_ext.outcomes.provenance import PHASE_TIMINGS
from rl360_ext.rollout.filters import check_valid_reward_nonzero_std
from rl360_ext.rollout.metrics import REGISTRY, append_records, log_rollout_metrics
from rl360_ext.weights.push import FANOUT_PATH, WeightPush

from ..rollout.duck_samples import DuckSample, infra, valid

FILTER = "rl360_ext.rollout.filters.check_valid_reward_nonzero_std"
CAUSES = ("no_sandbox", "verifier_crash", "no_engine_available", "client_deadline")
ENGINES = ("http://127.0.0.1:30001", "http://127.0.0.1:30002")
# Every chart section the step report must hold, named independently of rl360_ext.diagnostics.report.
CHARTS = (
    "chart-outcomes",
    "chart-rewards",
    "chart-learning",
    "chart-trust",
    "chart-phases",
    "chart-occupancy",
    "chart-infra",
    "chart-task-health",
    "chart-cache",
    "chart-routing",
    "chart-pushes",
    "chart-push-calls",
    "chart-push-engines",
)


@dataclass
class Expected:
    """What each chart should show, per rollout step, from the samples themselves."""

    outcomes: dict[int, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    causes: dict[int, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    unfiltered_mean: dict[int, float | None] = field(default_factory=dict)
    kept_mean: dict[int, float | None] = field(default_factory=dict)
    cache_hit: dict[int, float] = field(default_factory=dict)
    routing_bytes: dict[int, int] = field(default_factory=dict)
    phase_totals: dict[tuple[int, int], float] = field(default_factory=dict)  # (step, index) -> seconds
    phase_values: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    occupancy: dict[int, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    pushes: list[dict[str, Any]] = field(default_factory=list)
    train: list[dict[str, Any]] = field(default_factory=list)
    attempts: int = 0
    valid: int = 0
    trained: int = 0
    masked: int = 0


def _phases(rng: random.Random, cause: str | None) -> dict[str, float | None]:
    timings: dict[str, float | None] = {
        "queue": round(rng.uniform(0.0, 2.0), 3),
        "environment_setup": round(rng.uniform(1.0, 5.0), 3),
        "agent_setup": round(rng.uniform(0.5, 2.0), 3),
        "agent": round(rng.uniform(5.0, 60.0), 3),
        "verifier": round(rng.uniform(0.5, 3.0), 3),
    }
    if cause == "no_sandbox":
        timings.update(agent_setup=None, agent=None, verifier=None)
    elif cause == "client_deadline":
        timings.update(agent=120.0, verifier=None)
    if timings["agent"] is not None:  # the session server's share of the agent phase: model time
        timings["model"] = round(timings["agent"] * rng.uniform(0.4, 0.9), 3)
    return timings


def _sample(
    rng: random.Random, group: int, index: int, pass_rate: float, cause: str | None, routing: bool
) -> DuckSample:
    domain = "python" if group % 2 else "rust"
    if cause is None:
        sample = valid(group, index, 1.0 if rng.random() < pass_rate else 0.0, domain=domain)
    else:
        sample = infra(group, index, cause, domain=domain)
    prompt = rng.randint(2_000, 20_000)
    sample.metadata[PHASE_TIMINGS] = _phases(rng, cause)
    sample.metadata["timeline"] = {"received_at": 1_800_000_000.0 + group * 0.5 + rng.uniform(0.0, 1.0)}
    sample.metadata["prompt_tokens"] = prompt
    sample.metadata["cached_tokens"] = int(prompt * rng.uniform(0.1, 0.9))
    if routing:
        sample.metadata["routing_bytes"] = prompt * 48 * 8 * 4
    return sample


def _causes(rng: random.Random, size: int, infra_rate: float, outage: bool) -> list[str | None]:
    """Per attempt an infra cause or None; an outage takes down all but one sandbox of the group."""
    if outage:
        return [*["no_sandbox"] * (size - 1), None]
    return [rng.choice(CAUSES) if rng.random() < infra_rate else None for _ in range(size)]


def write_run(
    path: Path,
    *,
    steps: int = 4,
    groups: int = 8,
    group_size: int = 4,
    seed: int = 7,
    attempt_lines: bool = True,
    pushes: bool = True,
    routing: bool = True,
    train: bool = True,
) -> Expected:
    """Write a run's metrics JSONL through the real filter and log hook; return what it should show."""
    rng = random.Random(seed)
    expected = Expected()
    args = SimpleNamespace(
        reward_key=None,
        dynamic_sampling_filter_path=FILTER,
        rl360_metrics_path=str(path),
        rl360_metrics_attempts=attempt_lines,
    )
    batch_groups = groups - 2
    REGISTRY.drain()
    index = 0
    for step in range(steps):
        pass_rate, infra_rate = min(0.3 + 0.15 * step, 0.9), 0.15
        trained: list[DuckSample] = []
        seen: list[DuckSample] = []
        for g in range(groups):
            causes = _causes(rng, group_size, infra_rate, outage=step == 1 and g == 0)
            group = [_sample(rng, g, index + i, pass_rate, causes[i], routing) for i in range(group_size)]
            index += group_size
            verdict = check_valid_reward_nonzero_std(args, group)
            used = verdict.keep and len(trained) < batch_groups * group_size
            if used:
                trained.extend(group)
            seen.extend(group)
            for sample in group:
                _account(expected, step, sample, verdict.keep, used, verdict.reason)
        log_rollout_metrics(step, args, trained, {}, 30.0 + step)
        _account_step(expected, step, seen, trained)
        if pushes and step < steps - 1:
            push = WeightPush(
                path=FANOUT_PATH,
                weight_version=str(step + 1),
                model_path=f"/tmp/weights/v{step + 1}",
                duration_s=0.5 + 0.25 * step,
                engines_targeted=len(ENGINES),
                engines_reached=len(ENGINES),
                update_calls_per_engine={url: 1 + (step if n else 0) for n, url in enumerate(ENGINES)},
                control_calls_per_engine={url: 3 for url in ENGINES},
                engine_versions={url: str(step + 1) for url in ENGINES},
            )
            record = {"kind": "weight_push", "rollout_id": step, **push.to_dict()}
            append_records(path, [record])
            expected.pushes.append(record)
        if train:
            metrics = {
                "train/logprob_abs_diff_mean": 0.001 * (step + 1),
                "train/logprob_abs_diff_max": 0.01 * (step + 1),
                "train/logprob_abs_diff_first_token_mean": 0.002 * (step + 1),
                "train/routing_agreement": 1.0 - 0.01 * step,
                "train/policy_lag_abs_diff_mean": 0.5 + 0.1 * step,
                "train/policy_lag_abs_diff_max": 5.0 + step,
                "train/policy_lag_kl": 0.05 * (step + 1),
                "train/pg_clipfrac": 0.02 * step,
                "train/tis_clipfrac": 0.0,
                "train/grad_norm": 1.5,
                "train/loss_scale": 1.0,
                "train/valid_samples": 28.0,
                "train/masked_samples": 4.0,
                "train/time_s": 2.0,
            }
            record = {"kind": "train", "rollout_id": step, "metrics": metrics, "chance_level": 0.25}
            append_records(path, [record])
            expected.train.append(record)
    return expected


def _account(
    expected: Expected, step: int, sample: DuckSample, keep: bool, used: bool, reason: str | None
) -> None:
    cls = sample.metadata["attempt_class"]
    timings = sample.metadata[PHASE_TIMINGS]
    expected.occupancy[step].append(timings)
    harbor = {phase: seconds for phase, seconds in timings.items() if phase != "model"}
    expected.phase_totals[(step, sample.index)] = sum(v for v in harbor.values() if v is not None)
    for phase, seconds in harbor.items():
        if seconds is not None:
            expected.phase_values[phase].append(seconds)
    if cls != "valid":
        expected.outcomes[step]["infrastructure failure"] += 1
        expected.causes[step][cls.split(":", 1)[1]] += 1
        return
    passed = sample.reward > 0
    if used:
        label = "passed (reward > 0)" if passed else "failed (reward ≤ 0)"
    elif keep:
        label = "unused (batch already full)"
    elif reason == "zero_std_valid":
        label = "group dropped: all passed" if passed else "group dropped: all failed"
    else:
        label = "group dropped: < 2 valid rewards"
    expected.outcomes[step][label] += 1


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _account_step(expected: Expected, step: int, seen: list[DuckSample], trained: list[DuckSample]) -> None:
    def is_valid(s: DuckSample) -> bool:
        return s.metadata["attempt_class"] == "valid"

    expected.unfiltered_mean[step] = _mean([s.reward for s in seen if is_valid(s)])
    expected.kept_mean[step] = _mean([s.reward for s in trained if is_valid(s)])
    expected.cache_hit[step] = sum(s.metadata["cached_tokens"] for s in seen) / sum(
        s.metadata["prompt_tokens"] for s in seen
    )
    if "routing_bytes" in seen[0].metadata:
        expected.routing_bytes[step] = sum(s.metadata["routing_bytes"] for s in seen)
    expected.attempts += len(seen)
    expected.valid += sum(1 for s in seen if is_valid(s))
    expected.trained += len(trained)
    expected.masked += sum(1 for s in trained if not is_valid(s))


# ---- reading the page back ------------------------------------------------------------------------


@dataclass
class Chart:
    marks: list[dict[str, str]] = field(default_factory=list)
    no_data: list[str] = field(default_factory=list)
    ok_notes: list[str] = field(default_factory=list)
    legend: list[str] = field(default_factory=list)
    tables: list[list[list[str]]] = field(default_factory=list)
    svgs: int = 0

    def values(self, series: str) -> dict[str, float]:
        return {m["data-x"]: float(m["data-value"]) for m in self.marks if m["data-series"] == series}


@dataclass
class Page:
    charts: dict[str, Chart] = field(default_factory=dict)
    summary: dict[str, str] = field(default_factory=dict)
    tags: Counter[str] = field(default_factory=Counter)
    attributes: list[tuple[str, str, str]] = field(default_factory=list)  # (tag, name, value)


class _PageParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.page = Page()
        self.chart: Chart | None = None
        self.depth = 0  # nesting of <section> inside the current chart
        self.capture: str | None = None  # "no-data" | "empty-ok" | "legend" | "cell" | "summary-th" | ...
        self.text: list[str] = []
        self.row: list[str] | None = None
        self.summary_key: str | None = None
        self.in_summary = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.page.tags[tag] += 1
        self.page.attributes.extend((tag, k, v) for k, v in a.items())
        classes = a.get("class", "").split()
        if tag == "section" and ("chart" in classes or "table" in classes):
            self.chart = self.page.charts.setdefault(a["id"], Chart())
        if tag == "table" and a.get("id") == "summary":
            self.in_summary = True
        if self.chart is None and not self.in_summary:
            return
        if tag == "svg" and self.chart is not None:
            self.chart.svgs += 1
        if "mark" in classes and self.chart is not None:
            self.chart.marks.append(a)
        if tag == "p" and ("no-data" in classes or "empty-ok" in classes):
            self.capture, self.text = classes[0], []
        if tag == "li" and self.chart is not None:
            self.capture, self.text = "legend", []
        if tag == "table" and self.chart is not None:
            self.chart.tables.append([])
        if tag == "tr":
            self.row = []
        if tag in ("td", "th"):
            self.capture, self.text = "cell", []

    def handle_endtag(self, tag: str) -> None:
        text = "".join(self.text).strip()
        if tag in ("td", "th") and self.capture == "cell" and self.row is not None:
            self.row.append(text)
            self.capture = None
        elif tag == "tr" and self.row is not None:
            if self.in_summary and len(self.row) == 2:
                self.page.summary[self.row[0]] = self.row[1]
            elif self.chart is not None and self.chart.tables:
                self.chart.tables[-1].append(self.row)
            self.row = None
        elif tag == "table":
            self.in_summary = False
        elif tag == "p" and self.capture in ("no-data", "empty-ok") and self.chart is not None:
            (self.chart.no_data if self.capture == "no-data" else self.chart.ok_notes).append(text)
            self.capture = None
        elif tag == "li" and self.capture == "legend" and self.chart is not None:
            self.chart.legend.append(text)
            self.capture = None
        elif tag == "section":
            self.chart = None

    def handle_data(self, data: str) -> None:
        if self.capture is not None:
            self.text.append(data)


def parse_page(html: str) -> Page:
    parser = _PageParser()
    parser.feed(html)
    parser.close()
    return parser.page
