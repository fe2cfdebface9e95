"""The fault A/B's combined report: every run reduced to its figures, per mode and arm the intervals
over seeds and the sentences they support, each arm's seed-mean curves drawn (runs written by the
real filter and metrics hook, report_fixtures)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from rl360_ext.local.ab.page import (
    ADVANTAGE_KIND,
    COMPARE_HTML,
    COMPARE_JSON,
    RunFolder,
    load_arm,
    write_compare,
)
from rl360_ext.local.ab.stats import curve_figures, interval
from rl360_ext.rollout.metrics import REGISTRY, append_records
from tests.diagnostics.report_fixtures import Expected, parse_page, write_run

STEPS = 6
SCALES = {"rl360": [1.0] * STEPS, "upstream": [0.75, 0.8, 0.9, 0.6, 1.0, 0.7]}
SHIFTS = {"rl360": [0.0] * STEPS, "upstream": [0.1, 0.2, None, 0.05, 0.3, 0.15]}
EVAL = "train_greedy"


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    REGISTRY.drain()
    yield
    REGISTRY.drain()


def _run(folder: Path, arm: str, seed: int, eval_pass: float | None = None) -> Expected:
    folder.mkdir(parents=True)
    path = folder / "metrics.jsonl"
    expected = write_run(path, steps=STEPS, seed=seed)
    for step in range(STEPS):  # the last train record of a step is the one read
        metrics = {
            "train/loss_scale": SCALES[arm][step],
            "train/masked_samples": 2.0,
            "train/valid_samples": 6.0,
        }
        append_records(
            path, [{"kind": "train", "rollout_id": step, "metrics": metrics, "chance_level": 0.25}]
        )
        shift = SHIFTS[arm][step]
        body = {} if shift is None else {"advantage/shift": shift}
        append_records(path, [{"kind": ADVANTAGE_KIND, "rollout_id": step, "metrics": body}])
    if eval_pass is not None:  # two evals: the last one is the run's
        for rollout_id, rate in ((1, 0.0), (STEPS - 1, eval_pass)):
            record = {
                "kind": "eval",
                "rollout_id": rollout_id,
                "dataset": EVAL,
                "metrics": {"pass_rate": rate},
            }
            append_records(path, [record])
    return expected


def _drawn(page: object, chart: str) -> dict[tuple[str, str], float]:
    marks = page.charts[chart].marks  # type: ignore[attr-defined]
    return {(m["data-series"], m["data-x"]): float(m["data-value"]) for m in marks}


def test_every_mode_and_arm_gets_intervals_over_its_seeds_and_seed_mean_curves(tmp_path: Path) -> None:
    seeds, passes = (0, 1, 2), {"rl360": [0.5, 0.75, 1.0], "upstream": [0.25, 0.5, 0.5]}
    expected: dict[tuple[str, int], Expected] = {}
    runs = []
    for arm in ("rl360", "upstream"):
        for seed in seeds:
            folder = tmp_path / "uniform" / arm / f"seed-{seed}"
            expected[(arm, seed)] = _run(folder, arm, 7 + 5 * seed + len(arm), passes[arm][seed])
            runs.append(RunFolder("uniform", arm, seed, folder))
    html, numbers, document = write_compare(tmp_path, runs, STEPS, 0.8, EVAL)
    assert (html.name, numbers.name) == (COMPARE_HTML, COMPARE_JSON)
    assert json.loads(numbers.read_text())["table"] == document["table"]

    for arm in ("rl360", "upstream"):
        entry = document["table"]["uniform"][arm]
        assert entry["seeds"] == 3
        figures = []
        for seed in seeds:
            means = expected[(arm, seed)].unfiltered_mean
            shifts = [s for s in SHIFTS[arm] if s is not None]
            figures.append(
                curve_figures(sorted(means.items()), SCALES[arm], shifts, passes[arm][seed], STEPS, 0.8)
            )
        for metric in ("auc", "final_mean", "eval_pass", "gradient_scale", "advantage_shift"):
            want = interval([f[metric] for f in figures])
            assert entry[metric]["mean"] == pytest.approx(want.mean), (arm, metric)
            assert (entry[metric]["low"], entry[metric]["high"]) == pytest.approx((want.low, want.high))
    paired = document["table"]["uniform"]["upstream"]["eval_pass_minus_rl360"]
    assert paired["mean"] == pytest.approx(-1 / 3)
    (line,) = document["summary"]
    assert line.startswith("uniform, upstream vs rl360:")
    assert "gradient scale: rl360 is higher than upstream" in line  # rl360's is 1.0 exactly, upstream's 0.79

    page = parse_page(html.read_text(encoding="utf-8"))
    learning = _drawn(page, "chart-compare-learning-uniform")
    for arm in ("rl360", "upstream"):
        for step in range(STEPS):
            values = [expected[(arm, s)].unfiltered_mean.get(step) for s in seeds]
            present = [v for v in values if v is not None]
            assert learning[(arm, str(step))] == pytest.approx(sum(present) / len(present), abs=1e-12)
    assert learning[("chance", "0")] == 0.25
    scale = _drawn(page, "chart-compare-scale-uniform")
    shift = _drawn(page, "chart-compare-shift-uniform")
    for step in range(STEPS):
        assert scale[("upstream", str(step))] == pytest.approx(SCALES["upstream"][step])
        assert ("upstream", str(step)) in shift or SHIFTS["upstream"][step] is None
    text = html.read_text(encoding="utf-8")
    assert "uniform, upstream vs rl360" in text and "[" in text  # the sentences and the interval table


def test_a_run_without_eval_has_no_eval_number_and_modes_are_kept_apart(tmp_path: Path) -> None:
    runs = []
    for mode in ("uniform", "burst"):
        for arm in ("rl360", "upstream"):
            folder = tmp_path / mode / arm / "seed-0"
            _run(folder, arm, 3 if mode == "uniform" else 4)
            runs.append(RunFolder(mode, arm, 0, folder))
    _, numbers, document = write_compare(tmp_path, runs, STEPS, 0.8, None)
    assert set(document["table"]) == {"uniform", "burst"}
    assert document["table"]["burst"]["rl360"]["eval_pass"] is None
    assert [r["figures"]["eval_pass"] for r in json.loads(numbers.read_text())["runs"]] == [None] * 4
    assert all("eval pass" not in line for line in document["summary"])
    assert load_arm("rl360", tmp_path / "uniform" / "rl360" / "seed-0", EVAL).eval_pass is None


def test_a_step_that_trained_on_no_valid_sample_has_no_gradient_scale(tmp_path: Path) -> None:
    folder = tmp_path / "uniform" / "rl360" / "seed-0"
    _run(folder, "rl360", 5)
    untrained = {"train/loss_scale": 0.0, "train/masked_samples": 4.0, "train/valid_samples": 0.0}
    record = {"kind": "train", "rollout_id": 2, "metrics": untrained, "chance_level": 0.25}
    append_records(folder / "metrics.jsonl", [record])  # the step's last train record wins
    curves = load_arm("rl360", folder)
    assert curves.loss_scale[2] is None and curves.loss_scale[1] == 1.0
    _, _, document = write_compare(tmp_path, [RunFolder("uniform", "rl360", 0, folder)], STEPS, 0.8)
    assert document["table"]["uniform"]["rl360"]["gradient_scale"]["mean"] == 1.0


def test_an_arm_without_advantage_lines_says_so(tmp_path: Path) -> None:
    folder = tmp_path / "old"
    folder.mkdir()
    write_run(folder / "metrics.jsonl", steps=2, train=False)
    html, _, document = write_compare(tmp_path, [RunFolder("uniform", "rl360", 0, folder)], 2, 0.8)
    page = parse_page(html.read_text(encoding="utf-8"))
    assert page.charts["chart-compare-shift-uniform"].no_data == [
        "No data in this run: no arm has advantage lines."
    ]
    assert page.charts["chart-compare-scale-uniform"].no_data == [
        "No data in this run: no arm has train/loss_scale."
    ]
    entry = document["table"]["uniform"]["rl360"]
    assert entry["gradient_scale"] is None and entry["advantage_shift"] is None
    assert math.isfinite(entry["auc"]["mean"]) and document["summary"] == []


def test_a_wrong_typed_shift_is_refused_naming_the_field(tmp_path: Path) -> None:
    folder = tmp_path / "bad"
    folder.mkdir()
    path = folder / "metrics.jsonl"
    write_run(path, steps=1)
    append_records(path, [{"kind": ADVANTAGE_KIND, "rollout_id": 0, "metrics": {"advantage/shift": "big"}}])
    with pytest.raises(ValueError, match="advantage/shift is not a number"):
        write_compare(tmp_path, [RunFolder("uniform", "bad", 0, folder)], 1, 0.8)
