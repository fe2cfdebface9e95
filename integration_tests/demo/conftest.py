"""The demo tests need the demo's whole stack (smg, Ray, Harbor) and a working bubblewrap; each
test is skipped, saying which is missing, where one is not."""

from __future__ import annotations

import pytest

from integration_tests.components import bwrap_problem, skip_if_missing
from rl360_ext.local.demo.plan import DemoConfig
from rl360_ext.local.demo.stack import demo_stack_config
from rl360_ext.local.stack import preflight
from rl360_ext.util.prereqs import Unavailable


@pytest.fixture(autouse=True)
def _needs_the_stack() -> None:
    try:
        preflight(demo_stack_config(DemoConfig()))
    except Unavailable as exc:
        pytest.skip(str(exc))
    skip_if_missing(bwrap_problem)
