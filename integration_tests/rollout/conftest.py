"""Skip the rollout integration tests where their real components cannot run (no sandbox, no smg)."""

from __future__ import annotations

import pytest

from integration_tests.components import bwrap_problem, skip_if_missing, smg_problem


@pytest.fixture(autouse=True)
def _needs_components() -> None:
    skip_if_missing(smg_problem, bwrap_problem)
