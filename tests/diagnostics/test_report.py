"""`rl360 report`: every chart shows the numbers of a run written by the real filter and metrics hook.

The expected numbers come from the samples and the filter's decisions (report_fixtures), never
from the JSONL the report reads; the page is read back through its marks' data attributes.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest
from typer.testing import CliRunner

from rl360_ext.diagnostics.charts import format_number, format_seconds
from rl360_ext.diagnostics.report import main
from rl360_ext.diagnostics.report_data import find_metrics_file, load_run
from rl360_ext.diagnostics.report_rollout import SLOWEST_ATTEMPTS
from rl360_ext.diagnostics.report_style import OCCUPANCY_STYLE
from rl360_ext.rollout.metrics import (
    METRICS_ATTEMPTS_ENV,
    METRICS_PATH_ENV,
    REGISTRY,
    append_records,
    attempt_summary,
    log_rollout_metrics,
)
from rl360_ext.rollout.occupancy import step_occupancy
from rl360_ext.weights.push import FANOUT_PATH, WeightPush

from ..rollout.duck_samples import infra, valid
from .report_fixtures import CHARTS, ENGINES, Expected, Page, parse_page, write_run


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(METRICS_PATH_ENV, raising=False)
    monkeypatch.delenv(METRICS_ATTEMPTS_ENV, raising=False)
    REGISTRY.drain()
    yield
    REGISTRY.drain()


def build(tmp_path: Path, **options: object) -> tuple[Expected, Page]:
    expected = write_run(tmp_path / "metrics.jsonl", **options)  # type: ignore[arg-type]
    main(tmp_path, None)
    return expected, parse_page((tmp_path / "report.html").read_text(encoding="utf-8"))


@pytest.fixture
def full(tmp_path: Path) -> tuple[Expected, Page]:
    return build(tmp_path)


def drawn(page: Page, chart_id: str) -> dict[tuple[str, str], float]:
    """(x, series) -> value of every mark in a chart (each pair drawn at most once)."""
    marks = page.charts[chart_id].marks
    pairs = Counter((m["data-x"], m["data-series"]) for m in marks)
    assert max(pairs.values(), default=1) == 1, "a value was drawn twice"
    return {(m["data-x"], m["data-series"]): float(m["data-value"]) for m in marks}


def test_outcomes_per_step_match_the_samples_and_filter_decisions(full: tuple[Expected, Page]) -> None:
    expected, page = full
    want = {
        (str(step), label): n for step, counts in expected.outcomes.items() for label, n in counts.items()
    }
    assert drawn(page, "chart-outcomes") == want
    labels = {label for _, label in want}
    assert {
        "passed (reward > 0)",
        "failed (reward ≤ 0)",
        "group dropped: all passed",
        "group dropped: all failed",
        "group dropped: < 2 valid rewards",
        "unused (batch already full)",
        "infrastructure failure",
    } <= labels, "the fixture should exercise every outcome a real run has"
    totals = Counter()
    for counts in expected.outcomes.values():
        totals.update(counts)
    legend = page.charts["chart-outcomes"].legend
    assert f"passed (reward > 0) ({totals['passed (reward > 0)']:,})" in legend


def test_learning_chart_draws_the_unfiltered_mean_and_chance(full: tuple[Expected, Page]) -> None:
    expected, page = full
    chart = page.charts["chart-learning"]
    assert chart.values("unfiltered mean") == pytest.approx(
        {str(k): v for k, v in expected.unfiltered_mean.items()}
    )
    assert set(chart.values("chance").values()) == {0.25}


def test_trust_chart_and_table_show_every_train_record(full: tuple[Expected, Page]) -> None:
    expected, page = full
    chart = page.charts["chart-trust"]
    agreement = {str(r["rollout_id"]): r["metrics"]["train/routing_agreement"] for r in expected.train}
    assert chart.values("routing agreement") == pytest.approx(agreement)
    diffs = {str(r["rollout_id"]): r["metrics"]["train/logprob_abs_diff_max"] for r in expected.train}
    assert chart.values("|Δ log p| max") == pytest.approx(diffs)
    header, *rows = chart.tables[0]
    assert header[0] == "rollout step" and "loss scale" in header and "masked" in header
    assert [row[0] for row in rows] == [str(r["rollout_id"]) for r in expected.train]


def test_trust_section_keeps_mismatch_and_policy_lag_apart(full: tuple[Expected, Page]) -> None:
    """Mismatch (at the sampling version) and policy lag are two charts and two column groups."""
    expected, page = full
    chart = page.charts["chart-trust"]
    assert chart.svgs == 3  # fractions, mismatch, policy lag
    lag = {str(r["rollout_id"]): r["metrics"]["train/policy_lag_kl"] for r in expected.train}
    assert chart.values("lag KL") == pytest.approx(lag)
    first = {
        str(r["rollout_id"]): r["metrics"]["train/logprob_abs_diff_first_token_mean"] for r in expected.train
    }
    assert chart.values("first token of a turn") == pytest.approx(first)
    header = chart.tables[0][0]
    assert (
        header.index("lag |Δ log p| mean") > header.index("routing agreement") > header.index("|Δ log p| max")
    )


def test_a_run_without_train_records_says_so(tmp_path: Path) -> None:
    write_run(tmp_path / "metrics.jsonl", steps=2, groups=4, train=False)
    main(tmp_path, None)
    page = parse_page((tmp_path / "report.html").read_text(encoding="utf-8"))
    assert (
        page.charts["chart-trust"].marks == [] and "no train records" in page.charts["chart-trust"].no_data[0]
    )
    assert page.charts["chart-learning"].values("unfiltered mean")
    assert page.charts["chart-learning"].values("chance") == {}


def test_unfiltered_and_kept_means_per_step(full: tuple[Expected, Page]) -> None:
    expected, page = full
    chart = page.charts["chart-rewards"]
    assert chart.values("unfiltered mean") == pytest.approx(
        {str(k): v for k, v in expected.unfiltered_mean.items()}
    )
    assert chart.values("kept mean") == pytest.approx({str(k): v for k, v in expected.kept_mean.items()})
    assert chart.values("upstream logged mean"), "the upstream view is drawn for comparison"
    rows = chart.tables[0][1:]
    assert [row[0] for row in rows] == [str(k) for k in sorted(expected.kept_mean)]
    last = max(expected.kept_mean)
    gap = expected.kept_mean[last] - expected.unfiltered_mean[last]
    assert rows[-1][1:4] == [
        format_number(expected.unfiltered_mean[last]),
        format_number(expected.kept_mean[last]),
        f"{gap:+.3f}",
    ]


def test_occupancy_bars_are_each_steps_shares_of_in_flight_time(full: tuple[Expected, Page]) -> None:
    expected, page = full
    chart = page.charts["chart-occupancy"]
    for step, timings in expected.occupancy.items():
        shares = step_occupancy(timings)
        for phase, (label, _) in OCCUPANCY_STYLE.items():
            value = chart.values(label).get(str(step))
            assert value == pytest.approx(shares[f"occupancy/{phase}"]), (step, phase)
    assert chart.svgs == 2  # the shares per step, and the last step's in-flight timeline


def test_phase_bars_are_the_slowest_attempts_and_the_table_covers_all(full: tuple[Expected, Page]) -> None:
    expected, page = full
    chart = page.charts["chart-phases"]
    per_row: dict[str, float] = Counter()
    for mark in chart.marks:
        per_row[mark["data-x"]] += float(mark["data-value"])
    slowest = sorted(expected.phase_totals.values(), reverse=True)[:SLOWEST_ATTEMPTS]
    assert sorted(per_row.values(), reverse=True) == pytest.approx(slowest)
    for row, total in per_row.items():
        step, index = int(row.split()[1]), int(row.split("#")[1].split()[0])
        assert total == pytest.approx(expected.phase_totals[(step, index)])
    table = {row[0]: row for row in chart.tables[0][1:]}
    agent = expected.phase_values["agent"]
    assert table["agent"][1:4] == [
        f"{len(agent):,}",
        format_seconds(statistics.median(agent)),
        format_seconds(statistics.quantiles(agent, n=10, method="inclusive")[-1]),
    ]
    assert table["sandbox setup"][1] == f"{len(expected.phase_values['environment_setup']):,}"


def test_infra_failures_by_cause_per_step(full: tuple[Expected, Page]) -> None:
    expected, page = full
    want = {(str(step), cause): n for step, counts in expected.causes.items() for cause, n in counts.items()}
    assert drawn(page, "chart-infra") == want


def test_prefix_cache_hit_rate_and_routing_bytes(full: tuple[Expected, Page]) -> None:
    expected, page = full
    hit = page.charts["chart-cache"].values("prefix-cache hit rate")
    assert hit == pytest.approx({str(k): v for k, v in expected.cache_hit.items()})
    assert page.charts["chart-routing"].values("routing bytes") == {
        str(k): float(v) for k, v in expected.routing_bytes.items()
    }


def test_weight_pushes_duration_path_and_update_calls(full: tuple[Expected, Page]) -> None:
    expected, page = full
    labels = [f"after {p['rollout_id']} → v{p['weight_version']}" for p in expected.pushes]
    assert page.charts["chart-pushes"].values(FANOUT_PATH) == {
        label: p["duration_s"] for label, p in zip(labels, expected.pushes, strict=True)
    }
    calls = page.charts["chart-push-calls"]
    for engine in ENGINES:
        assert calls.values(engine) == {
            label: float(p["update_calls_per_engine"][engine])
            for label, p in zip(labels, expected.pushes, strict=True)
        }
    _, *rows = page.charts["push-table"].tables[0]
    assert [row[2] for row in rows] == [format_seconds(p["duration_s"]) for p in expected.pushes]
    assert [row[4] for row in rows] == ["1", "1–2", "1–3"]


def test_summary_table(full: tuple[Expected, Page]) -> None:
    expected, page = full
    summary = page.summary
    assert summary["Steps"] == "4 (rollout 0–3)"
    assert summary["Attempts"] == f"{expected.attempts:,}"
    assert summary["Valid fraction"] == f"{expected.valid / expected.attempts * 100:.3g}%"
    infra_rate = (expected.attempts - expected.valid) / expected.attempts
    assert summary["Infrastructure failure rate"] == f"{infra_rate * 100:.3g}%"
    assert summary["Kept mean, last step"] == f"{format_number(expected.kept_mean[3])} (rollout 3)"
    assert summary["Trained samples"] == f"{expected.trained} ({expected.masked} masked)"
    assert summary["Weight pushes"] == "3 (3 complete)"


def test_miles_run_with_step_lines_only(tmp_path: Path) -> None:
    """A real Miles run with the metrics hook, attempt lines off, no weight-push lines, no routing replay."""
    expected, page = build(tmp_path, attempt_lines=False, pushes=False, routing=False)
    outcomes = page.charts["chart-outcomes"]
    infra_counts = {str(s): sum(c.values()) for s, c in expected.causes.items()}
    assert outcomes.values("infrastructure failure") == {k: float(v) for k, v in infra_counts.items()}
    valid_counts = outcomes.values("valid (pass/fail unknown)")
    assert sum(valid_counts.values()) == expected.valid
    assert not outcomes.no_data
    assert drawn(page, "chart-infra") == {
        (str(step), cause): n for step, counts in expected.causes.items() for cause, n in counts.items()
    }
    assert page.charts["chart-rewards"].values("kept mean") == pytest.approx(
        {str(k): v for k, v in expected.kept_mean.items()}
    )
    for chart_id, why in (
        ("chart-phases", "no attempt lines"),
        ("chart-cache", "no attempt lines"),
        ("chart-routing", "no attempt lines"),
        ("chart-pushes", "no weight_push records"),
        ("chart-push-calls", "no weight_push records"),
    ):
        chart = page.charts[chart_id]
        assert chart.marks == [] and chart.svgs == 0, chart_id
        assert len(chart.no_data) == 1 and why in chart.no_data[0], (chart_id, chart.no_data)
        assert chart.no_data[0].startswith("No data in this run:")
    assert page.summary["Weight pushes"] == "none recorded"


def test_attempt_lines_without_routing_bytes_or_timings(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    args = SimpleNamespace(reward_key=None, dynamic_sampling_filter_path=None, rl360_metrics_path=str(path))
    samples = [valid(0, 0, 1.0), valid(0, 1, 0.0), infra(0, 2, "no_sandbox")]
    for sample in samples:
        sample.metadata.pop("phase_timings", None)
    log_rollout_metrics(0, args, samples, {}, 1.0)
    main(path, tmp_path / "out" / "page.html")
    page = parse_page((tmp_path / "out" / "page.html").read_text(encoding="utf-8"))
    assert "phase_timings" in page.charts["chart-phases"].no_data[0]
    assert "routing_bytes" in page.charts["chart-routing"].no_data[0]
    assert "cached_tokens" in page.charts["chart-cache"].no_data[0]
    assert drawn(page, "chart-outcomes") == {
        ("0", "passed (reward > 0)"): 1,
        ("0", "failed (reward ≤ 0)"): 1,
        ("0", "infrastructure failure"): 1,
    }


def test_another_filter_leaves_unfiltered_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    args = SimpleNamespace(
        reward_key=None, dynamic_sampling_filter_path="my.filters.check", rl360_metrics_path=str(path)
    )
    log_rollout_metrics(4, args, [valid(0, 0, 1.0), valid(0, 1, 0.0), infra(0, 2, "verifier_crash")], {}, 1.0)
    main(tmp_path, None)
    page = parse_page((tmp_path / "report.html").read_text(encoding="utf-8"))
    rewards = page.charts["chart-rewards"]
    assert rewards.values("unfiltered mean") == {} and rewards.values("kept mean") == {"4": 0.5}
    assert drawn(page, "chart-infra") == {("4", "verifier_crash"): 1}
    assert page.summary["Attempts"] == "3"


def test_no_infra_failures_is_said_not_drawn_empty(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    args = SimpleNamespace(reward_key=None, dynamic_sampling_filter_path=None, rl360_metrics_path=str(path))
    log_rollout_metrics(0, args, [valid(0, 0, 1.0), valid(0, 1, 0.0)], {}, 1.0)
    main(tmp_path, None)
    chart = parse_page((tmp_path / "report.html").read_text(encoding="utf-8")).charts["chart-infra"]
    assert chart.marks == [] and chart.svgs == 0
    assert chart.ok_notes == ["No infrastructure failures in 2 attempts over 1 steps."]


def test_empty_file_gives_notes_everywhere(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_bytes(b"")
    main(tmp_path, None)
    page = parse_page((tmp_path / "report.html").read_text(encoding="utf-8"))
    assert set(page.charts) == set(CHARTS)
    for chart_id in CHARTS:
        assert page.charts[chart_id].marks == [] and len(page.charts[chart_id].no_data) == 1, chart_id
    assert "push-table" not in page.charts
    assert page.summary["Steps"] == "0" and page.summary["Valid fraction"] == "n/a"


def test_the_page_loads_nothing(full: tuple[Expected, Page]) -> None:
    _, page = full
    assert page.tags["script"] == 0 and page.tags["link"] == 0 and page.tags["img"] == 0
    for tag, name, value in page.attributes:
        assert name not in ("src", "href", "xlink:href"), (tag, name, value)
        assert "url(" not in value, (tag, name, value)
        if name == "xmlns":
            assert value == "http://www.w3.org/2000/svg"
    assert ("meta", "http-equiv", "Content-Security-Policy") in page.attributes
    assert (
        "meta",
        "content",
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:",
    ) in page.attributes


def test_repeated_rollout_ids_are_noted(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    args = SimpleNamespace(reward_key=None, dynamic_sampling_filter_path=None, rl360_metrics_path=str(path))
    log_rollout_metrics(0, args, [valid(0, 0, 1.0), valid(0, 1, 0.0)], {}, 1.0)
    log_rollout_metrics(0, args, [valid(0, 0, 1.0), valid(0, 1, 1.0)], {}, 1.0)
    run = load_run(path)
    assert run.steps[0].metric("reward/kept_mean") == 1.0
    assert any("rollout_id 0 has 2 step records" in note for note in run.notes)


def test_routing_bytes_come_from_metadata_and_are_null_when_absent() -> None:
    assert attempt_summary(valid(0, 0, 1.0, routing_bytes=4096))["routing_bytes"] == 4096
    assert attempt_summary(valid(0, 1, 1.0))["routing_bytes"] is None


@pytest.mark.parametrize(
    ("record", "field"),
    [
        ({"kind": "attempt", "rollout_id": 1, "reward": "high", "attempt_class": "valid"}, "'reward'"),
        ({"kind": "attempt", "rollout_id": 1, "phase_timings": {"agent": "slow"}}, "'agent'"),
        ({"kind": "attempt", "rollout_id": "one"}, "'rollout_id'"),
        ({"kind": "step", "rollout_id": 1, "metrics": {"reward/kept_mean": "0.5"}}, "'reward/kept_mean'"),
        ({"kind": "step", "rollout_id": 1, "metrics": [1, 2]}, "'metrics'"),
        ({"kind": "weight_push", "rollout_id": 1, "duration_s": True}, "'duration_s'"),
        ({"kind": "weight_push", "update_calls_per_engine": {"http://e": "1"}}, "'http://e'"),
    ],
)
def test_wrong_types_name_the_record_and_field(tmp_path: Path, record: dict, field: str) -> None:
    path = tmp_path / "metrics.jsonl"
    append_records(path, [record])
    with pytest.raises(ValueError, match=field) as error:
        main(path, tmp_path / "report.html")
    assert f"{record['kind']} record 1" in str(error.value)
    assert not (tmp_path / "report.html").exists()


def test_which_file_a_run_folder_means(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_bytes(b"")
    (tmp_path / "eval.jsonl").write_bytes(b"")
    assert find_metrics_file(tmp_path) == (tmp_path / "metrics.jsonl", [tmp_path / "eval.jsonl"])
    main(tmp_path, None)
    assert "Not read: eval.jsonl." in (tmp_path / "report.html").read_text(encoding="utf-8")

    other = tmp_path / "other"
    other.mkdir()
    (other / "run-7.jsonl").write_bytes(b"")
    assert find_metrics_file(other) == (other / "run-7.jsonl", [])
    (other / "run-8.jsonl").write_bytes(b"")
    with pytest.raises(
        ValueError, match=r"no metrics.jsonl and 2 \*.jsonl files \(run-7.jsonl, run-8.jsonl\)"
    ):
        find_metrics_file(other)
    with pytest.raises(FileNotFoundError):
        find_metrics_file(tmp_path / "missing")


def test_cli_writes_the_page(tmp_path: Path) -> None:
    write_run(tmp_path / "metrics.jsonl", steps=2, groups=4)
    from rl360_ext.cli import app

    result = CliRunner().invoke(app, ["report", str(tmp_path), "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert f"wrote {tmp_path / 'r.html'} (2 steps, 32 attempt lines, 1 weight pushes)" in result.output
    page = parse_page((tmp_path / "r.html").read_text(encoding="utf-8"))
    assert all(page.charts[c].marks for c in CHARTS)


def test_metrics_file_is_read_back_not_reparsed(full: tuple[Expected, Page], tmp_path: Path) -> None:
    """Unknown kinds (a future record type) are skipped by read_metrics and do not disturb the report."""
    path = tmp_path / "metrics.jsonl"
    lines = path.read_bytes().splitlines()
    path.write_bytes(b"\n".join([*lines, orjson.dumps({"kind": "checkpoint", "rollout_id": 9})]) + b"\n")
    assert load_run(tmp_path).step_ids == [0, 1, 2, 3]


def push_record(rollout_id: int, engines: int, calls: int, failed: bool = False) -> dict:
    urls = [f"http://10.0.0.{n}:30000" for n in range(engines)]
    push = WeightPush(
        path=FANOUT_PATH,
        weight_version=str(rollout_id + 1),
        model_path="/ckpt",
        duration_s=1.0 + rollout_id,
        engines_targeted=engines,
        engines_reached=engines - failed,
        update_calls_per_engine={url: calls + n for n, url in enumerate(urls)},
        control_calls_per_engine={url: 3 for url in urls},
        engine_versions={url: str(rollout_id + 1) for url in urls},
        failures=[{"url": urls[0], "status": 503, "call": "update_weights_from_disk"}] if failed else [],
    )
    return {"kind": "weight_push", "rollout_id": rollout_id, **push.to_dict()}


def test_push_table_keeps_recent_and_every_incomplete_push(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    initial = {**push_record(0, engines=2, calls=1), "rollout_id": None, "weight_version": "0"}
    append_records(path, [initial, *(push_record(k, engines=2, calls=1, failed=k == 2) for k in range(30))])
    main(path, None)
    page = parse_page((tmp_path / "report.html").read_text(encoding="utf-8"))
    assert page.charts["chart-pushes"].values(FANOUT_PATH)["initial → v0"] == 1.0
    header, *body = page.charts["push-table"].tables[0]
    assert header[0] == "push (21 of 31: incomplete or recent)"
    assert [r[0] for r in body] == ["after 2 → v3", *[f"after {k} → v{k + 1}" for k in range(10, 30)]]
    assert body[0][6:8] == ["NO", "1"] and body[0][3] == "1 / 2"


def test_push_engines_chart_and_churn_columns_from_weights_metrics(tmp_path: Path) -> None:
    """A push's weights/* metrics (rl360 demo under --engine-churn) draw the engines chart and fill
    the table's reason and degraded columns; a record without them falls back to the counts."""
    path = tmp_path / "metrics.jsonl"
    churned = push_record(1, engines=2, calls=1)
    churned["metrics"] = {
        "weights/reason": "retry",
        "weights/engines_expected": 2,
        "weights/engines_reached": 2,
        "weights/engines_fenced": 1,
        "weights/stale_served_tokens": 3,
        "weights/degraded": True,
        "other/ignored": 5,
    }
    append_records(path, [push_record(0, engines=2, calls=1), churned])
    main(path, None)
    page = parse_page((tmp_path / "report.html").read_text(encoding="utf-8"))
    chart = page.charts["chart-push-engines"]
    assert chart.values("engines expected") == {"after 0 → v1": 2.0, "after 1 → v2": 2.0}
    assert chart.values("engines fenced") == {"after 1 → v2": 1.0}
    assert chart.values("stale-served tokens") == {"after 1 → v2": 3.0}
    _, *rows = page.charts["push-table"].tables[0]
    assert [row[8:] for row in rows] == [["n/a", "n/a"], ["retry", "YES"]]


