"""A missing prerequisite ends any command with one line and exit status 2, never a traceback; a
first `rl360 demo` as root with apt-get installs bubblewrap and tmux itself.

The missing prerequisites are simulated: PATH without the host tools (and a fake `apt-get` that
records its calls and "installs" by writing executables), `sys.modules["harbor"] = None` for the
harbor extra, a patched interpreter version, a patched smg lookup.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from rl360_ext.cli import app, prerequisite_line
from rl360_ext.local import stack as stack_module
from rl360_ext.local.demo.plan import DemoConfig
from rl360_ext.local.demo.stack import demo_stack_config
from rl360_ext.local.stack import preflight
from rl360_ext.util import prereqs
from rl360_ext.util.prereqs import EXIT_UNAVAILABLE, Unavailable
from rl360_ext.util.procs import ServiceStartError

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _executable(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _fake_apt(bin_dir: Path, log: Path, install_exit: int = 0) -> None:
    """An apt-get that logs its argv; `install` writes a bwrap and a tmux that exit 0."""
    _executable(
        bin_dir / "apt-get",
        f'echo "$*" >> {log}\n'
        'if [ "$1" = install ]; then\n'
        f"  [ {install_exit} -eq 0 ] || {{ echo 'E: Unable to locate package' >&2; exit {install_exit}; }}\n"
        f"  for tool in bwrap tmux; do printf '#!/bin/sh\\nexit 0\\n' > {bin_dir}/$tool; "
        f"/bin/chmod +x {bin_dir}/$tool; done\n"
        "fi",
    )


def _rl360(
    *args: str, path: str, prelude: str = "", cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The rl360 CLI in its own process, PATH replaced (the venv's smg is found beside Python)."""
    code = f"{prelude}\nfrom rl360_ext.cli import app\napp()"
    env = {**os.environ, "PATH": path, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd
    )


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == EXIT_UNAVAILABLE, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# ---- real processes: what a user sees --------------------------------------------------------------


def test_demo_without_host_tools_and_no_apt_says_what_to_run(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    line = _one_line(_rl360("demo", "--out", str(tmp_path / "out"), path=str(empty)))
    assert line.startswith("rl360 demo needs ") and "apt-get install -y bubblewrap tmux" in line, line
    assert not (tmp_path / "out").exists(), "nothing may start before the prerequisites are there"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="installing needs root")
def test_demo_as_root_when_apt_fails_says_what_to_run(tmp_path: Path) -> None:
    bin_dir, log = tmp_path / "bin", tmp_path / "apt.log"
    bin_dir.mkdir()
    _fake_apt(bin_dir, log, install_exit=100)
    result = _rl360("demo", "--out", str(tmp_path / "out"), path=str(bin_dir))
    assert result.returncode == EXIT_UNAVAILABLE and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert (
        lines[0]
        == "rl360: installing bubblewrap tmux with apt-get (missing on this machine; running as root) ..."
    )
    assert len(lines) == 2 and "Unable to locate package" in lines[1], lines
    assert lines[1].endswith("run: apt-get install -y bubblewrap tmux")
    assert log.read_text().splitlines() == ["update", "install -y --no-install-recommends bubblewrap tmux"]


def test_harbor_serve_without_the_harbor_extra_is_one_line(tmp_path: Path) -> None:
    prelude = "import sys; sys.modules['harbor'] = None"
    line = _one_line(_rl360("harbor", "serve", "--port", "9", path=os.environ["PATH"], prelude=prelude))
    assert line.startswith("rl360 harbor needs the Python package 'harbor': pip install 'rl360-ext[harbor]'")


def test_bench_faults_without_bubblewrap_is_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    line = _one_line(_rl360("bench", "faults", path=str(empty)))
    assert line.startswith("rl360 bench faults needs bubblewrap for the sandboxes"), line


# ---- in process: each prerequisite ------------------------------------------------------------------


