"""`rl360 doctor`: checks what this machine has for rl360 and says what to do about what is missing.

Owns the list of checks (Python version, extras, the smg binary, bubblewrap, Ray, Chromium for
report tests). Each check returns OK or a concrete remedy; nothing here installs anything.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from dataclasses import dataclass

from rl360_ext.util.procs import find_executable


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def _python() -> Check:
    version = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info >= (3, 12):
        return Check("python", True, f"{version} (core and the harbor extra)")
    return Check("python", True, f"{version}: core only; the harbor extra needs Python >= 3.12")


def _module(name: str, remedy: str) -> Check:
    if importlib.util.find_spec(name) is None:
        return Check(name, False, remedy)
    from importlib.metadata import PackageNotFoundError, version

    try:
        return Check(name, True, version(name))
    except PackageNotFoundError:
        return Check(name, True, "importable")


def _smg() -> Check:
    path = find_executable("smg")
    if path is None:
        return Check("smg", False, "pip install 'smg>=1.13' (the SMG gateway binary, `smg launch`)")
    return Check("smg", True, path)


def _bwrap() -> Check:
    path = shutil.which("bwrap")
    if path is None:
        return Check("bubblewrap", False, "apt-get install bubblewrap (sandboxes without a container engine)")
    probe = subprocess.run(
        [path, "--ro-bind", "/", "/", "--unshare-net", "true"], capture_output=True, text=True, timeout=20
    )
    if probe.returncode != 0:
        return Check(
            "bubblewrap", False, f"{path} cannot create a sandbox here: {probe.stderr.strip()[:200]}"
        )
    return Check("bubblewrap", True, path)


def _chromium() -> Check:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        return Check("chromium", False, "apt-get install chromium (only for the report rendering tests)")
    return Check("chromium", True, path)


def run_checks() -> list[Check]:
    return [
        _python(),
        _module("harbor", "pip install 'rl360-ext[harbor]' (needs Python >= 3.12)"),
        _module("ray", "pip install ray"),
        _smg(),
        _bwrap(),
        _chromium(),
    ]
