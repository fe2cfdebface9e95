"""Whether the real components the integration tests start can run on this machine.

Owns the probes behind the skips shared by several integration folders (harbor, rollout, demo,
miles): a bubblewrap sandbox that actually starts, and the smg binary. Each probe returns why the
component cannot run, or None; `skip_if_missing` turns the first reason into `pytest.skip`. It
starts no services.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Callable

import pytest

from rl360_ext.util.procs import find_executable


@functools.cache
def bwrap_problem() -> str | None:
    """Why bubblewrap sandboxes cannot run here, or None when they can."""
    binary = shutil.which("bwrap")  # found as rl360_ext.harbor.envs.bwrap finds it
    if binary is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    if os.geteuid() != 0:
        return "the bwrap sandbox runs as root (it maps the sandbox to an unprivileged uid)"
    probe = subprocess.run(
        [binary, "--unshare-all", "--ro-bind", "/", "/", "--", "true"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if probe.returncode != 0:
        return f"bubblewrap cannot create a sandbox here: {probe.stderr.strip()[:200]}"
    return None


def smg_problem() -> str | None:
    """Why the smg gateway cannot run here, or None when it can."""
    if find_executable("smg") is None:
        return "the smg binary is not installed (pip install smg)"
    return None


def skip_if_missing(*probes: Callable[[], str | None]) -> None:
    """Skip the calling test with the first probe's reason, if any probe finds a problem."""
    for probe in probes:
        problem = probe()
        if problem is not None:
            pytest.skip(problem)