@pytest.fixture
def apt_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH is only a fake apt-get (no bwrap, no tmux); the file it logs its calls to."""
    bin_dir, log = tmp_path / "bin", tmp_path / "apt.log"
    bin_dir.mkdir()
    _fake_apt(bin_dir, log)
    monkeypatch.setenv("PATH", str(bin_dir))
    return log


def test_first_run_as_root_installs_with_one_update(
    tmp_path: Path, apt_log: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log = apt_log
    monkeypatch.setattr(prereqs.os, "geteuid", lambda: 0)
    preflight(demo_stack_config(DemoConfig(out=tmp_path / "out")), install=True)
    assert log.read_text().splitlines() == ["update", "install -y --no-install-recommends bubblewrap tmux"]
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "rl360: installing bubblewrap tmux with apt-get (missing on this machine; running as root) ...",
        "rl360: installed bubblewrap tmux",
    ]
    preflight(demo_stack_config(DemoConfig(out=tmp_path / "out")), install=True)  # nothing left to do
    assert len(log.read_text().splitlines()) == 2


def test_not_root_is_told_to_sudo_and_nothing_installs(
    tmp_path: Path, apt_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prereqs.os, "geteuid", lambda: 1000)
    with pytest.raises(Unavailable, match=r"\(sudo apt-get install -y bubblewrap tmux\)$"):
        preflight(demo_stack_config(DemoConfig(out=tmp_path)), install=True)
    assert not apt_log.exists()


def _invoke(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == EXIT_UNAVAILABLE, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


def test_missing_smg_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prereqs, "find_executable", lambda name: None)
    line = _invoke("demo", "--out", str(tmp_path))
    assert line.startswith("rl360 demo needs the smg gateway (pip install 'smg>=1.13'"), line


def test_missing_harbor_extra_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "harbor", None)
    line = _invoke("demo", "--out", str(tmp_path))
    assert "the Python package 'harbor' (pip install 'rl360-ext[harbor]' (Python >= 3.12)" in line, line


def test_python_too_old_for_harbor_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        prereqs, "sys", SimpleNamespace(version_info=(3, 11, 9, "final", 0), stderr=sys.stderr)
    )
    line = _invoke("demo", "--out", str(tmp_path))
    assert "the harbor extra needs Python >= 3.12 (this is 3.11.9): recreate .venv" in line, line


def test_a_service_that_cannot_start_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import rl360_ext.local.demo.run as demo

    def fail(config: object) -> None:
        raise ServiceStartError("engine0 exited with 1 before it was ready", tmp_path / "engine0.log", "a\nb")

    monkeypatch.setattr(stack_module, "preflight", lambda *args, **kwargs: None)
    monkeypatch.setattr(demo, "run_demo", fail)
    line = _invoke("demo", "--out", str(tmp_path))
    assert line == f"rl360 demo: engine0 exited with 1 before it was ready (log: {tmp_path / 'engine0.log'})"


def test_other_errors_are_not_swallowed() -> None:
    assert prerequisite_line(ValueError("a bug"), "rl360 demo") is None
    assert prerequisite_line(ModuleNotFoundError("x", name="rl360_ext.nope"), "rl360 demo") is None
    assert prerequisite_line(ModuleNotFoundError("x", name="torch.nn"), "rl360 audit") == (
        "rl360 audit needs the Python package 'torch': pip install torch"
    )


def test_bwrap_that_cannot_sandbox_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "bwrap", "echo 'bwrap: No permissions to creating new namespace' >&2; exit 1")
    monkeypatch.setenv("PATH", str(bin_dir))
    problem = prereqs.bwrap_problem()
    assert problem is not None and problem.endswith(
        "cannot create a sandbox here: bwrap: No permissions to creating new namespace"
    )


def test_stack_prerequisites_follow_the_config(tmp_path: Path) -> None:
    demo = demo_stack_config(DemoConfig(out=tmp_path))
    assert demo.prerequisites() == (("bwrap", "tmux"), ("harbor",))
    bare = stack_module.StackConfig(out=tmp_path, gateway=False)
    assert bare.prerequisites() == ((), ())
