"""patches/miles/*.patch apply to MILES_SRC and do what patches/README.md says.

`git apply --check` each patch against MILES_SRC; then apply all of them to a copy of the
checkout's `miles/`, `tests/` and `examples/` and run, against that copy: Miles' own tests the
patches touch or add (in a subprocess, this interpreter; those of Miles' weight updaters with
MEGATRON_SRC on the path, as the updaters import Megatron-core), the patched Harbor example agent
function against a refused port and a server that never answers, next to the unpatched one, and
the patched launcher (`--session-server-external`) adopting a running `rl360 session serve`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

PATCHES = sorted((Path(__file__).resolve().parents[2] / "patches" / "miles").glob("*.patch"))
HARBOR_EXAMPLE = Path("examples") / "swe-agent-harbor-docker"
MILES_TESTS_TOUCHED = [
    "tests/fast/ray/rollout/test_train_data_conversion.py",
    "tests/fast/rollout/test_filter_metrics.py",
    "tests/fast/ray/rollout/test_router_manager.py",
    "tests/fast/ray/test_train_group_update_weights.py",
    "tests/fast/ray/rollout/test_server_engine_shutdown.py",
    "tests/fast/backends/sglang_utils/test_sglang_engine.py",
    "tests/fast/backends/sglang_utils/test_sglang_engine_router_registration.py",
    "tests/fast/backends/sglang_utils/test_sglang_engine_timeouts.py",
]
# Miles' weight updaters import Megatron-core: these run with MEGATRON_SRC on the path.
MILES_UPDATER_TESTS_TOUCHED = [
    "tests/fast/backends/megatron_utils/test_update_weight_stale_on_failure.py",
    "tests/fast/backends/megatron_utils/test_update_weight_from_distributed_lock.py",
    # skipped where sglang's model loader does not import (no torchvision): 0010's P2P updater
    "tests/fast/backends/megatron_utils/test_update_weight_p2p_reconnect.py",
]
ADOPT_SCRIPT = """
import json, sys
from types import SimpleNamespace
from miles.ray.rollout.router_manager import start_session_server
args = SimpleNamespace(
    use_session_server="v2", hf_checkpoint="unused", sglang_router_ip="127.0.0.1", sglang_router_port=1,
    session_server_ip="127.0.0.1", session_server_port=[int(sys.argv[1])], session_server_external=True,
)
start_session_server(args)
print(json.dumps({"ports": args.session_server_ports, "ids": args.session_server_instance_ids}))
"""


def test_there_are_eleven_patch_sets() -> None:
    assert [p.name[:4] for p in PATCHES] == [f"{n:04d}" for n in range(1, 12)]


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_patch_applies_to_miles_src(miles_root: Path, patch: Path) -> None:
    result = subprocess.run(
        ["git", "apply", "--check", "--verbose", str(patch)],
        cwd=miles_root,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"{patch.name} does not apply to {miles_root}:\n{result.stderr}"


@pytest.fixture(scope="module")
def patched_copy(miles_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("miles-patched")
    for name in ("miles", "tests", "examples"):
        shutil.copytree(miles_root / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "train.py", "train_async.py"):  # 0011 patches the train loops
        shutil.copy2(miles_root / name, root / name)
    result = subprocess.run(
        ["git", "apply", *map(str, PATCHES)], cwd=root, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    return root


def _run_miles_tests(patched_copy: Path, tests: list[str], *path: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(patched_copy), *path])}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        cwd=patched_copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "passed" in result.stdout.splitlines()[-1]


@pytest.mark.slow
def test_miles_own_tests_pass_with_the_patches(patched_copy: Path) -> None:
    _run_miles_tests(patched_copy, MILES_TESTS_TOUCHED)


@pytest.mark.slow
def test_miles_updater_tests_pass_with_the_patches(patched_copy: Path) -> None:
    """0005: Miles' weight updaters mark their engine connection stale when a push fails."""
    megatron = os.environ.get("MEGATRON_SRC")
    if not megatron:
        if os.environ.get("RL360_MILES_STRICT") == "1":
            pytest.fail("MEGATRON_SRC is not set: Miles' weight updaters import Megatron-core")
        pytest.skip("MEGATRON_SRC is not set: Miles' weight updaters import Megatron-core")
    _run_miles_tests(patched_copy, MILES_UPDATER_TESTS_TOUCHED, megatron)


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
async def silent_server() -> AsyncIterator[str]:
    """A TCP server on loopback that accepts /run requests and never answers."""

    done = asyncio.Event()

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        await done.wait()
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        done.set()
        server.close()
        await server.wait_closed()


