"""The fault A/B's combined report: every arm's curves drawn with the numbers its run wrote, and a
summary computed from them (runs written by the real filter and metrics hook, report_fixtures)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from rl360_ext.diagnostics.compare_report import (
    ADVANTAGE_KIND,
    COMPARE_HTML,
    COMPARE_JSON,
    ArmFacts,
    difference_sentence,
    write_compare,
)
from rl360_ext.rollout.metrics import REGISTRY, append_records, read_metrics

from .report_fixtures import Expected, parse_page, write_run

STEPS = 6
SCALES = {"rl360": [1.0] * STEPS, "upstream": [0.75, 0.8, 0.9, 0.6, 1.0, 0.7]}
SHIFTS = {"rl360": [0.0] * STEPS, "upstream": [0.1, 0.2, None, 0.05, 0.3, 0.15]}


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    REGISTRY.drain()
    yield
    REGISTRY.drain()


def _arm(folder: Path, name: str, seed: int) -> Expected:
    folder.mkdir(parents=True)
    path = folder / "metrics.jsonl"
    expected = write_run(path, steps=STEPS, seed=seed)
    for step in range(STEPS):  # the last train record of a step is the one read
        metrics = {"train/loss_scale": SCALES[name][step], "train/masked_samples": 2.0}
        append_records(
            path, [{"kind": "train", "rollout_id": step, "metrics": metrics, "chance_level": 0.25}]
        )
        shift = SHIFTS[name][step]
        body = {} if shift is None else {"advantage/shift": shift}
        append_records(path, [{"kind": ADVANTAGE_KIND, "rollout_id": step, "metrics": body}])
    return expected


def _late_rewards(path: Path) -> list[float]:
    _, attempts = read_metrics(path)
    late = range(STEPS - STEPS // 3, STEPS)
    return [a["reward"] for a in attempts if a["rollout_id"] in late and a.get("attempt_class") == "valid"]


def _drawn(page: object, chart: str) -> dict[tuple[str, str], float]:
    marks = page.charts[chart].marks  # type: ignore[attr-defined]
    return {(m["data-series"], m["data-x"]): float(m["data-value"]) for m in marks}


def test_every_arm_is_drawn_with_its_own_numbers_and_the_summary_is_computed(tmp_path: Path) -> None:
    arms = {
        "rl360": _arm(tmp_path / "rl360", "rl360", 7),
        "upstream": _arm(tmp_path / "upstream", "upstream", 11),
    }
    page_path, json_path, summary = write_compare(tmp_path, [(name, tmp_path / name) for name in arms])
    assert (page_path.name, json_path.name) == (COMPARE_HTML, COMPARE_JSON)
    page = parse_page(page_path.read_text(encoding="utf-8"))
    learning = _drawn(page, "chart-compare-learning")
    for name, expected in arms.items():
        for step, mean in expected.unfiltered_mean.items():
            assert learning[(name, str(step))] == pytest.approx(mean, abs=1e-12)
        assert learning[("chance", "0")] == 0.25
    scale, shift = _drawn(page, "chart-compare-scale"), _drawn(page, "chart-compare-shift")
    for name in arms:
        for step in range(STEPS):
            assert scale[(name, str(step))] == SCALES[name][step]
            if SHIFTS[name][step] is None:
                assert (name, str(step)) not in shift
            else:
                assert shift[(name, str(step))] == SHIFTS[name][step]

    numbers = json.loads(json_path.read_text())
    assert numbers["summary"] == summary
    facts = {f["name"]: f for f in numbers["facts"]}
    for name in arms:
        rewards = _late_rewards(tmp_path / name / "metrics.jsonl")
        mean = sum(rewards) / len(rewards)
        error = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1) / len(rewards))
        assert facts[name]["late_mean"] == pytest.approx(mean)
        assert facts[name]["late_standard_error"] == pytest.approx(error)
        assert facts[name]["late_valid_attempts"] == len(rewards)
        assert facts[name]["loss_scale_mean"] == pytest.approx(sum(SCALES[name]) / STEPS)
        assert facts[name]["masked_samples"] == 2 * STEPS
        assert f"{name}: unfiltered mean" in summary[list(arms).index(name)]
    up = [v for v in SHIFTS["upstream"] if v is not None]
    assert facts["upstream"]["shift_mean"] == pytest.approx(sum(up) / len(up))
    assert (facts["upstream"]["shift_max"], facts["upstream"]["shift_max_step"]) == (0.3, 4)
    assert "lowest 0.60" in summary[1] and "largest +0.300 (step 4)" in summary[1]
    delta = facts["upstream"]["late_mean"] - facts["rl360"]["late_mean"]
    assert summary[2].startswith(f"upstream vs rl360, late mean: {delta:+.3f}")


def _facts(name: str, mean: float | None, error: float | None) -> ArmFacts:
    return ArmFacts(name, 0, mean, 9, mean, [7, 8, 9], mean, error, 90, 1.0, 1.0, 0, 0.0, 0.0, 0)


@pytest.mark.parametrize(
    ("mine", "theirs", "words"),
    [
        ((0.70, 0.03), (0.75, 0.04), "-0.050 (below rl360; 1.0 standard errors: within noise)"),
        ((0.55, 0.03), (0.75, 0.04), "-0.200 (below rl360; 4.0 standard errors: beyond 2)"),
        ((0.80, 0.0), (0.75, 0.0), "+0.050 (above rl360; no spread to judge it against)"),
    ],
)
def test_a_late_mean_difference_is_read_against_its_standard_error(
    mine: tuple[float, float], theirs: tuple[float, float], words: str
) -> None:
    line = difference_sentence(_facts("upstream", *mine), _facts("rl360", *theirs))
    assert line == f"upstream vs rl360, late mean: {words}."


def test_no_late_mean_no_difference_line() -> None:
    assert difference_sentence(_facts("upstream", None, None), _facts("rl360", 0.5, 0.1)) is None


def test_an_arm_without_advantage_lines_says_so(tmp_path: Path) -> None:
    folder = tmp_path / "old"
    folder.mkdir()
    write_run(folder / "metrics.jsonl", steps=2, train=False)
    page_path, _, summary = write_compare(tmp_path, [("old", folder)])
    page = parse_page(page_path.read_text(encoding="utf-8"))
    assert page.charts["chart-compare-shift"].no_data == ["No data in this run: no arm has advantage lines."]
    assert page.charts["chart-compare-scale"].no_data == ["No data in this run: no arm has train/loss_scale."]
    assert "no train step" in summary[0] and "no advantage line" in summary[0]


def test_a_wrong_typed_shift_is_refused_naming_the_field(tmp_path: Path) -> None:
    folder = tmp_path / "bad"
    folder.mkdir()
    path = folder / "metrics.jsonl"
    write_run(path, steps=1)
    append_records(path, [{"kind": ADVANTAGE_KIND, "rollout_id": 0, "metrics": {"advantage/shift": "big"}}])
    with pytest.raises(ValueError, match="advantage/shift is not a number"):
        write_compare(tmp_path, [("bad", folder)])
