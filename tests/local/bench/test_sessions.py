"""`rl360 bench sessions` without processes: who runs a case, Miles' discovery, ratios and medians."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from rl360_ext.local.bench.miles_sessions import Miles, MilesUnavailable, find_miles
from rl360_ext.local.bench.session_case import RL360, Case, CaseResult, Hosting
from rl360_ext.local.bench.sessions import _median, cases, contenders, ratios

CASE = Case(sessions=4, turns=3, r3=True, servers=1, backend="instant")
MILES = Miles(Path("/nowhere"), sys.executable)


def _result(server: str, turns_per_s: float, cpu: float, case: Case = CASE) -> CaseResult:
    return CaseResult(
        case=case, server=server, turns_done=12, turns_lost=0, seconds=1.0, turns_per_s=turns_per_s,
        p50_ms=10.0, p99_ms=20.0, second_turn_p50_ms=9.0, last_turn_p50_ms=11.0,
        server_cpu_ms_per_turn=cpu, bytes_per_turn=1000.0, memory_mb_per_session=1.0,
    )  # fmt: skip


def test_miles_runs_in_both_modes_with_r3_once_without_and_never_in_front_of_the_tiny_engine() -> None:
    assert contenders(CASE, None) == [RL360]
    assert contenders(CASE, MILES) == [RL360, "miles", "miles in_place"]
    assert contenders(replace(CASE, r3=False), MILES) == [RL360, "miles"]
    assert contenders(replace(CASE, backend="tiny"), MILES) == [RL360]


def test_miles_modes_choose_which_r3_modes_run_and_never_skip_miles_without_r3() -> None:
    assert contenders(CASE, MILES, ("in_place",)) == [RL360, "miles in_place"]
    assert contenders(CASE, MILES, ("in_place", "full")) == [RL360, "miles", "miles in_place"]
    assert contenders(replace(CASE, r3=False), MILES, ("in_place",)) == [RL360, "miles"]


def test_miles_runs_beside_rl360s_processes_not_its_actors() -> None:
    assert contenders(replace(CASE, hosting=Hosting.ACTOR), MILES) == [RL360]
    assert contenders(replace(CASE, hosting=Hosting.ACTOR, r3=False), MILES) == [RL360]


def test_every_server_count_runs_once_per_hosting() -> None:
    both = cases((1, 32), (16,), (True,), (1, 2), "instant", (Hosting.PROCESS, Hosting.ACTOR))
    assert len(both) == 8 and len(set(both)) == 8
    assert {(c.servers, c.hosting) for c in both} == {(s, h) for s in (1, 2) for h in Hosting}
    assert {c.hosting for c in cases((1,), (16,), (True,), (1,), "instant")} == {Hosting.PROCESS}


@pytest.mark.parametrize(("flag", "value"), [("--miles-modes", "delta"), ("--hosting", "thread")])
def test_unknown_choices_are_refused_naming_the_flag(flag: str, value: str) -> None:
    from typer.testing import CliRunner

    from rl360_ext.cli import app

    result = CliRunner().invoke(app, ["bench", "sessions", flag, value])
    assert result.exit_code == 2
    assert flag in result.output


def test_without_a_checkout_the_bench_is_rl360_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MILES_SRC", raising=False)
    assert find_miles(None) is None


def test_a_path_that_is_no_miles_checkout_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(MilesUnavailable, match="not a radixark/miles checkout"):
        find_miles(str(tmp_path))


def test_a_checkout_whose_server_imports_nowhere_says_what_it_needs(tmp_path: Path) -> None:
    server = tmp_path / "miles" / "rollout" / "session" / "server.py"
    server.parent.mkdir(parents=True)
    server.write_text("raise ImportError('No module named torch')\n")
    with pytest.raises(MilesUnavailable, match=r"setup_venv\.sh"):
        find_miles(str(tmp_path), sys.executable)


def test_ratios_are_rl360_over_each_miles_mode_of_the_same_case() -> None:
    other = replace(CASE, sessions=8)
    results = [
        _result(RL360, 300.0, 2.0), _result("miles", 100.0, 8.0), _result("miles in_place", 150.0, 4.0),
        _result("miles", 1.0, 1.0, case=other),  # no rl360 row for this case: no ratio
    ]  # fmt: skip
    rows = ratios(results)
    assert [(r["miles"], r["turns_per_s"], r["server_cpu_ms_per_turn"]) for r in rows] == [
        ("miles", 3.0, 0.25),
        ("miles in_place", 2.0, 0.5),
    ]


def test_rounds_report_each_measures_median_and_the_worst_loss() -> None:
    runs = [_result(RL360, t, c) for t, c in ((100.0, 3.0), (300.0, 1.0), (200.0, 2.0))]
    runs[0] = replace(runs[0], turns_lost=2)
    median = _median(runs)
    assert (median.turns_per_s, median.server_cpu_ms_per_turn, median.turns_lost) == (200.0, 2.0, 2)
