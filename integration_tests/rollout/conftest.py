"""Skip the rollout integration tests where their real components cannot run (no sandbox, no smg)."""

from __future__ import annotations

import functools
import subprocess

import pytest

from rl360_ext.diagnostics.doctor import find_executable


@functools.cache
def missing_component() -> str | None:
    """Why the fault matrix cannot run here, or None."""
    if find_executable("smg") is None:
        return "the smg binary is not installed (pip install smg)"
    from rl360_ext.harbor.envs.bwrap import bwrap_executable

    binary = bwrap_executable()
    if binary is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    probe = subprocess.run(
        [binary, "--unshare-all", "--ro-bind", "/", "/", "--", "true"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if probe.returncode != 0:
        return f"bubblewrap cannot create a sandbox here: {probe.stderr.strip()[:200]}"
    return None


@pytest.fixture(autouse=True)
def _needs_components() -> None:
    problem = missing_component()
    if problem is not None:
        pytest.skip(problem)
