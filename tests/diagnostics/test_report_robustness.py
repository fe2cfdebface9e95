"""`rl360 report` on records with any field missing or null: a page with every chart, never a crash.

Each field the report reads is independently left out, set to null, or given a value of the right
type (hypothesis). The page must hold every chart section, each with drawn marks or one note
saying why not, and the outcome bars must account for every attempt line of their step.
"""

from __future__ import annotations

import math
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.diagnostics.report import render_report
from rl360_ext.diagnostics.report_data import PHASES, load_run
from rl360_ext.rollout.metrics import append_records

from .report_fixtures import CHARTS, parse_page

MISSING = object()

small_int = st.integers(min_value=0, max_value=4)
count = st.integers(min_value=0, max_value=50)
reward = st.sampled_from([0.0, 1.0]) | st.floats(min_value=-1, max_value=2, allow_nan=False)
seconds = st.floats(min_value=0, max_value=4000, allow_nan=False)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """The value, null, or the field left out."""
    return st.one_of(strategy, st.none(), st.just(MISSING))


def record(kind: str, **fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({name: maybe(s) for name, s in fields.items()}).map(
        lambda d: {"kind": kind, **{k: v for k, v in d.items() if v is not MISSING}}
    )


metrics = st.fixed_dictionaries(
    {
        name: maybe(strategy)
        for name, strategy in {
            "reward/unfiltered_mean": reward,
            "reward/kept_mean": reward,
            "audit/logged_mean_upstream": reward,
            "count/attempts": count,
            "count/valid": count,
            "count/infra": count,
            "count/infra/no_sandbox": count,
            "count/infra/client_deadline": count,
            "count/attribution/policy/verifier_timeout": count,
            "count/attribution/task/verifier_crash": count,
            "count/trained": count,
            "count/masked": count,
            "count/dropped_groups": count,
        }.items()
    }
).map(lambda d: {k: v for k, v in d.items() if v is not MISSING})

steps = record(
    "step",
    rollout_id=small_int,
    prefilter=st.sampled_from(["filter_hook", "no_filter", "unavailable"]),
    metrics=metrics,
)
attempts = record(
    "attempt",
    rollout_id=small_int,
    group_index=small_int,
    index=st.integers(min_value=0, max_value=1000),
    attempt_class=st.sampled_from(
        ["valid", "infra:no_sandbox", "infra:client_deadline", "infra:unclassified"]
    ),
    reward=reward,
    filter=st.sampled_from(["kept", "dropped", "unused"]),
    dropped_reason=st.sampled_from(["zero_std_valid", "insufficient_valid_rewards", "check_no_aborted"]),
    trained=st.booleans(),
    phase_timings=st.dictionaries(st.sampled_from([*PHASES, "total"]), st.none() | seconds, max_size=6),
    cached_tokens=count,
    prompt_tokens=count,
    routing_bytes=st.integers(min_value=0, max_value=10**9),
)
pushes = record(
    "weight_push",
    rollout_id=small_int,
    path=st.sampled_from(["smg_fanout:update_weights_from_disk", "broadcast"]),
    weight_version=st.sampled_from(["1", "2", 3]),
    duration_s=seconds,
    engines_targeted=count,
    engines_reached=count,
    update_calls_per_engine=st.dictionaries(st.sampled_from(["http://a:1", "http://b:2"]), st.none() | count),
    control_calls_per_engine=st.dictionaries(st.sampled_from(["http://a:1", "http://b:2"]), count),
    failures=st.lists(st.just({"url": "http://a:1", "status": 503}), max_size=2),
    complete=st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(records=st.lists(steps | attempts | pushes, max_size=25))
def test_any_missing_or_null_field_still_gives_every_chart(records: list[dict[str, Any]]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "metrics.jsonl"
        append_records(path, records)
        run = load_run(path)
        page = parse_page(render_report(run))

    assert set(page.charts) - {"push-table"} == set(CHARTS)
    for chart_id in CHARTS:
        chart = page.charts[chart_id]
        notes = len(chart.no_data) + len(chart.ok_notes)
        assert (chart.svgs > 0) != (notes == 1 and chart.svgs == 0), (chart_id, chart)
        assert chart.svgs == 0 or chart.marks, f"{chart_id}: an axis with nothing drawn on it"
        for mark in chart.marks:
            assert math.isfinite(float(mark["data-value"])), (chart_id, mark)

    outcome_marks = page.charts["chart-outcomes"].marks
    placed = Counter(
        r["rollout_id"] for r in records if r["kind"] == "attempt" and r.get("rollout_id") is not None
    )
    if placed:
        totals: Counter[str] = Counter()
        for mark in outcome_marks:
            totals[mark["data-x"]] += int(float(mark["data-value"]))
        assert totals == {str(k): v for k, v in placed.items()}
    unplaced = sum(1 for r in records if r["kind"] in ("step", "attempt") and r.get("rollout_id") is None)
    assert bool(unplaced) == any("without a rollout_id" in note for note in run.notes)
