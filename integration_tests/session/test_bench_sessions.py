"""`rl360 bench sessions` end to end: real backend and session-server processes (and Ray actors).

The smallest load on every shape, on processes and on a `SessionPool`'s actors; 300 concurrent
sessions without a lost turn (no connect or pool timeout between agent, session server and engine
under load); with a Miles checkout whose session server imports somewhere (`find_miles`),
Miles' server beside rl360's; and the stall case's two phases.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from rl360_ext.local.bench.miles_sessions import MilesUnavailable, find_miles
from rl360_ext.local.bench.session_case import RL360, Case, Hosting
from rl360_ext.local.bench.sessions import main, run_case
from rl360_ext.local.bench.stall import run_stall
from rl360_ext.reference.engine.tokenizer import default_tokenizer_dir

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize("servers", [1, 2])
@pytest.mark.parametrize("r3", [False, True], ids=["r3-off", "r3-on"])
def test_every_turn_is_served_and_measured(
    capsys: pytest.CaptureFixture[str], r3: bool, servers: int
) -> None:
    """Every shape (R3 off/on x 1/2 servers, one test each so they spread over workers) at 1 and 3
    concurrent sessions."""
    results = main(as_json=True, concurrency=(1, 3), turns=(4,), r3=(r3,), servers=(servers,))
    results = [r for r in results if r.server == RL360]  # Miles' rows too when MILES_SRC is set
    assert [(r.case.sessions, r.case.r3, r.case.servers) for r in results] == [
        (1, r3, servers),
        (3, r3, servers),
    ]
    for result in results:
        assert (result.turns_done, result.turns_lost) == (result.case.sessions * 4, 0), result
        for value in (result.turns_per_s, result.p50_ms, result.p99_ms):
            assert math.isfinite(value) and value > 0, result
        # CPU is read from /proc in clock ticks (10 ms): 4-12 turns on the instant backend can take
        # less than one tick in all, which reads 0 (seen in a fresh-clone run)
        assert math.isfinite(result.server_cpu_ms_per_turn) and result.server_cpu_ms_per_turn >= 0, result
    assert '"turns_done"' in capsys.readouterr().out


@pytest.mark.timeout(300)
def test_a_session_pools_actors_serve_and_are_measured() -> None:
    results = main(
        as_json=False, concurrency=(3,), turns=(4,), r3=(True,), servers=(2,), hostings=(Hosting.ACTOR,)
    )
    (result,) = results
    assert result.case.hosting is Hosting.ACTOR and result.server == RL360
    assert (result.turns_done, result.turns_lost) == (12, 0), result.lost_because
    assert result.server_cpu_ms_per_turn > 0 and result.bytes_per_turn > 0, result


@pytest.mark.timeout(600)
def test_300_concurrent_sessions_lose_no_turn(tmp_path: Path) -> None:
    case = Case(sessions=300, turns=3, r3=False, servers=1, backend="instant")
    (result,) = run_case(case, str(default_tokenizer_dir()), tmp_path)
    assert (result.turns_done, result.turns_lost) == (900, 0), result.lost_because


@pytest.mark.timeout(900)  # Miles' server imports torch, transformers and sglang on each of its 4 starts
def test_miles_server_runs_beside_rl360s_on_the_same_conversations(tmp_path: Path) -> None:
    try:
        miles = find_miles(os.environ.get("MILES_SRC"))
    except MilesUnavailable as exc:
        pytest.skip(str(exc))
    if miles is None:
        pytest.skip("MILES_SRC is not set")
    case = Case(sessions=2, turns=3, r3=True, servers=1, backend="instant")
    results = run_case(case, str(default_tokenizer_dir()), tmp_path, miles, rounds=2)
    assert [r.server for r in results] == [RL360, "miles", "miles in_place"]
    for result in results:
        assert (result.turns_done, result.turns_lost) == (6, 0), (result.server, result.lost_because)
        assert result.bytes_per_turn > 0 and result.server_cpu_ms_per_turn > 0, result


@pytest.mark.timeout(300)
def test_the_stall_case_measures_both_phases_on_one_server(tmp_path: Path) -> None:
    """Idle, then beside the largest allowed request (sent from its own process): every phase has
    probes, turns and the server's loop-lag wake-ups; only the second sends large requests, each
    refused by the context check (400) after tokenizing, none lost."""
    idle, loaded = run_stall(str(default_tokenizer_dir()), tmp_path, 3.0)
    for phase in (idle, loaded):
        assert phase.health_probes > 0 and phase.turns > 0 and phase.loop_ticks > 0, phase
        assert math.isfinite(phase.health_p99_ms) and math.isfinite(phase.turn_p99_ms), phase
    assert (idle.load, idle.big_requests, loaded.load) == ("idle", 0, "largest request")
    assert loaded.big_requests >= 1 and loaded.big_statuses == f"400 x {loaded.big_requests}", loaded
    assert loaded.big_chars > 100_000 and loaded.big_mean_s > 0, loaded
