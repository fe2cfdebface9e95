"""Real processes for the Harbor integration tests; every test here is skipped where bubblewrap
cannot create a sandbox."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from harbor.models.task.config import EnvironmentConfig, NetworkMode
from harbor.models.trial.paths import TrialPaths

from integration_tests.components import bwrap_problem, skip_if_missing
from rl360_ext.harbor.envs.bwrap import FILES_DIR, BwrapEnvironment
from rl360_ext.harbor.envs.limits import unmount
from rl360_ext.util.procs import Service, free_port, rl360_argv, start_service

_SANDBOX_ROOTS = Path(tempfile.gettempdir()) / f"rl360-test-sandboxes-{os.getpid()}"


def fork_bomb(sleep_s: int) -> str:
    """A command that forks until refused (at most 2,000 times and 5 s) and prints "<forked>
    <refused>"; the children sleep `sleep_s` as `sleep` (the watchdog sums resident memory, and 60
    forked Pythons would look like 500 MB)."""
    return rf"""python3 -c '
import os, time
forked = refused = 0
end = time.monotonic() + 5
while forked + refused < 2000 and time.monotonic() < end:
    try:
        pid = os.fork()
    except OSError:
        refused += 1
        continue
    if pid == 0:
        os.execv("/usr/bin/sleep", ["sleep", "{sleep_s}"])
    forked += 1
print(forked, refused)
'"""


def sandbox_root(tmp_path: Path) -> Path:
    """A sandbox root the unprivileged sandbox uid can reach (pytest's own tmp dirs are 0700):
    a 0711 directory under /tmp named after the test's tmp dir, removed with the test session."""
    root = _SANDBOX_ROOTS / tmp_path.name
    root.mkdir(parents=True, exist_ok=True)
    for directory in (root, root.parent):
        directory.chmod(0o711)
    return root


def make_env(
    tmp_path: Path,
    *,
    memory_mb: int | None = 256,
    setup: str | None = None,
    network_mode: NetworkMode = NetworkMode.NO_NETWORK,
    workdir: str | None = None,
    **options: object,
) -> BwrapEnvironment:
    """A bwrap environment for a one-file task (`/app/seed.txt`), not started yet; `options` are
    BwrapConfig (`sandbox_root` defaults to one of the test's own)."""
    environment_dir = tmp_path / "task" / "environment"
    (environment_dir / "app").mkdir(parents=True)
    (environment_dir / "app" / "seed.txt").write_text("seeded\n")
    if setup is not None:
        (environment_dir / "setup.sh").write_text(setup)
    trial_paths = TrialPaths(tmp_path / "trial")
    trial_paths.mkdir()
    return BwrapEnvironment(
        environment_dir=environment_dir,
        environment_name="probe",
        session_id=f"probe__{os.getpid()}__{uuid.uuid4().hex[:12]}",
        trial_paths=trial_paths,
        task_env_config=EnvironmentConfig(
            network_mode=network_mode, cpus=1, memory_mb=memory_mb, workdir=workdir
        ),
        **{"sandbox_root": str(sandbox_root(tmp_path)), **options},
    )


@pytest.fixture(scope="session", autouse=True)
def _remove_sandbox_roots() -> Iterator[None]:
    yield
    with contextlib.suppress(FileNotFoundError):  # a test that failed before stop() left its tmpfs
        for mount_point in sorted(_SANDBOX_ROOTS.glob(f"*/*/{FILES_DIR}")):
            unmount(mount_point)
    shutil.rmtree(_SANDBOX_ROOTS, ignore_errors=True)


@pytest.fixture(autouse=True)
def _needs_bwrap() -> None:
    skip_if_missing(bwrap_problem)


@contextlib.contextmanager
def _harbor_server(log_dir: Path, *args: str) -> Iterator[Service]:
    """`rl360 harbor serve` as a real process on loopback, stopped (and its sandboxes with it) on exit."""
    port = free_port()
    trials = ("--trials-dir", str(log_dir / "trials"))
    argv = rl360_argv("harbor", "serve", "--host", "127.0.0.1", "--port", str(port), *trials, *args)
    service = start_service("harbor", argv, port, log_dir, ready_timeout_s=90, stop_grace_s=30)
    try:
        yield service
    finally:
        service.stop()


def _descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every live descendant of a process."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{entry.name}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            with contextlib.suppress(OSError):
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                found.append((child, cmdline))
            stack.append(child)
    return found


@pytest.fixture(scope="session")
def harbor_server() -> Callable[..., contextlib.AbstractContextManager[Service]]:
    """Factory: `with harbor_server(log_dir, *serve_flags) as service: ...`."""
    return _harbor_server


@pytest.fixture(scope="session")
def descendants() -> Callable[[int], list[tuple[int, str]]]:
    return _descendants
