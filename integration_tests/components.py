"""Whether the real components the integration tests start can run on this machine.

Owns the skips shared by several integration folders (harbor, rollout, demo, miles): a
bubblewrap sandbox that actually starts, and the smg binary, probed as `rl360_ext.util.prereqs`
probes them for the commands. Each probe returns why the component cannot run, or None;
`skip_if_missing` turns the first reason into `pytest.skip`. It starts no services.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import pytest

from rl360_ext.util import prereqs

# The probes the commands themselves stop on (rl360_ext.util.prereqs); bubblewrap's runs once.
bwrap_problem = functools.cache(prereqs.bwrap_problem)
smg_problem = prereqs.smg_problem


def mark_checkout_folder(
    items: list[pytest.Item], folder: Path, skip_reason: Callable[[], str | None]
) -> None:
    """Mark the tests under `folder` (a suite that runs against an upstream checkout) integration
    and miles, each skipped with `skip_reason()`'s answer when it gives one (asked only if any is)."""
    ours = [item for item in items if folder in Path(str(item.path)).resolve().parents]
    if not ours:
        return
    reason = skip_reason()
    for item in ours:
        item.add_marker(pytest.mark.integration)
        item.add_marker(pytest.mark.miles)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


def skip_if_missing(*probes: Callable[[], str | None]) -> None:
    """Skip the calling test with the first probe's reason, if any probe finds a problem."""
    for probe in probes:
        problem = probe()
        if problem is not None:
            pytest.skip(problem)
