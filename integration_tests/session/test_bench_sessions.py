"""`rl360 bench sessions` end to end on the smallest load: real backend and session-server processes."""

from __future__ import annotations

import math

import pytest

from rl360_ext.local.bench.sessions import main

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_every_turn_is_served_and_measured(capsys: pytest.CaptureFixture[str]) -> None:
    results = main(as_json=True, concurrency=(1, 3), turns=(4,), r3=(False, True), servers=(1, 2))
    assert len(results) == 8
    for result in results:
        assert (result.turns_done, result.turns_lost) == (result.case.sessions * 4, 0), result
        for value in (result.turns_per_s, result.p50_ms, result.p99_ms, result.server_cpu_ms_per_turn):
            assert math.isfinite(value) and value > 0, result
    assert '"turns_done"' in capsys.readouterr().out
