"""The bwrap sandbox's lifecycle does per process what is the same for every sandbox (bwrap's
path, the read-only host view), leaves the event loop once per phase end, starts one fresh
holder for back-to-back phase ends (at the next command) and reads a holder's start in one
blocking call; what each sandbox sees is unchanged: the same read-only host paths, the same
directories emptied, no command in a half-started sandbox, bwrap's own words when it fails."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from harbor.models.task.config import EnvironmentConfig
from harbor.models.trial.paths import TrialPaths

from rl360_ext.harbor.envs import bwrap
from rl360_ext.harbor.envs.bwrap import BwrapEnvironment, environment, sandbox


def make_env(tmp_path: Path) -> BwrapEnvironment:
    environment_dir = tmp_path / "task" / "environment"
    environment_dir.mkdir(parents=True)
    trial_paths = TrialPaths(tmp_path / "trial")
    trial_paths.mkdir()
    env = BwrapEnvironment(
        environment_dir=environment_dir,
        environment_name="probe",
        session_id=f"probe__{uuid.uuid4().hex[:12]}",
        trial_paths=trial_paths,
        task_env_config=EnvironmentConfig(cpus=1, memory_mb=256),
        sandbox_root=str(tmp_path / "sandboxes"),
    )
    env.owner = (os.getuid(), os.getgid())  # the directories this test makes stay its own
    return env


def pairs(argv: list[str], flag: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, value in enumerate(argv) if value == flag]


def test_every_curated_etc_file_is_a_read_only_bind_tried_at_start(tmp_path: Path) -> None:
    argv = make_env(tmp_path)._bwrap_argv(info_fd=3, seccomp_fd=None)
    tried = pairs(argv, "--ro-bind-try")
    assert tried == [(f"/etc/{name}", f"/etc/{name}") for name in sandbox._ETC_FILES]
    assert ("/usr", "/usr") in pairs(argv, "--ro-bind")
    assert not [source for source, _ in pairs(argv, "--bind") if source.startswith(("/etc", "/usr"))]
    assert argv.index("--remount-ro") > max(i for i, value in enumerate(argv) if value == "--ro-bind-try")


def test_the_host_view_is_built_once_per_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = make_env(tmp_path)
    first = env._bwrap_argv(info_fd=3, seccomp_fd=None)
    looked_up: list[str] = []

    def which(*args: Any, **kwargs: Any) -> None:
        looked_up.append(str(args))

    monkeypatch.setattr(sandbox.shutil, "which", which)
    monkeypatch.setattr(sandbox.Path, "exists", lambda path: looked_up.append(str(path)) or True)
    assert env._bwrap_argv(info_fd=3, seccomp_fd=None) == first
    assert looked_up == []


def test_a_grading_phase_end_empties_every_directory_in_one_trip_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = make_env(tmp_path)
    env._init_pid = 1  # a running sandbox, as far as end_phase can tell
    calls: list[str] = []

    async def noop() -> None:
        calls.append("sandbox")

    monkeypatch.setattr(env, "_kill_sandbox", noop)
    monkeypatch.setattr(env, "_launch", noop)
    original = asyncio.to_thread

    async def to_thread(func: Any, /, *args: Any, **kwargs: Any) -> Any:
        calls.append(func.__name__)
        return await original(func, *args, **kwargs)

    monkeypatch.setattr(environment.asyncio, "to_thread", to_thread)
    resized: list[tuple[Path, int, int]] = []  # no tmpfs here: the remount is only recorded
    monkeypatch.setattr(environment, "remount_tmpfs", lambda *args: resized.append(args))
    planted = {}
    for name in ("tests", "solution", "logs/verifier", "tmp", "app", "logs/agent"):
        directory = env.files_dir / name
        directory.mkdir(parents=True)
        planted[name] = directory / "left.txt"
        planted[name].write_text("from the agent phase\n")

    asyncio.run(env.end_phase(("/logs/verifier", "/tests", "/solution"), grading=True))

    assert calls == ["sandbox", "_empty_all"]  # the fresh holder starts with the next command
    assert env._grading and env._holder_due
    gone = {name for name, path in planted.items() if not path.exists()}
    assert gone == {"tests", "solution", "logs/verifier", "tmp"}  # the work product stays
    options = env.options  # the tmpfs grows by the verifier's reserve
    size = (options.disk_mb + options.verifier_disk_mb) * 2**20
    assert resized == [(env.files_dir, size, options.max_inodes + options.verifier_inodes)]


def phase_probe(env: BwrapEnvironment, monkeypatch: pytest.MonkeyPatch, calls: list[str]) -> None:
    """`env` as a running sandbox whose kill and holder start only record themselves."""
    env._init_pid = 1

    async def kill() -> None:
        calls.append("kill")
        env._init_pid = None

    async def launch() -> None:
        calls.append("launch")
        env._init_pid = 2

    monkeypatch.setattr(env, "_kill_sandbox", kill)
    monkeypatch.setattr(env, "_launch", launch)
    monkeypatch.setattr(env, "_empty_all", lambda clear, grading: calls.append(f"empty {list(clear)}"))


def test_back_to_back_phase_ends_start_one_holder_at_the_next_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = make_env(tmp_path)
    calls: list[str] = []
    phase_probe(env, monkeypatch, calls)

    async def agent_end_then_grading() -> None:
        await env.end_phase()
        await env.end_phase(("/tests",), grading=True)
        await asyncio.gather(env.start_due_holder(), env.start_due_holder())  # two commands at once
        await env.start_due_holder()

    asyncio.run(agent_end_then_grading())

    assert calls == ["kill", "empty []", "empty ['/tests']", "launch"]
    assert env._grading and not env._holder_due and env._init_pid == 2


def test_a_holder_start_that_fails_leaves_nothing_and_stays_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = make_env(tmp_path)
    calls: list[str] = []
    phase_probe(env, monkeypatch, calls)

    async def broken() -> None:
        calls.append("launch")
        raise sandbox.SandboxBuildFailedError("bubblewrap failed to start: no")

    monkeypatch.setattr(env, "_launch", broken)

    async def scenario() -> None:
        await env.end_phase()
        with pytest.raises(sandbox.SandboxBuildFailedError):
            await env.exec("true")

    asyncio.run(scenario())

    assert calls == ["kill", "empty []", "launch", "kill"]
    assert env._holder_due  # a later command tries again; none runs in a half-started sandbox


def test_no_holder_starts_after_stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = make_env(tmp_path)
    calls: list[str] = []
    phase_probe(env, monkeypatch, calls)
    monkeypatch.setattr(env._limits, "close", lambda: calls.append("close"))

    async def scenario() -> None:
        await env.end_phase()
        await env.stop(delete=False)
        with pytest.raises(RuntimeError, match="is not running"):
            await env.exec("true")

    asyncio.run(scenario())

    assert calls == ["kill", "empty []", "kill", "close"]


def pipes(count: int) -> list[tuple[int, int]]:
    return [os.pipe() for _ in range(count)]


def closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def test_a_holders_start_is_read_in_one_blocking_call_that_closes_what_it_read() -> None:
    (info_r, info_w), (out_r, out_w), (err_r, err_w) = pipes(3)
    os.write(info_w, b'{"child-pid": 7}')
    os.close(info_w)
    os.write(out_w, b"ready\nwhatever the holder writes later\n")
    os.write(err_w, b"nothing to see")
    assert bwrap.read_handshake(info_r, out_r, err_r, 5.0) == (b'{"child-pid": 7}', b"ready\n", b"")
    assert closed(info_r) and closed(out_r) and closed(err_r)
    for fd in (out_w, err_w):
        os.close(fd)


def test_a_failed_start_returns_bwraps_stderr() -> None:
    (info_r, info_w), (out_r, out_w), (err_r, err_w) = pipes(3)
    os.write(err_w, b"bwrap: Can't mount proc on /newroot/proc: Operation not permitted\n")
    for fd in (info_w, out_w, err_w):
        os.close(fd)
    info, line, stderr = bwrap.read_handshake(info_r, out_r, err_r, 5.0)
    assert (info, line) == (b"", b"") and stderr.startswith(b"bwrap: Can't mount proc")


def test_a_start_that_never_reports_ready_ends_at_its_timeout() -> None:
    (info_r, info_w), (out_r, out_w), (err_r, err_w) = pipes(3)
    os.write(info_w, b'{"child-pid": 7}')
    os.close(info_w)
    os.write(out_w, b"rea")  # never a whole line
    os.close(err_w)
    info, line, stderr = bwrap.read_handshake(info_r, out_r, err_r, 0.2)
    assert (info, line, stderr) == (b'{"child-pid": 7}', b"rea", b"")
    os.close(out_w)


def test_stop_removes_the_cgroup_and_the_directories_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = make_env(tmp_path)
    calls: list[str] = []
    phase_probe(env, monkeypatch, calls)
    loop_thread = threading.get_ident()

    def where(what: str) -> None:
        calls.append(f"{what} {'on the loop' if threading.get_ident() == loop_thread else 'off it'}")

    monkeypatch.setattr(env._limits, "detach", lambda: where("detach"))
    monkeypatch.setattr(env._limits, "close", lambda: where("close"))
    monkeypatch.setattr(env, "_remove_dirs", lambda: where("remove"))
    asyncio.run(env.stop(delete=True))

    assert calls == ["kill", "detach on the loop", "close off it", "remove off it"]
