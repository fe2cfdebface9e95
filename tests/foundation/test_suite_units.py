"""How the suite is split over xdist workers (the root conftest): the work units, and that the
conftest still loads where pytest-xdist is not installed (the Miles and Megatron venvs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import SECOND_STACK_UNIT, WHOLE_STACK_DIR, work_unit

ROOT = Path(__file__).resolve().parents[2]


def test_a_file_is_one_unit_and_the_demo_is_two() -> None:
    assert work_unit("tests/session/test_core.py::test_a[1]") == "tests/session/test_core.py"
    assert work_unit("integration_tests/rollout/test_fault_matrix.py::test_x") == (
        "integration_tests/rollout/test_fault_matrix.py"
    )
    demo_files = sorted((ROOT / WHOLE_STACK_DIR).glob("test_*.py"))
    units = {work_unit(f"{WHOLE_STACK_DIR}{path.name}::test_x") for path in demo_files}
    assert units == {"whole-stack-1", "whole-stack-2"}
    for prefix in SECOND_STACK_UNIT:  # each names a demo test file that exists
        assert (ROOT / prefix.split("::", 1)[0]).is_file(), prefix
        assert work_unit(f"{prefix}::test_x") == "whole-stack-2"


def test_the_conftest_loads_without_xdist() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "--co", "-q",
         "tests/foundation/test_console.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
