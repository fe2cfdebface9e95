"""Test-wide settings: a hypothesis profile that tolerates a loaded 2-core machine, and how the
suite is split over pytest-xdist workers (docs/testing.md).

Distribution: one work unit per test file, so a module's shared stack (a tiny engine, a session
server, a fault-matrix stack, a Ray cluster) starts once, on one worker; the demo tests, each of
which starts a whole local stack (engines, SMG, Harbor, Ray), are split into two units of about
equal length, so at most two of them run at once. Units are handed out in collection order, which
puts the longest first: the demo, then the other integration tests, then the unit tests, which
fill the gaps at the end. Tests that bind
ports take them from the kernel (port 0), sandboxes and task copies live under per-test or
per-worker folders, and each worker starts its own local Ray, so workers never share a port, a
folder or a cluster.

Caches: the run shares one rl360 cache folder (`RL360_CACHE_DIR`, made by the controlling process
and removed at its end, unless the caller set one), so the demo's deterministic warm start is
computed once per run instead of once per demo test; the workers and the demo processes inherit it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "rl360",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("rl360")

# The tests that start a whole local stack each: two work units, the second named by these prefixes.
WHOLE_STACK_DIR = "integration_tests/demo/"
SECOND_STACK_UNIT = (  # about 767 s of the 1,495 (docs/testing.md, the run of 2026-12-06 19:44)
    "integration_tests/demo/test_compare.py",
    "integration_tests/demo/test_demo_replica_kill.py",
    "integration_tests/demo/test_demo_in_flight.py",
    "integration_tests/demo/test_demo_scale_out.py",
    "integration_tests/demo/test_demo_churn.py",
)
# Collection order, longest first: the demo's units, the other integration tests, the unit tests.
RUN_ORDER = (WHOLE_STACK_DIR, "integration_tests/", "tests/")


_OWN_CACHE = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """The run's shared cache folder, made once by the controlling process (workers inherit it)."""
    from rl360_ext.util.cache import CACHE_DIR_ENV

    if hasattr(config, "workerinput") or os.environ.get(CACHE_DIR_ENV):
        return
    folder = tempfile.mkdtemp(prefix="rl360-test-cache-")
    os.environ[CACHE_DIR_ENV] = folder
    config.stash[_OWN_CACHE] = folder


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_OWN_CACHE, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def work_unit(nodeid: str) -> str:
    """The xdist work unit of a test: one of the two whole-stack units, else its file."""
    if nodeid.startswith(WHOLE_STACK_DIR):
        return "whole-stack-2" if nodeid.startswith(SECOND_STACK_UNIT) else "whole-stack-1"
    return nodeid.split("::", 1)[0]


def _run_rank(nodeid: str) -> int:
    return next((rank for rank, prefix in enumerate(RUN_ORDER) if nodeid.startswith(prefix)), len(RUN_ORDER))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest-running folders first (stable within each), so no long unit starts last."""
    items.sort(key=lambda item: _run_rank(item.nodeid))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: absent where xdist is not installed
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduler with `work_unit` as the scope, units in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False
    return WorkUnitScheduling(config, log)
