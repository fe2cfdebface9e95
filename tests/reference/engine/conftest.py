"""Fixtures for the tiny engine's unit tests: engines in this process, an HTTP client over ASGI."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from rl360_ext.reference.engine.engine import EngineConfig, TinyEngine
from rl360_ext.reference.engine.server import create_app


@pytest.fixture(scope="module")
def engine() -> TinyEngine:
    """A default-size engine shared by a module's read-only tests."""
    return TinyEngine(EngineConfig(seed=0))


@pytest.fixture
def fresh_engine() -> TinyEngine:
    """A default-size engine for tests that change state (weights, cache, faults, pause)."""
    return TinyEngine(EngineConfig(seed=0))


@pytest.fixture
def client(fresh_engine: TinyEngine) -> Iterator[TestClient]:
    with TestClient(create_app(fresh_engine)) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def prompt(engine: TinyEngine) -> list[int]:
    return engine.encode(
        "<|im_start|>user\nRun the tests and fix the bug.<|im_end|>\n<|im_start|>assistant\n"
    )
