"""What this machine must have for a command, and the one line that says how to get it.

Owns the prerequisite vocabulary every command shares: `Unavailable` (a missing prerequisite;
its message is one line saying what to run), the remedy for each prerequisite (the Python
version, the `harbor` extra and other Python packages, the `smg` binary, the host tools
bubblewrap and tmux), the bubblewrap probe (installed is not enough: the kernel must let it
create a sandbox), and installing missing host tools with apt-get on a first run as root
(`apt-get update` once, then one `apt-get install`, announced on stderr). The CLI turns
`Unavailable` into its line and exit status 2 (`rl360_ext.cli`); `rl360 doctor` reports the same
checks and installs nothing; `rl360_ext.local.stack.preflight` decides which a run needs.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence

from rl360_ext.errors import Rl360Error
from rl360_ext.util.procs import find_executable

EXIT_UNAVAILABLE = 2  # the exit status of a command stopped by a missing prerequisite
HARBOR_PYTHON = (3, 12)  # the harbor extra's Python floor (pyproject: python_version >= '3.12')

# Host executables rl360 runs and the Debian package that ships each one.
HOST_PACKAGES: dict[str, str] = {"bwrap": "bubblewrap", "tmux": "tmux"}
HOST_TOOL_USE: dict[str, str] = {
    "bwrap": "bubblewrap for the sandboxes",
    "tmux": "tmux for Harbor's shell agents",
}
PACKAGE_REMEDIES: dict[str, str] = {
    "harbor": "pip install 'rl360-ext[harbor]' (Python >= 3.12); in a checkout: bash scripts/bootstrap.sh",
    "ray": "pip install ray",
    "openai": "pip install 'rl360-ext[demo]' (the demo's Harbor agents use the openai client)",
    "litellm": "pip install 'rl360-ext[dev]'",
    "smg": "pip install 'smg>=1.13'",
}
SMG_REMEDY = "pip install 'smg>=1.13' (the SMG gateway binary, `smg launch`; in 'rl360-ext[demo]')"
_APT_ENV = {"DEBIAN_FRONTEND": "noninteractive"}
_APT_TIMEOUT_S = 600


class Unavailable(Rl360Error, RuntimeError):
    """A prerequisite is missing on this machine; the message is one line saying what to run."""


def python_problem(needed: tuple[int, int] = HARBOR_PYTHON) -> str | None:
    """Why this interpreter is too old for `needed`, or None."""
    if sys.version_info >= needed:
        return None
    have = ".".join(map(str, sys.version_info[:3]))
    want = ".".join(map(str, needed))
    return (
        f"Python >= {want} (this is {have}): recreate .venv with python{want} "
        f"(rm -rf .venv && RL360_PYTHON=python{want} bash scripts/bootstrap.sh)"
    )


def package_remedy(name: str) -> str:
    """How to install the Python package whose top-level module is `name`."""
    return PACKAGE_REMEDIES.get(name, f"pip install {name}")


def package_problem(name: str) -> str | None:
    """Why the Python package `name` cannot be imported here, or None."""
    if name == "harbor" and (too_old := python_problem()) is not None:
        return f"the harbor extra needs {too_old}"
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken install: a parent module fails, or no __spec__
        found = False
    return None if found else f"the Python package {name!r} ({package_remedy(name)})"


def smg_problem() -> str | None:
    """Why the SMG gateway binary cannot be found, or None."""
    return None if find_executable("smg") else f"the smg gateway ({SMG_REMEDY})"


def bwrap_problem() -> str | None:
    """Why bubblewrap sandboxes cannot run here (not installed, or the kernel refuses), or None."""
    binary = shutil.which("bwrap")  # found as rl360_ext.harbor.envs.bwrap finds it
    if binary is None:
        return f"bubblewrap is not installed ({apt_command(['bubblewrap'])})"
    if os.geteuid() != 0:
        return "the bwrap sandbox needs root (it maps each sandbox to an unprivileged uid of its own)"
    try:
        probe = subprocess.run(
            [binary, "--unshare-all", "--ro-bind", "/", "/", "--", "true"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{binary} cannot create a sandbox here: {exc}"
    if probe.returncode != 0:
        detail = " ".join(probe.stderr.split())[:200] or f"exit {probe.returncode}"
        return f"{binary} cannot create a sandbox here: {detail}"
    return None


def missing_host_tools(tools: Sequence[str]) -> list[str]:
    """The executables of `tools` (keys of HOST_PACKAGES) not on PATH."""
    return [tool for tool in tools if shutil.which(tool) is None]


def apt_command(packages: Sequence[str]) -> str:
    """The command a user runs to install Debian `packages` (with sudo unless root)."""
    prefix = "" if _is_root() else "sudo "
    return f"{prefix}apt-get install -y {' '.join(packages)}"


def can_apt_install() -> bool:
    """Whether this process may install system packages itself: root, with apt-get on PATH (CI)."""
    return _is_root() and shutil.which("apt-get") is not None


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def apt_install(packages: Sequence[str], say: Callable[[str], None] = _say) -> None:
    """`apt-get update` once, then `apt-get install -y packages`, saying so through `say`; raises
    Unavailable (one line, with the command to run by hand) when either fails."""
    names = " ".join(packages)
    say(f"rl360: installing {names} with apt-get (missing on this machine; running as root) ...")
    for argv in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", *packages]):
        command = " ".join(argv)
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=_APT_TIMEOUT_S,
                env={**os.environ, **_APT_ENV},
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise Unavailable(f"rl360: `{command}` failed ({exc}); run: {apt_command(packages)}") from None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:200]
            raise Unavailable(f"rl360: `{command}` failed ({last}); run: {apt_command(packages)}")
    say(f"rl360: installed {names}")


def ensure_host_tools(tools: Sequence[str], *, install: bool, say: Callable[[str], None] = _say) -> list[str]:
    """Install the missing `tools` with apt-get when `install` and this process may (root with
    apt-get); returns the packages installed. Tools still missing afterwards are left for the
    caller's check to name."""
    missing = missing_host_tools(tools)
    if not missing or not install or not can_apt_install():
        return []
    packages = [HOST_PACKAGES[tool] for tool in missing]
    apt_install(packages, say)
    return packages


def host_tools_problem(tools: Sequence[str]) -> str | None:
    """What is missing of `tools` and the one command that installs all of it, or None."""
    missing = missing_host_tools(tools)
    if not missing:
        return None
    uses = ", ".join(HOST_TOOL_USE.get(tool, tool) for tool in missing)
    return f"{uses} ({apt_command([HOST_PACKAGES[tool] for tool in missing])})"


def require(what: str, problems: Sequence[str | None]) -> None:
    """Raise Unavailable("<what> needs A; B") when any of `problems` is not None."""
    found = [problem for problem in problems if problem is not None]
    if found:
        raise Unavailable(f"{what} needs " + "; ".join(found))