def test_many_engines_show_min_median_max_calls(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    append_records(path, [push_record(0, engines=40, calls=41), push_record(1, engines=40, calls=1400)])
    main(path, None)
    page = parse_page((tmp_path / "report.html").read_text(encoding="utf-8"))
    calls = page.charts["chart-push-calls"]
    assert calls.values("min over engines") == {"after 0 → v1": 41.0, "after 1 → v2": 1400.0}
    assert calls.values("max over engines") == {"after 0 → v1": 80.0, "after 1 → v2": 1439.0}
    assert calls.values("median over engines") == {"after 0 → v1": 60.5, "after 1 → v2": 1419.5}


def test_infra_section_shows_who_each_failure_belongs_to(tmp_path: Path) -> None:
    counts = {"count/attribution/policy/verifier_timeout": 2, "count/attribution/task/verifier_crash": 1}
    metrics = {
        "count/attempts": 8,
        "count/valid": 7,
        "count/infra": 1,
        "count/infra/verifier_crash": 1,
        **counts,
    }
    append_records(tmp_path / "metrics.jsonl", [{"kind": "step", "rollout_id": 0, "metrics": metrics}])
    main(tmp_path, None)
    page = parse_page((tmp_path / "report.html").read_text(encoding="utf-8"))
    assert drawn(page, "chart-infra") == {
        ("0", "verifier_crash"): 1.0,
        ("0", "policy/verifier_timeout"): 2.0,
        ("0", "task/verifier_crash"): 1.0,
    }
