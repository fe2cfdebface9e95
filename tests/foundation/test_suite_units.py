"""How the suite is split over xdist workers (the root conftest): the work units, and that the
conftest still loads where pytest-xdist is not installed (the Miles and Megatron venvs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import work_unit

ROOT = Path(__file__).resolve().parents[2]


def test_a_file_is_one_unit_and_the_demo_is_two() -> None:
    assert work_unit("tests/session/test_core.py::test_a[1]") == "tests/session/test_core.py"
    assert work_unit("integration_tests/rollout/test_fault_matrix.py::test_x") == (
        "integration_tests/rollout/test_fault_matrix.py"
    )
    demo = [
        "integration_tests/demo/test_compare.py::test_compare_upstream_runs_both_arms_on_one_plan",
        "integration_tests/demo/test_demo.py::test_demo_runs_the_loop_in_order_and_leaves_nothing_behind",
        "integration_tests/demo/test_demo.py::test_interrupt_mid_rollout_stops_every_process[ctrl-c]",
        "integration_tests/demo/test_demo.py::test_demo_scales_out_over_harbor_replicas_and_session_servers",
        "integration_tests/demo/test_demo.py::test_a_replica_killed_mid_step_is_replaced_and_its_attempts_are_masked",
        "integration_tests/demo/test_demo_in_flight.py::test_in_flight_step",
    ]
    units = [work_unit(nodeid) for nodeid in demo]
    assert set(units) == {"whole-stack-1", "whole-stack-2"}
    assert units.count("whole-stack-2") == 3


def test_the_conftest_loads_without_xdist() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "--co", "-q",
         "tests/foundation/test_console.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
