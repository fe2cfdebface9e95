"""Every rl360 hook loads through Miles' own loaders and fits the call shape Miles uses.

Loads each dotted path with `miles.utils.misc.load_function` (sync hooks with Miles'
`sync_required=True` check), the generate hook with Miles' `load_generate_function` (which must
not mistake it for a legacy `(args, sample, sampling_params)` function), builds Miles' real
argument parser with `--custom-generate-function-path` pointing at the rl360 generate hook (so
Miles itself calls `generate.add_arguments`), and runs Miles' `call_agent_abort_hook`.
"""

from __future__ import annotations

import argparse
import inspect
import logging
import sys

import pytest

SYNC_HOOKS = {
    "--dynamic-sampling-filter-path": "rl360_ext.rollout.filters.check_valid_reward_nonzero_std",
    "--custom-reward-post-process-path": "rl360_ext.rollout.rewards.valid_group_advantages",
    "--custom-rollout-log-function-path": "rl360_ext.rollout.metrics.log_rollout_metrics",
    "--custom-pg-loss-reducer-function-path": "rl360_ext.train.reducers.valid_sample_mean",
    "--custom-pg-loss-reducer-function-path (Dr. GRPO)": "rl360_ext.train.reducers.constant_normalizer",
    "--custom-tis-function-path": "rl360_ext.train.tis.valid_token_tis",
}
GENERATE = "rl360_ext.rollout.generate.generate"
AGENT_RUN = "rl360_ext.rollout.agent.run"
AGENT_ABORT = "rl360_ext.rollout.agent.abort"
GENERATE_FLAGS = (
    "--rl360-harbor-url",
    "--rl360-harbor-token",
    "--rl360-session-servers",
    "--rl360-deadline-s",
    "--rl360-agent-timeout-policy",
    "--rl360-metrics-path",
)


@pytest.mark.parametrize("flag", sorted(SYNC_HOOKS))
def test_sync_hook_loads_with_miles_load_function(flag: str) -> None:
    from miles.utils.misc import load_function

    fn = load_function(SYNC_HOOKS[flag], sync_required=True)
    assert callable(fn)


@pytest.mark.parametrize("path", [GENERATE, AGENT_RUN, AGENT_ABORT])
def test_async_hook_loads_with_miles_load_function(path: str) -> None:
    from miles.utils.misc import load_function

    fn = load_function(path)
    assert inspect.iscoroutinefunction(fn), f"Miles awaits {path}; it must be an async function"


def test_generate_hook_is_not_taken_for_a_legacy_generate_function() -> None:
    from miles.rollout.inference_rollout.compatibility import load_generate_function
    from miles.utils.misc import load_function

    assert load_generate_function(GENERATE) is load_function(GENERATE)


def test_agent_run_accepts_the_keywords_agentic_tool_call_passes() -> None:
    from miles.utils.misc import load_function

    signature = inspect.signature(load_function(AGENT_RUN))
    signature.bind(base_url="http://s/sessions/1", prompt=[], request_kwargs={}, metadata={})


def test_miles_parser_gets_the_generate_hook_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    from miles.utils.arguments import get_miles_extra_args_provider

    argv = [
        "train.py",
        "--rollout-batch-size", "32",
        "--custom-generate-function-path", GENERATE,
        "--rl360-harbor-url", "http://127.0.0.1:11000",
        "--rl360-harbor-token", "secret",
        "--rl360-session-servers", "4",
        "--rl360-deadline-s", "3600",
        "--rl360-agent-timeout-policy", "mask",
        "--rl360-metrics-path", "/tmp/rl360-metrics.jsonl",
    ]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)  # Miles reads sys.argv to find the generate hook
    parser = argparse.ArgumentParser()
    get_miles_extra_args_provider()(parser)
    options = {option for action in parser._actions for option in action.option_strings}
    assert set(GENERATE_FLAGS) <= options
    args = parser.parse_args(argv[1:])
    assert args.custom_generate_function_path == GENERATE
    assert args.rl360_harbor_url == "http://127.0.0.1:11000"
    assert float(args.rl360_deadline_s) == 3600
    assert args.rl360_agent_timeout_policy == "mask"
    assert args.rl360_metrics_path == "/tmp/rl360-metrics.jsonl"
    with pytest.raises(SystemExit):
        parser.parse_args([*argv[1:], "--rl360-agent-timeout-policy", "zero"])


async def test_miles_abort_hook_calls_rl360_abort_without_error(
    make_args, caplog: pytest.LogCaptureFixture
) -> None:
    from miles.utils.misc import call_agent_abort_hook, load_function

    assert load_function(AGENT_ABORT) is not None  # Miles skips a missing abort silently; fail here instead
    args = make_args(custom_agent_function_path=AGENT_RUN, rl360_harbor_url=None, rl360_harbor_token=None)
    with caplog.at_level(logging.WARNING, logger="miles.utils.misc"):
        await call_agent_abort_hook(args)
    assert not [r for r in caplog.records if "abort hook" in r.getMessage()], caplog.text


def test_rl360_sample_types_are_miles_own_classes() -> None:
    from miles.rollout.base_types import GenerateFnInput, GenerateFnOutput
    from miles.utils.types import Sample

    from rl360_ext.rollout import sample

    assert sample.MILES_TYPES
    assert (sample.Sample, sample.GenerateFnInput, sample.GenerateFnOutput) == (
        Sample,
        GenerateFnInput,
        GenerateFnOutput,
    )
