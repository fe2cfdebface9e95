"""Fixtures for the chat-template tests: the tiny engine's tokenizer and the test templates."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rl360_ext.reference.engine.tokenizer import load_tiny_tokenizer

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def tokenizer():
    return load_tiny_tokenizer()


@pytest.fixture(scope="session")
def fixture_template() -> Callable[[str], str]:
    def read(name: str) -> str:
        return (FIXTURES / f"{name}.jinja").read_text()

    return read
