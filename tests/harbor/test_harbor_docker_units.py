"""The docker environment's and the container stack's pure logic: Compose overrides, commands run in
the container, cgroup counters, the engine's address, cleanup selection, the stack's record and its
one-line errors. No engine runs here (integration_tests/docker/ runs one)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl360_ext.containers import engine, image, stack
from rl360_ext.containers.paths import Process, StackPaths, StackRecord, running_engine_host
from rl360_ext.harbor.envs import choice
from rl360_ext.harbor.envs.docker import (
    IMPORT_PATH,
    DockerConfig,
    RlDockerEnvironment,
    cgroup_counter,
    cgroup_files,
    compose_override,
    empty_command,
    on_engine,
    pull_refused,
    resolve_host,
    setup_command,
)
from rl360_ext.harbor.runner import EnvironmentSpec


def test_the_override_labels_limits_and_cuts_the_network() -> None:
    override = compose_override(owner="12.34", trial="t__1", no_network=True, max_pids=256, memory_mb=512)
    main = override["services"]["main"]
    assert main["labels"] == {engine.OWNER_LABEL: "12.34", engine.TRIAL_LABEL: "t__1"}
    assert (main["network_mode"], main["pids_limit"], main["memswap_limit"], main["init"]) == (
        "none",
        256,
        "512m",
        True,
    )


def test_the_override_leaves_network_and_swap_alone_when_not_asked() -> None:
    main = compose_override(owner="1.2", trial="t", no_network=False, max_pids=64, memory_mb=None)[
        "services"
    ]["main"]
    assert "network_mode" not in main and "memswap_limit" not in main


def test_a_built_image_carries_the_owner_and_a_prebuilt_one_is_not_built() -> None:
    built = compose_override(owner="1.2", trial="t", no_network=True, max_pids=64, memory_mb=None)
    assert built["services"]["main"]["build"] == {
        "labels": {engine.OWNER_LABEL: "1.2", engine.TRIAL_LABEL: "t"}
    }
    prebuilt = compose_override(
        owner="1.2", trial="t", no_network=True, max_pids=64, memory_mb=None, builds=False
    )
    assert "build" not in prebuilt["services"]["main"]


def test_setup_gives_the_user_its_directories_and_keeps_tmp_sticky() -> None:
    command = setup_command("/app", 1000, ("/logs", "/tests"))
    assert "chown -R 1000:1000 /app /logs /tests" in command
    assert command.endswith("chmod 1777 /tmp")


def test_empty_keeps_only_the_named_entry_and_quotes_paths() -> None:
    command = empty_command(["/tmp"], keep="work dir")
    assert "! -name 'work dir'" in command and "-mindepth 1 -maxdepth 1" in command
    assert empty_command(["/a b"]).count("'/a b'") == 2


def test_cgroup_files_v1_and_v2(tmp_path: Path) -> None:
    v1 = "12:pids:/docker/abc\n4:memory:/docker/abc\n1:cpu,cpuacct:/docker/abc\n0::/\n"
    files = cgroup_files(v1, tmp_path)
    assert files["memory"] == tmp_path / "memory/docker/abc/memory.oom_control"
    assert files["pids"] == tmp_path / "pids/docker/abc/pids.events"
    v2 = cgroup_files("0::/system.slice/docker-abc.scope\n", tmp_path)
    assert v2["memory"] == tmp_path / "system.slice/docker-abc.scope/memory.events"


@given(st.integers(min_value=0, max_value=10**9))
def test_counters_read_their_key_only(value: int) -> None:
    text = f"oom_kill_disable 0\nunder_oom 0\noom_kill {value}\n"
    assert cgroup_counter(text, "oom_kill") == value
    assert cgroup_counter(f"max {value}\n", "max") == value
    assert cgroup_counter("", "max") == 0


def test_the_engine_is_the_nodes_then_the_option_then_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///env.sock")
    pinned = DockerConfig(node_label="b", node_hosts={"a": "unix:///a.sock", "b": "unix:///b.sock"})
    assert resolve_host(pinned) == "unix:///b.sock"
    assert resolve_host(DockerConfig(docker_host="unix:///opt.sock")) == "unix:///opt.sock"
    assert resolve_host(DockerConfig(node_label="elsewhere")) == "unix:///env.sock"


def test_harbors_engine_level_calls_go_to_the_trials_engine() -> None:
    """Harbor calls `type(env)._engine_cmd(...)` for `docker cp` and its checks: a trial pinned to a
    node's engine gets a class that names that engine; one class per engine."""
    on_b = on_engine(RlDockerEnvironment, "unix:///b.sock")
    command = on_b._engine_cmd("cp", "x", "y")
    assert command[1:] == ["--host", "unix:///b.sock", "cp", "x", "y"] and command[0].endswith("docker")
    assert on_engine(RlDockerEnvironment, "unix:///b.sock") is on_b and issubclass(on_b, RlDockerEnvironment)
    on_a = on_engine(on_b, "tcp://10.0.0.2:2376")
    assert on_a.__mro__[1] is RlDockerEnvironment and on_a._engine_cmd("info")[1:3] == ["--host", "tcp://10.0.0.2:2376"]
    assert "--host" not in RlDockerEnvironment._engine_cmd("info")


