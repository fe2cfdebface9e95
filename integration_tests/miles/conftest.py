"""Runs rl360 hooks through a real Miles checkout (`MILES_SRC`); skips the whole folder without one.

Owns the switch (no MILES_SRC: every test here is skipped with that reason; MILES_SRC set but
Miles' modules do not import in this interpreter: skipped with the import error, or an error under
`run.sh`, which sets RL360_MILES_STRICT=1), puts MILES_SRC on `sys.path` (Miles is not on PyPI:
the scratch venv has it installed editable from a checkout, but the tests run the one named here,
and refuse a `miles` imported from anywhere else), and builds the real Miles objects the tests
feed to the hooks: `Sample`s, minimal argument namespaces, Miles' single-process ParallelState. It does not
re-implement any Miles code path: tests call Miles' own functions.
"""

from __future__ import annotations

import os
import sys
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from integration_tests.components import mark_checkout_folder

HERE = Path(__file__).resolve().parent
MILES_SRC_ENV = "MILES_SRC"
STRICT_ENV = "RL360_MILES_STRICT"


def miles_src() -> Path | None:
    value = os.environ.get(MILES_SRC_ENV)
    return Path(value).expanduser().resolve() if value else None


def _check_checkout(src: Path) -> None:
    if not (src / "miles" / "utils" / "misc.py").is_file():
        raise pytest.UsageError(
            f"{MILES_SRC_ENV}={src} is not a radixark/miles checkout (no miles/utils/misc.py)"
        )


def _import_error(src: Path) -> str | None:
    """Why Miles' modules the tests need do not import here from `src`, or None."""
    try:
        import miles.rollout.filter_hub.base_types
        import miles.utils.misc
        import miles.utils.types
    except ImportError as error:
        return f"{type(error).__name__}: {error}"
    imported = Path(miles.__file__).resolve()
    if src not in imported.parents:
        return f"miles is imported from {imported.parent}, not from {MILES_SRC_ENV}={src}"
    return None


def _skip_reason() -> str | None:
    src = miles_src()
    if src is None:
        return (
            f"{MILES_SRC_ENV} is not set: point it at a radixark/miles checkout and run "
            "integration_tests/miles/run.sh (see integration_tests/miles/README.md)"
        )
    _check_checkout(src)
    if str(src) not in sys.path:
        sys.path.append(str(src))
    error = _import_error(src)
    if error is None:
        return None
    message = (
        f"Miles' modules do not import in this interpreter ({sys.executable}): {error}; "
        "run integration_tests/miles/run.sh, which uses the scratch venv from setup_venv.sh"
    )
    if os.environ.get(STRICT_ENV) == "1":
        raise pytest.UsageError(message)
    return message


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_checkout_folder(items, HERE, _skip_reason)


@pytest.fixture(scope="session")
def miles_root() -> Path:
    src = miles_src()
    assert src is not None
    return src


def _miles_args(**overrides: Any) -> Namespace:
    defaults: dict[str, Any] = {
        "advantage_estimator": "grpo",
        "rewards_normalization": True,
        "grpo_std_normalization": True,
        "reward_key": None,
        "n_samples_per_prompt": 4,
        "rollout_batch_size": 4,
        "use_dynamic_global_batch_size": False,
        "dynamic_sampling_filter_path": None,
        "custom_rollout_log_function_path": None,
        "load_debug_rollout_data": None,
        "save_debug_rollout_data": None,
        "save_debug_trajectory_data": None,
        "wandb_always_use_train_step": False,
        "rl360_metrics_path": None,
        "rl360_metrics_attempts": None,
    }
    defaults.update(overrides)
    return Namespace(**defaults)


@pytest.fixture
def make_args() -> Callable[..., Namespace]:
    """The argument fields the Miles call sites under test read, with Miles' parser defaults."""
    return _miles_args


SampleFactory = Callable[..., Any]


@pytest.fixture
def make_sample() -> SampleFactory:
    """A real `miles.utils.types.Sample`: valid with a verifier reward, or an infra attempt.

    Infra samples go through rl360's own `mark_infra_sample`, exactly as the generate hook
    produces them.
    """
    from miles.utils.types import Sample

    from rl360_ext.outcomes.infra import mark_infra_sample
    from rl360_ext.outcomes.provenance import ATTEMPT_CLASS, DOMAIN, REWARD_SOURCE, VALID

    def make(
        group_index: int,
        index: int,
        reward: float | None = None,
        *,
        infra: str | None = None,
        response_length: int = 4,
        prompt_length: int = 3,
        domain: str | None = None,
    ) -> Sample:
        tokens = list(range(1, prompt_length + response_length + 1))
        metadata: dict[str, Any] = {} if domain is None else {DOMAIN: domain}
        sample = Sample(
            group_index=group_index,
            index=index,
            prompt="solve the task",
            tokens=tokens,
            response="x" * response_length,
            response_length=response_length,
            loss_mask=[1] * response_length,
            rollout_log_probs=[-0.5] * response_length,
            status=Sample.Status.COMPLETED,
            metadata=metadata,
        )
        if infra is None:
            assert reward is not None, "a valid sample needs its verifier reward"
            sample.reward = reward
            sample.metadata[REWARD_SOURCE] = "verifier"
            sample.metadata[ATTEMPT_CLASS] = VALID
        else:
            sample.status = Sample.Status.ABORTED if infra == "aborted" else Sample.Status.FAILED
            mark_infra_sample(sample, infra)
        sample.validate()
        return sample

    return make


@pytest.fixture
def parallel_state() -> Any:
    """Miles' single-process ParallelState (every group of size 1), as Miles' own CPU tests set it."""
    from miles.backends.training_utils.parallel import GroupInfo, ParallelState, set_parallel_state

    trivial = GroupInfo(rank=0, size=1, group=None)
    state = ParallelState(
        intra_dp=trivial, intra_dp_cp=trivial, cp=trivial, tp=trivial, pp=trivial, ep=trivial,
        etp=trivial, indep_dp=trivial, is_pp_last_stage=True,
    )  # fmt: skip
    set_parallel_state(state)
    return state
