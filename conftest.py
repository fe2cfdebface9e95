"""Test-wide settings: a hypothesis profile that tolerates a loaded 2-core machine, and how the
suite is split over pytest-xdist workers.

Distribution (`--dist loadgroup`, scripts/test.sh): a test that uses a fixture shared by its
module (a tiny engine, a session server, a fault-matrix stack, a Ray cluster) runs on the same
worker as the rest of its module, so the module starts that stack once; every other test is
handed out on its own. Tests that bind ports take them from the kernel (port 0), sandboxes and
task copies live under per-test or per-worker folders, and each worker starts its own local Ray,
so workers never share a port, a folder or a cluster.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "rl360",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("rl360")

SHARED_SCOPES = frozenset({"module", "package"})


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        definitions[-1].scope in SHARED_SCOPES
        for definitions in info.name2fixturedefs.values()
        if definitions
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep a module's tests on one worker when they share a module-scoped fixture."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None and _shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
