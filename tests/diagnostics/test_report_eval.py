"""`rl360 report`: eval lines (the eval log hook's) drawn beside the training curve."""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

import pytest

from rl360_ext.diagnostics.report import main
from rl360_ext.outcomes.infra import mark_infra_sample
from rl360_ext.outcomes.provenance import ATTEMPT_CLASS, REWARD_SOURCE, VALID
from rl360_ext.rollout.eval_metrics import log_eval_metrics
from rl360_ext.rollout.metrics import REGISTRY
from rl360_ext.rollout.sample import Sample

from .report_fixtures import parse_page, write_run


def _valid(task: str, reward: float) -> Sample:
    return Sample(
        prompt=task, reward=reward, metadata={"task": task, ATTEMPT_CLASS: VALID, REWARD_SOURCE: "verifier"}
    )


def _infra(task: str) -> Sample:
    return mark_infra_sample(Sample(prompt=task, tokens=[1], metadata={"task": task}), "no_sandbox")


def _entry(samples: list[Sample]) -> dict[str, object]:
    return {"rewards": [s.reward for s in samples], "truncated": [False] * len(samples), "samples": samples}


def test_eval_pass_rate_upstream_and_infra_rate_are_drawn_per_step(tmp_path: Path) -> None:
    REGISTRY.drain()
    path = tmp_path / "metrics.jsonl"
    write_run(path, steps=3, groups=2, train=False)
    args = Namespace(rl360_metrics_path=str(path), rl360_metrics_attempts=None, reward_key=None)
    log_eval_metrics(
        0, args, {"held_out": _entry([_valid("a", 1.0), _valid("a", 0.0), _infra("a"), _infra("b")])}
    )
    log_eval_metrics(
        2, args, {"held_out": _entry([_valid("a", 1.0), _valid("b", 1.0), _valid("b", 0.0), _infra("a")])}
    )
    main(tmp_path, None)
    page = parse_page((tmp_path / "report.html").read_text(encoding="utf-8"))
    chart = page.charts["chart-eval"]
    assert chart.values("held_out pass rate") == pytest.approx({"0": 0.5, "2": 2 / 3})
    assert chart.values("held_out upstream") == pytest.approx({"0": 0.25, "2": 0.5})
    assert set(chart.values("training (unfiltered mean)")) == {"0", "1", "2"}
    assert page.charts["chart-eval-infra"].values("held_out infra rate") == pytest.approx(
        {"0": 0.5, "2": 0.25}
    )


def test_a_run_without_eval_lines_has_no_eval_section(tmp_path: Path) -> None:
    REGISTRY.drain()
    write_run(tmp_path / "metrics.jsonl", steps=2, groups=2, train=False)
    main(tmp_path, None)
    page = parse_page((tmp_path / "report.html").read_text(encoding="utf-8"))
    assert "chart-eval" not in page.charts and "chart-eval-infra" not in page.charts
