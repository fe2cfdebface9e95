"""`rl360 doctor`: checks what this machine has for rl360 and says what to do about what is missing.

Owns the list of checks (Python version, extras, the smg binary, bubblewrap, tmux, Ray, Chromium
for report tests). Each check returns OK or a concrete remedy, in the words of
`rl360_ext.util.prereqs` (the same lines a command stops with); nothing here installs anything
(`rl360 demo` installs bubblewrap and tmux itself on a first run as root).
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass

from rl360_ext.util.prereqs import (
    HARBOR_PYTHON,
    bwrap_problem,
    host_tools_problem,
    package_problem,
    python_problem,
    smg_problem,
)
from rl360_ext.util.procs import find_executable


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def _python() -> Check:
    version = ".".join(map(str, sys.version_info[:3]))
    if python_problem(HARBOR_PYTHON) is None:
        return Check("python", True, f"{version} (core and the harbor extra)")
    return Check("python", True, f"{version}: core only; the harbor extra needs Python >= 3.12")


def _module(name: str) -> Check:
    problem = package_problem(name)
    if problem is not None:
        return Check(name, False, problem)
    from importlib.metadata import PackageNotFoundError, version

    try:
        return Check(name, True, version(name))
    except PackageNotFoundError:
        return Check(name, True, "importable")


def _smg() -> Check:
    problem = smg_problem()
    return Check("smg", problem is None, problem or str(find_executable("smg")))


def _bwrap() -> Check:
    problem = bwrap_problem()
    return Check("bubblewrap", problem is None, problem or str(shutil.which("bwrap")))


def _tmux() -> Check:
    problem = host_tools_problem(["tmux"])
    return Check("tmux", problem is None, problem or str(shutil.which("tmux")))


def _chromium() -> Check:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        return Check("chromium", False, "apt-get install chromium (only for the report rendering tests)")
    return Check("chromium", True, path)


def run_checks() -> list[Check]:
    return [_python(), _module("harbor"), _module("ray"), _smg(), _bwrap(), _tmux(), _chromium()]
