"""`rl360 harbor serve --env docker` on a real engine: Harbor's own DockerEnvironment builds each
task's Dockerfile (`FROM python:3.12-slim`, served by the stack's registry mirror) and runs the
example and fault tasks with the verdicts they get under bwrap (integration_tests/harbor/
test_harbor_server.py), records a fork the engine's pids limit refused as the policy's as bwrap
does, refuses a public-network task, and leaves no container, network or volume
behind: after a normal run, after SIGTERM of the server, and after SIGKILL (the next server removes
what the killed one left). One module, so one test worker starts the stack once."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from integration_tests.docker.conftest import docker_server
from integration_tests.harbor.test_harbor_server import (  # bwrap's expectations
    CODING_TASKS,
    FAULTS,
    FORK_PIDS,
    FORK_TASK,
    assert_fork_is_the_policys,
    fork_task,
    run_all,
)
from rl360_ext.containers import StackPaths
from rl360_ext.containers.engine import OWNER_LABEL, counts, docker
from rl360_ext.local.fixtures import tasks_root
from rl360_ext.util.procs import Service

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FLAGS = ("--env-setup-s", "60", "--agent-setup-s", "5", "--margin-s", "2", "--min-agent-s", "1")
NOTHING_LEFT = {"containers": 0, "networks": 0, "volumes": 0}


def trial_images(paths: StackPaths) -> list[str]:
    """Images the trials built (Compose names them after the trial's project), not the base."""
    listed = docker(paths.docker_host, "image", "ls", "--format", "{{.Repository}}").split()
    return [name for name in listed if "__" in name]


@pytest.fixture(scope="module")
def server(containers: StackPaths, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with docker_server(tmp_path_factory.mktemp("docker-logs"), "--max-concurrent", "6", *FLAGS) as service:
        yield service


async def test_examples_and_faults_get_their_bwrap_verdicts(server: Service, containers: StackPaths) -> None:
    bodies = [{"task": t, "deadline_s": 180, "agent": a} for t in CODING_TASKS for a in ("oracle", "nop")]
    bodies += [{"task": task, "deadline_s": 180, "agent": "oracle"} for task in FAULTS]
    for body, result in zip(bodies, await run_all(server, bodies), strict=True):
        if body["task"] in FAULTS:
            cause, who, reward = FAULTS[body["task"]]
            got = (result["failure_cause"], result["attributed_to"], result["reward"])
            assert got == (cause, who, reward), result
            if body["task"] == "fault-memory-hog":
                assert result["evidence"]["resource"] == "memory", result
        else:
            expected = 1.0 if body["agent"] == "oracle" else 0.0
            assert (result["reward"], result["failure_cause"]) == (expected, None), result
            assert result["placement"] == {"node_label": "local", "image_group": "rl360-python-3"}
    assert counts(containers.docker_host) == NOTHING_LEFT
    assert trial_images(containers) == []


async def test_a_public_network_task_is_refused_with_the_reason(
    containers: StackPaths, tmp_path: Path
) -> None:
    root = tmp_path / "tasks"
    shutil.copytree(tasks_root() / "fizzbuzz", root / "open-fizzbuzz")
    toml = root / "open-fizzbuzz" / "task.toml"
    toml.write_text(toml.read_text().replace('network_mode = "no-network"', 'network_mode = "public"'))
    with docker_server(tmp_path / "logs", "--tasks-root", str(root), *FLAGS) as service:
        (result,) = await run_all(service, [{"task": "open-fizzbuzz", "deadline_s": 120, "agent": "oracle"}])
    assert result["attributed_to"] == "infrastructure" and result["reward"] is None, result
    assert "network_mode 'public' is refused under --env docker" in result["exception_message"], result
    assert counts(containers.docker_host) == NOTHING_LEFT


async def test_a_fork_past_the_pids_limit_is_the_policys(containers: StackPaths, tmp_path: Path) -> None:
    root = fork_task(tmp_path / "tasks")
    flags = ("--tasks-root", str(root), "--env-kwarg", f"max_pids={FORK_PIDS}", *FLAGS)
    with docker_server(tmp_path / "logs", *flags) as service:
        (result,) = await run_all(service, [{"task": FORK_TASK, "deadline_s": 120, "agent": "oracle"}])
    assert_fork_is_the_policys(result)
    assert counts(containers.docker_host) == NOTHING_LEFT


def _wait_for_container(paths: StackPaths, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if docker(paths.docker_host, "ps", "--quiet", "--filter", f"label={OWNER_LABEL}").split():
            return
        time.sleep(0.5)
    raise AssertionError("no trial container started")


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
async def test_nothing_is_left_after_the_server_is_stopped(
    containers: StackPaths, tmp_path: Path, stop: signal.Signals
) -> None:
    body = json.dumps({"task": "fault-agent-over-budget", "deadline_s": 120, "agent": "oracle"})
    with docker_server(tmp_path / "first", *FLAGS) as first, (tmp_path / "client.log").open("w") as log:
        client = subprocess.Popen(
            ["curl", "-s", "-X", "POST", f"{first.url}/run", "-H", "content-type: application/json",
             "-d", body],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        _wait_for_container(containers)
        (container,) = docker(
            containers.docker_host, "ps", "--quiet", "--filter", f"label={OWNER_LABEL}"
        ).split()
        limits = "{{.HostConfig.NetworkMode}} {{.HostConfig.PidsLimit}} {{.HostConfig.Memory}} "
        limits += "{{.HostConfig.MemorySwap}} {{.HostConfig.NanoCpus}}"
        # the task's reservation (1 cpu, 512 MB, no swap), the pids limit and no network, by the engine
        assert docker(containers.docker_host, "inspect", "--format", limits, container).split() == [
            "none",
            "1024",
            str(512 * 2**20),
            str(512 * 2**20),
            str(10**9),
        ]
        os.kill(first.pid, stop)
        first.process.wait(timeout=60)
        client.wait(timeout=60)
    if stop == signal.SIGKILL:
        assert docker(containers.docker_host, "ps", "--quiet", "--filter", f"label={OWNER_LABEL}").split()
        # the trial's image carries the owner too: a server killed between build and `up` is found
        assert docker(containers.docker_host, "image", "ls", "--quiet", "--filter", f"label={OWNER_LABEL}")
        with docker_server(tmp_path / "second", *FLAGS) as second:
            health = httpx.get(f"{second.url}/health", timeout=10).json()
        assert health["leftovers_removed_at_start"] >= 1, health
    assert counts(containers.docker_host) == NOTHING_LEFT
    assert trial_images(containers) == []
