"""The core package (everything but the Harbor server) imports on Python 3.11, Miles' CI Python.

Builds `.venv-py311` in the repo root once (an editable install of the package without the harbor
extra, resolved from its own dependency ranges as a user's `pip install .` would be; installed with
uv, the dev extra's installer, which does in about 3 s what pip did in 85) and imports every module
of every non-Harbor subpackage there.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-py311"
# Modules that exist only for the Harbor server process (the `harbor` extra, Python >= 3.12).
HARBOR_EXTRA_MODULES = frozenset({"rl360_ext.local.fixtures.agents"})


def _python311() -> str | None:
    for candidate in ("python3.11", str(Path.home() / ".pyenv/versions/3.11.7/bin/python3.11")):
        found = shutil.which(candidate)
        if found:
            return found
    return None


def _core_modules() -> list[str]:
    modules = []
    for path in sorted((ROOT / "rl360_ext").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if len(parts) > 1 and parts[1] == "harbor" and parts[-1] != "cli" and len(parts) > 2:
            continue
        if ".".join(parts) in HARBOR_EXTRA_MODULES or parts[:4] == (
            "rl360_ext",
            "local",
            "fixtures",
            "tasks",
        ):
            continue
        modules.append(".".join(parts))
    return modules


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_core_imports_on_python_311() -> None:
    python = _python311()
    if python is None:
        pytest.skip("python3.11 is not installed on this machine")
    stamp = VENV / ".rl360-installed"
    if not stamp.exists() or (ROOT / "pyproject.toml").stat().st_mtime > stamp.stat().st_mtime:
        uv = Path(sys.executable).with_name("uv")
        assert uv.is_file(), f"{uv} is missing: the dev extra installs uv (scripts/bootstrap.sh)"
        subprocess.run([str(uv), "venv", "--quiet", "--clear", "--python", python, str(VENV)], check=True)
        subprocess.run(
            [str(uv), "pip", "install", "--quiet", "--python", str(VENV / "bin/python"), "-e", str(ROOT)],
            check=True,
            timeout=840,
        )
        stamp.touch()
    modules = _core_modules()
    assert "rl360_ext.reference.engine" in modules and "rl360_ext.cli" in modules
    script = (
        "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\nprint(sys.version)"
    )
    result = subprocess.run(
        [str(VENV / "bin/python"), "-c", script, *modules], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("3.11"), result.stdout
    assert sys.version_info >= (3, 12)
