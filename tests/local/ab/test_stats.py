"""The fault A/B's statistics (`rl360_ext.local.ab.stats`), shared by `rl360 ab` and
`rl360 demo --compare`: the t-interval, paired differences, one run's figures (censoring), the
per-mode table and the summary sentences read from the intervals."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.local.ab.stats import (
    METRICS,
    Interval,
    comparison_sentence,
    curve_figures,
    interval,
    paired_interval,
    summarize,
    summary_sentences,
    t_quantile,
    table_rows,
)

UNIFORM, RL360, UPSTREAM = "uniform", "rl360", "upstream"


def test_interval_matches_the_t_formula() -> None:
    result = interval([1.0, 2.0, 3.0, 4.0, 5.0])
    half = 2.776 * math.sqrt(2.5) / math.sqrt(5)
    assert (result.mean, result.low, result.high, result.n) == pytest.approx((3.0, 3 - half, 3 + half, 5))
    assert interval([2.0]).low == interval([2.0]).high == 2.0
    assert interval([1.0, math.nan, 3.0]).n == 2
    with pytest.raises(ValueError):
        interval([math.nan])
    paired = paired_interval([2.0, 3.0, 4.0], [1.0, 2.0, 3.0])
    assert paired.mean == 1.0 and paired.low == paired.high == 1.0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-100, 100, allow_nan=False), min_size=2, max_size=30),
    st.floats(-50, 50, allow_nan=False),
)
def test_interval_holds_the_mean_and_moves_with_a_shift(values: list[float], shift: float) -> None:
    result = interval(values)
    assert result.low <= result.mean <= result.high
    moved = interval([v + shift for v in values])
    assert moved.mean == pytest.approx(result.mean + shift, abs=1e-6)
    assert moved.high - moved.low == pytest.approx(result.high - result.low, rel=1e-6, abs=1e-6)


@given(st.integers(1, 500))
def test_t_quantile_is_above_the_normal_and_falls_with_df(df: int) -> None:
    assert t_quantile(df) >= 1.959964 - 1e-9
    assert t_quantile(df + 1) <= t_quantile(df) + 1e-12


def test_summary_sentence_reads_the_intervals() -> None:
    a = Interval(0.7, 0.6, 0.8, 10, 0.1)
    b = Interval(0.5, 0.45, 0.55, 10, 0.1)
    c = Interval(0.75, 0.65, 0.85, 10, 0.1)
    assert "no difference detected" in comparison_sentence("final_mean", "upstream", "rl360", a, c)
    assert "upstream is higher than rl360" in comparison_sentence("final_mean", "upstream", "rl360", a, b)
    assert "rl360 reaches the goal sooner than upstream" in comparison_sentence(
        "steps_to_goal", "upstream", "rl360", a, b
    )
    table = {
        UNIFORM: {
            RL360: {m: dataclasses.asdict(b) for m in METRICS},
            UPSTREAM: {m: dataclasses.asdict(c) for m in METRICS},
        }
    }
    (line,) = summary_sentences(table)
    assert line.startswith("uniform, upstream vs rl360:") and "no difference" not in line


def test_curve_figures_censor_a_run_that_never_reaches_the_goal() -> None:
    curve = list(enumerate([0.2, 0.5, 0.7, 0.6, None, 0.75]))
    figures = curve_figures(curve, [1.0, None, 0.5], [0.0, 0.2], math.nan, 6, 0.8)
    assert figures["steps_to_goal"] == 6 and figures["censored"] == 1
    assert figures["auc"] == pytest.approx(np.mean([0.2, 0.5, 0.7, 0.6, 0.75]))
    assert figures["final_mean"] == pytest.approx(0.75)  # steps 4 (no valid attempt) and 5
    assert figures["gradient_scale"] == pytest.approx(0.75) and figures["advantage_shift"] == pytest.approx(
        0.1
    )
    assert math.isnan(figures["eval_pass"])  # no eval: no number, not 0
    assert curve_figures(curve, [], [], 0.5, 6, 0.7)["steps_to_goal"] == 2
    assert math.isnan(curve_figures(curve, [None], [], 0.5, 6, 0.7)["gradient_scale"])


def _record(mode: str, arm: str, seed: int, final: float, eval_pass: float = math.nan) -> dict[str, object]:
    figures = dict.fromkeys(METRICS, 0.5) | {"final_mean": final, "censored": 0.0, "eval_pass": eval_pass}
    return {"mode": mode, "arm": arm, "seed": seed, "figures": figures}


def test_summarize_pairs_by_seed_and_leaves_out_a_metric_no_run_has() -> None:
    records = [
        _record(UNIFORM, RL360, 0, 0.4),
        _record(UNIFORM, UPSTREAM, 0, 0.6),
        _record(UNIFORM, RL360, 1, 0.5),
        _record(UNIFORM, UPSTREAM, 1, 0.8),
        _record(UNIFORM, RL360, 2, 0.6),
        _record(UNIFORM, UPSTREAM, 2, 0.7),
    ]
    table = summarize(records)
    entry = table[UNIFORM][UPSTREAM]
    assert entry["seeds"] == 3 and entry["eval_pass"] is None and "eval_pass_minus_rl360" not in entry
    diff = entry["final_mean_minus_rl360"]
    assert diff["mean"] == pytest.approx((0.2 + 0.3 + 0.1) / 3) and diff["n"] == 3
    (row_rl360, row_upstream) = table_rows(table)
    assert row_upstream[:3] == (UNIFORM, UPSTREAM, "3") and row_upstream[6] == "-"  # no eval
    assert row_rl360[5].startswith("0.500 [")
    (line,) = summary_sentences(table)
    assert "eval pass" not in line and "area under the curve: no difference detected" in line


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(0, 1), min_size=2, max_size=8),
    st.lists(st.floats(0, 1), min_size=2, max_size=8),
    st.permutations(range(16)),
)
def test_the_table_does_not_depend_on_the_order_runs_arrive_in(
    ours: list[float], theirs: list[float], order: list[int]
) -> None:
    n = min(len(ours), len(theirs))
    records = [_record(UNIFORM, RL360, s, ours[s]) for s in range(n)]
    records += [_record(UNIFORM, UPSTREAM, s, theirs[s]) for s in range(n)]
    shuffled = [records[i] for i in order if i < len(records)]
    assert summarize(shuffled) == summarize(records)
    paired = summarize(records)[UNIFORM][UPSTREAM]["final_mean_minus_rl360"]
    assert paired["mean"] == pytest.approx(np.mean(theirs[:n]) - np.mean(ours[:n]), abs=1e-9)


def test_one_seed_gives_no_interval_and_no_verdict() -> None:
    one, other = interval([1.0]), interval([0.5])
    sentence = comparison_sentence("gradient_scale", UPSTREAM, RL360, other, one)
    assert sentence == "gradient scale: no interval from one seed (upstream 0.5, rl360 1)"
    many = interval([0.4, 0.5, 0.6])
    assert "no interval from one seed" in comparison_sentence("auc", UPSTREAM, RL360, many, one)
