"""The step report's staleness charts: token-age shares and version-mix shares per train step."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from rl360_ext.diagnostics.report import main
from rl360_ext.diagnostics.report_data import TRAIN_KIND
from rl360_ext.rollout.metrics import append_records
from rl360_ext.sglang.versions import UNVERSIONED, VERSIONS_KEY, RoutingSource
from rl360_ext.train.staleness import TURN_CACHED_TOKENS, TURN_OUTPUT_START, sample_staleness_metrics

from .report_fixtures import parse_page, write_run

U = UNVERSIONED


def _sample(versions: list[int], kv: list[int]) -> SimpleNamespace:
    n = 2 + len(versions)
    return SimpleNamespace(
        tokens=list(range(n)),
        response_length=len(versions),
        loss_mask=None,
        group_index=0,
        metadata={
            VERSIONS_KEY: {
                "token_version": [U, U, *versions],
                "kv_version": kv,
                "routing_source": [int(RoutingSource.PREFILL)] + [int(RoutingSource.REPREFILL)] * (n - 2),
                "turn_first_version": [versions[0]],
                TURN_OUTPUT_START: [2],
                TURN_CACHED_TOKENS: [0],
            }
        },
    )


def _train_record(step: int, metrics: dict) -> dict:
    return {"kind": TRAIN_KIND, "rollout_id": step, "metrics": metrics}


def _page(tmp_path: Path):
    main(tmp_path, None)
    return parse_page((tmp_path / "report.html").read_text(encoding="utf-8"))


def test_train_records_with_versions_chart_the_age_shares_and_version_mix(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    write_run(path, steps=2, groups=2, train=False)
    # step 0: ages 0, 0 (trainer 1, tokens v1); step 1: ages 1, 3 (trainer 3, tokens v2, v0), mixed
    first = sample_staleness_metrics([_sample([1, 1], [1, 1, 1, 1])], trainer_version=1)
    second = sample_staleness_metrics([_sample([2, 0], [0, 2, 2, 0])], trainer_version=3)
    append_records(path, [_train_record(0, first), _train_record(1, second)])
    page = _page(tmp_path)
    ages = page.charts["chart-staleness-age"]
    assert ages.values("age 0") == pytest.approx({"0": 1.0})  # a bar of 0 is not drawn
    assert ages.values("age 1") == pytest.approx({"1": 0.5})
    assert ages.values("age 3") == pytest.approx({"1": 0.5})
    assert ages.values("age 2") == ages.values("age 4+") == {}
    header, *rows = ages.tables[0]
    assert header[:4] == ["rollout step", "age mean", "age p90", "age max"]
    assert [row[:4] for row in rows] == [["0", "0", "0", "0"], ["1", "2", "3", "3"]]
    shares = page.charts["chart-staleness-shares"]
    assert shares.values("mixed-version samples") == pytest.approx({"0": 0.0, "1": 1.0})
    assert shares.values("stale KV context") == pytest.approx({"0": 0.0, "1": 0.5})  # kv 0 < v2 at 1 of 2
    assert shares.values("R3 rows from a later prefill") == pytest.approx({"0": 1.0, "1": 1.0})


def test_a_run_without_version_arrays_shows_no_staleness_section(tmp_path: Path) -> None:
    write_run(tmp_path / "metrics.jsonl", steps=2, groups=2)  # train records without staleness metrics
    page = _page(tmp_path)
    assert "chart-trust" in page.charts
    assert not [chart for chart in page.charts if chart.startswith("chart-staleness")]


def test_miles_step_records_carry_the_buffer_metrics(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    step = {
        "kind": "step",
        "rollout_id": 4,
        "metrics": {},
        "miles_metrics": {"kv/stale_prefix_tokens_frac": 0.25, "staleness/token_age_hist/4+": 1.0},
    }
    append_records(path, [step])
    page = _page(tmp_path)
    assert page.charts["chart-staleness-shares"].values("stale KV context") == {"4": 0.25}
    assert page.charts["chart-staleness-age"].values("age 4+") == {"4": 1.0}