def test_no_engine_is_one_line_naming_the_remedy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setenv("RL360_CONTAINERS_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="rl360 containers up") as raised:
        resolve_host(DockerConfig())
    assert "\n" not in str(raised.value)


def test_bad_options_name_the_field() -> None:
    with pytest.raises(ValueError, match="sandbox_uid"):
        DockerConfig(sandbox_uid=0)
    with pytest.raises(ValueError, match="max_pids"):
        DockerConfig(max_pids=1)


def test_env_docker_is_rl360s_environment_with_placement() -> None:
    spec = EnvironmentSpec.parse("docker")
    assert (choice.IMPORT_PATHS["docker"], spec.placement_kwarg) == (IMPORT_PATH, "node_label")
    assert (
        EnvironmentSpec.parse("harbor.environments.docker.docker:DockerEnvironment").placement_kwarg is None
    )


_owner = st.sampled_from(["1.1", "2.2", "3.3"])
_row = st.builds(
    engine.Labelled,
    st.text("abcdef0123", min_size=4, max_size=8),
    _owner,
    st.sampled_from(["", "p1", "p2"]),
    st.booleans(),
)


@given(st.lists(_row, max_size=12), st.sets(_owner))
def test_stale_never_selects_a_live_owners_container_or_project(
    rows: list[engine.Labelled], live: set[str]
) -> None:
    selected = engine.stale(rows, lambda owner: owner in live)
    live_projects = {row.project for row in rows if row.owner in live}
    dead_ids = {row.id for row in rows if row.owner not in live and not row.image}
    dead_projects = {row.project for row in rows if row.owner not in live and row.project}
    assert set(selected.containers) == dead_ids  # images go with their project, never by `docker rm`
    assert not set(selected.projects) & live_projects
    assert set(selected.projects) == dead_projects - live_projects


def test_the_record_round_trips_and_a_bad_one_names_the_field(tmp_path: Path) -> None:
    paths = StackPaths(tmp_path)
    record = StackRecord(5000, Process(1, "9"), None, {"python:3.12-slim": "sha256:x"})
    paths.write(record)
    assert paths.read() == record
    paths.record.write_text('{"registry_port": "x"}')
    with pytest.raises(ValueError, match="registry_port"):
        paths.read()
    paths.record.write_text('{"registry_port": 5000, "dockerd": 3}')
    with pytest.raises(ValueError, match="dockerd"):
        paths.read()


def test_a_dead_or_reused_pid_is_not_the_engine(tmp_path: Path) -> None:
    paths = StackPaths(tmp_path)
    mine = Process.of(os.getpid())
    assert mine is not None and mine.alive()
    assert not Process(os.getpid(), "0").alive()
    paths.write(StackRecord(5000, Process(os.getpid(), "0")))
    assert running_engine_host(paths) is None
    paths.write(StackRecord(5000, mine))
    assert running_engine_host(paths) is None  # no socket
    paths.socket.touch()
    assert running_engine_host(paths) == f"unix://{tmp_path}/docker.sock"


def test_the_mirror_comes_from_apts_sources_never_security(tmp_path: Path) -> None:
    deb822 = tmp_path / "debian.sources"
    deb822.write_text(
        "Types: deb\nURIs: http://mirror.invalid/debian-security\n\nURIs: http://mirror.invalid/debian\n"
    )
    assert image.debian_mirror((deb822,)) == "http://mirror.invalid/debian"
    one_line = tmp_path / "sources.list"
    one_line.write_text("# comment\ndeb [arch=amd64] http://one.invalid/debian bookworm main\n")
    assert image.debian_mirror((tmp_path / "missing", one_line)) == "http://one.invalid/debian"
    with pytest.raises(image.Unavailable, match="debootstrap"):
        image.debian_mirror((tmp_path / "missing",))


def test_the_recipe_key_changes_with_the_packages() -> None:
    assert image.recipe_key("bookworm", ("python3",)) != image.recipe_key("bookworm", ("python3", "git"))
    assert image.recipe_key("bookworm", ("git", "python3")) == image.recipe_key(
        "bookworm", ("python3", "git")
    )


def test_each_missing_prerequisite_is_one_line_with_its_remedy(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(stack.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(stack.shutil, "which", lambda name: None)
    monkeypatch.setattr(stack, "compose_binary", lambda: None)
    filesystems = tmp_path / "filesystems"
    filesystems.write_text("nodev\ttmpfs\n\text4\n")
    found = stack.problems(filesystems)
    assert len(found) == 4 and all("\n" not in line for line in found)
    assert "root" in found[0] and "apt-get install docker.io docker-registry debootstrap" in found[1]
    assert "overlay" in found[2] and "rl360-ext[docker]" in found[3]
    filesystems.write_text("nodev\toverlay\n")
    assert not any("overlay" in line for line in stack.problems(filesystems))


def test_up_refuses_with_the_first_problem(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(stack, "problems", lambda: ["no container engine package: apt-get install docker.io"])
    with pytest.raises(stack.Unavailable, match=r"apt-get install docker\.io"):
        stack.up(StackPaths(tmp_path))


@pytest.mark.parametrize(
    ("message", "refused"),
    [
        ("failed to register layer: toomanyrequests: slow down", True),
        ("error pulling image configuration: received unexpected HTTP status: 503 Service Unavailable", True),
        ("unexpected EOF", True),
        ("The command '/bin/sh -c exit 3' returned a non-zero code: 3", False),
        ("manifest for sha256:4290aa not found", False),
    ],
)
def test_only_a_refused_pull_is_retried(message: str, refused: bool) -> None:
    assert pull_refused(message) is refused
