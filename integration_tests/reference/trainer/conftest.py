"""Fixtures of the trainer's integration tests: a folder for the services' logs."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trainer-logs")
