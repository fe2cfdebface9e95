"""The launch simulation: deterministic, and its model shows what waves and pinning change."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from rl360_ext.local.bench import launch as bench

SMALL = replace(
    bench.LaunchModel(), sandboxes=1024, nodes=32, pools=8, image_groups=16, registry_slots=16, wave_size=32
)


def by_name() -> dict[str, bench.ScenarioResult]:
    return {r.name: r for r in bench.run_all(SMALL)}


def test_every_sandbox_becomes_ready_and_the_run_is_deterministic() -> None:
    first, second = by_name(), by_name()
    assert first == second
    for result in first.values():
        assert result.cold_starts + result.warm_starts == SMALL.sandboxes
        assert result.pull_attempts == result.images_pulled + result.failed_pulls


def test_waves_fail_fewer_pulls_and_pinning_pulls_fewer_images() -> None:
    results = by_name()
    assert results["waves/random"].failed_pulls < results["all-at-once/random"].failed_pulls
    assert results["all-at-once/pinned"].images_pulled <= SMALL.image_groups * (SMALL.nodes // SMALL.pools)
    assert results["all-at-once/pinned"].images_pulled < results["all-at-once/random"].images_pulled


def test_main_prints_json_with_parameters(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "LaunchModel", lambda: SMALL)
    bench.main(as_json=True)
    report = json.loads(capsys.readouterr().out)
    assert report["parameters"]["sandboxes"] == 1024 and report["baseline"] == "all-at-once/random"
    assert [s["name"] for s in report["scenarios"]] == [
        "all-at-once/random",
        "waves/random",
        "all-at-once/pinned",
        "waves/pinned",
    ]
    bench.main(as_json=False)
    assert "speedup" in capsys.readouterr().out
