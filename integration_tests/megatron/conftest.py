"""Runs the tiny engine's model against Miles' Megatron fork on CPU; skips the folder without both.

Owns the switch (MILES_SRC and MEGATRON_SRC both set, else every test here is skipped with the
reason; set but not importable: skipped with the import error, or an error under run.sh, which
sets RL360_MILES_STRICT=1), puts both checkouts on `sys.path` (refusing a `megatron` imported
from anywhere else), and the session fixture `megatron_world`: the CPU shims and the
single-process world Megatron needs (world.py, its gloo store under tmp_path).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration_tests.components import mark_checkout_folder

HERE = Path(__file__).resolve().parent
ENVS = ("MILES_SRC", "MEGATRON_SRC")
STRICT_ENV = "RL360_MILES_STRICT"


def _source(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value).expanduser().resolve() if value else None


def _skip_reason() -> str | None:
    unset = [name for name in ENVS if _source(name) is None]
    if unset:
        return (
            f"{' and '.join(unset)} not set: point MILES_SRC at a radixark/miles checkout and "
            "MEGATRON_SRC at radixark/Megatron-LM (branch miles-main), then run "
            "integration_tests/megatron/run.sh"
        )
    miles_src, megatron_src = _source("MILES_SRC"), _source("MEGATRON_SRC")
    assert miles_src is not None and megatron_src is not None
    if not (megatron_src / "megatron" / "core" / "transformer" / "moe" / "router.py").is_file():
        raise pytest.UsageError(f"MEGATRON_SRC={megatron_src} is not a Megatron-LM checkout")
    for src in (megatron_src, miles_src):
        if str(src) not in sys.path:
            sys.path.insert(0, str(src))
    try:
        import megatron.core.models.gpt.gpt_model
        import miles.utils.replay_base  # noqa: F401
        import torch  # noqa: F401
    except ImportError as error:
        message = (
            f"Megatron or Miles does not import in {sys.executable}: {type(error).__name__}: "
            f"{error}; run integration_tests/megatron/run.sh (the scratch venv from setup_venv.sh)"
        )
        if os.environ.get(STRICT_ENV) == "1":
            raise pytest.UsageError(message) from error
        return message
    imported = Path(megatron.core.__file__).resolve()
    if megatron_src not in imported.parents:
        return f"megatron is imported from {imported}, not from MEGATRON_SRC={megatron_src}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_checkout_folder(items, HERE, _skip_reason)


@pytest.fixture(scope="session")
def megatron_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Shims applied, a one-rank gloo group, Megatron's and Miles' parallel state; yields the shims."""
    from integration_tests.megatron.world import single_rank_world

    with single_rank_world(tmp_path_factory.mktemp("gloo")) as shims:
        yield shims
