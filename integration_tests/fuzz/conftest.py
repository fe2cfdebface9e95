"""Real servers for the schema fuzzer, each a separate process on 127.0.0.1.

The tiny engine runs with a 256-token context so every generated `/generate` body finishes fast;
the session server fronts that engine; the Harbor /run server gets an empty tasks root (every
task name a fuzzer invents is unknown, so no sandbox starts) and is skipped where bubblewrap
cannot run. Each fuzz report is also written to `fuzz-<server>.json` in the module's log dir.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from integration_tests.components import bwrap_problem, skip_if_missing
from rl360_ext.local.services import start_engine
from rl360_ext.reference.engine.tokenizer import default_tokenizer_dir
from rl360_ext.util.procs import Service, free_port, rl360_argv, running, start_service


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def engine(log_dir: Path) -> Iterator[Service]:
    service = start_engine(log_dir, "--context-length", "256", "--chunked-prefill-size", "64")
    with running(service):
        yield service


@pytest.fixture(scope="module")
def session_server(log_dir: Path, engine: Service) -> Iterator[Service]:
    port = free_port()
    argv = rl360_argv(
        "session", "serve", "--backend", engine.url, "--tokenizer", str(default_tokenizer_dir()),
        "--host", "127.0.0.1", "--port", str(port),
    )  # fmt: skip
    service = start_service("session", argv, port, log_dir)
    with running(service):
        yield service


@pytest.fixture(scope="module")
def harbor_server(log_dir: Path) -> Iterator[Service]:
    skip_if_missing(bwrap_problem)
    tasks = log_dir / "no-tasks"
    tasks.mkdir()
    port = free_port()
    argv = rl360_argv(
        "harbor", "serve", "--host", "127.0.0.1", "--port", str(port),
        "--tasks-root", str(tasks), "--trials-dir", str(log_dir / "trials"),
    )  # fmt: skip
    service = start_service("harbor", argv, port, log_dir, ready_timeout_s=90, stop_grace_s=30)
    with running(service):
        yield service