async def _run(module: ModuleType, agent_server_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("AGENT_SERVER_URL", agent_server_url)
    monkeypatch.setenv("AGENT_TRIAL_TIMEOUT", "1")
    monkeypatch.setattr(module, "_agent_server_client", None)
    return await module.run(
        base_url="http://127.0.0.1:1/sessions/s", prompt=[], request_kwargs={}, metadata={}
    )


async def test_patched_harbor_agent_returns_no_reward_and_a_failure_class(
    miles_root: Path, patched_copy: Path, silent_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    patched = _load(patched_copy / HARBOR_EXAMPLE / "swe_agent_function.py", "rl360_patched_swe_agent")
    upstream = _load(miles_root / HARBOR_EXAMPLE / "swe_agent_function.py", "rl360_upstream_swe_agent")
    refused = f"http://127.0.0.1:{_free_port()}"

    assert await _run(upstream, refused, monkeypatch) is None  # upstream: no metadata -> reward_func's 0.0

    transport = await _run(patched, refused, monkeypatch)
    assert transport["reward"] is None
    assert transport["failure_class"] == "infra:transport_error"
    deadline = await _run(patched, silent_server, monkeypatch)
    assert deadline["reward"] is None
    assert deadline["failure_class"] == "infra:client_deadline"


async def test_patched_reward_func_does_not_score_a_missing_reward(
    miles_root: Path, patched_copy: Path, make_args
) -> None:
    from miles.utils.types import Sample

    upstream = _load(miles_root / HARBOR_EXAMPLE / "generate.py", "rl360_upstream_harbor_generate")
    patched = _load(patched_copy / HARBOR_EXAMPLE / "generate.py", "rl360_patched_harbor_generate")

    def attempts() -> list[Sample]:
        failed = Sample(status=Sample.Status.COMPLETED, metadata={})  # agent returned None upstream
        timed_out = Sample(
            status=Sample.Status.COMPLETED,
            metadata={"reward": None, "failure_class": "infra:client_deadline"},
        )
        scored = Sample(status=Sample.Status.COMPLETED, metadata={"reward": 1.0, "failure_class": None})
        return [failed, timed_out, scored]

    assert await upstream.reward_func(make_args(), attempts()[:1]) == [0.0]  # the bug: a failure scores 0

    samples = attempts()
    assert await patched.reward_func(make_args(), samples) == [None, None, 1.0]
    assert [s.status for s in samples] == [
        Sample.Status.ABORTED,
        Sample.Status.ABORTED,
        Sample.Status.COMPLETED,
    ]
    assert [s.remove_sample for s in samples] == [True, True, False]


@pytest.mark.slow
def test_patched_launcher_adopts_a_running_rl360_session_server(patched_copy: Path, tmp_path: Path) -> None:
    """0004: with --session-server-external, Miles' launcher takes rl360's server and its id."""
    from rl360_ext.reference.engine.tokenizer import default_tokenizer_dir
    from rl360_ext.util.procs import rl360_argv, start_service

    port = _free_port()
    argv = rl360_argv(
        "session", "serve", "--backend", f"http://127.0.0.1:{_free_port()}",
        "--tokenizer", str(default_tokenizer_dir()), "--port", str(port),
        "--instance-id", "c0ffee" * 5 + "00", "--samples-wire", "v2",
    )  # fmt: skip
    server = start_service("session", argv, port, tmp_path)
    try:
        result = subprocess.run(
            [sys.executable, "-c", ADOPT_SCRIPT, str(port)],
            cwd=patched_copy,
            env={**os.environ, "PYTHONPATH": str(patched_copy)},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        server.stop()
    assert result.returncode == 0, result.stderr[-3000:]
    adopted = json.loads(result.stdout.splitlines()[-1])
    assert adopted == {"ports": [port], "ids": {str(port): "c0ffee" * 5 + "00"}}
