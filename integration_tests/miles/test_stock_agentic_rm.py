"""rl360's agent function and reward model under Miles' STOCK `agentic_tool_call.generate`.

Miles' own `generate_and_rm_group` runs its unmodified `agentic_tool_call.generate` (v1 wire) with
`--custom-agent-function-path rl360_ext.rollout.agent.run` and
`--custom-rm-path rl360_ext.rollout.rewards.verifier_reward`, against real services: a real
`rl360 session serve` in front of the tiny CPU engine (Miles' session server) and the rl360
Harbor `/run` server (from the project's .venv, bubblewrap sandboxes, rl360's demo agent driving
the session URL, so every attempt records model turns: at most `AGENT_MAX_TURNS` model calls, one
per turn; test_rollout_e2e.py says why not terminus-2). One group holds three attempts:
a task whose verifier accepts any answer (valid, 1.0), a coding task random text cannot fix
(valid, 0.0) and a task whose verifier crashes (infra). The group then goes through Miles'
dynamic-filter call and its reward post-process call site with rl360's hooks. A fourth attempt
whose agent function raises before any model call shows what stock generate does with no turns.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration_tests.components import bwrap_problem, skip_if_missing
from integration_tests.miles.test_rollout_e2e import AGENT_MAX_TURNS, _harbor_python, start_demo_harbor
from rl360_ext.local.services import start_engine
from rl360_ext.util.procs import Service, free_port, rl360_argv, start_service

STOCK_GENERATE = "miles.rollout.generate_hub.agentic_tool_call.generate"
TASKS = ("matrix-any-answer", "fix-mean", "fault-verifier-crashes")

pytestmark = pytest.mark.slow


def _tasks_root(directory: Path) -> Path:
    """rl360's task fixtures, as rl360_ext.local.bench.fault_matrix.matrix_tasks_root copies them."""
    from rl360_ext.local.bench.fault_matrix import matrix_tasks_root

    return matrix_tasks_root(directory)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Service]]:
    from rl360_ext.reference.engine.tokenizer import default_tokenizer_dir

    skip_if_missing(bwrap_problem)
    python = _harbor_python()
    logs = tmp_path_factory.mktemp("miles-stock")
    tasks_root = _tasks_root(logs)
    engine = start_engine(logs)
    services = [engine]
    try:
        port = free_port()
        session_argv = rl360_argv(
            "session", "serve", "--backend", engine.url, "--tokenizer", str(default_tokenizer_dir()),
            "--host", "127.0.0.1", "--port", str(port),
        )  # fmt: skip
        services.append(session := start_service("session", session_argv, port, logs))
        services.append(harbor := start_demo_harbor(python, logs, "--tasks-root", str(tasks_root)))
        yield {"engine": engine, "session": session, "harbor": harbor}
    finally:
        for service in reversed(services):
            service.stop()


@pytest.fixture(scope="module")
def miles_args(stack: dict[str, Service]) -> argparse.Namespace:
    """Miles' own parser (stock generate adds --custom-agent-function-path), then runtime fields."""
    from miles.utils.arguments import get_miles_extra_args_provider

    from rl360_ext.reference.engine.tokenizer import default_tokenizer_dir

    argv = [
        "--rollout-batch-size", "1", "--n-samples-per-prompt", str(len(TASKS)),
        "--hf-checkpoint", str(default_tokenizer_dir()),
        "--rollout-max-response-len", "48", "--rollout-temperature", "1.0",
        "--custom-generate-function-path", STOCK_GENERATE,
        "--custom-agent-function-path", "rl360_ext.rollout.agent.run",
        "--custom-rm-path", "rl360_ext.rollout.rewards.verifier_reward",
        "--dynamic-sampling-filter-path", "rl360_ext.rollout.filters.check_valid_reward_nonzero_std",
        "--custom-reward-post-process-path", "rl360_ext.rollout.rewards.valid_group_advantages",
    ]  # fmt: skip
    saved = sys.argv
    sys.argv = ["train.py", *argv]  # Miles finds the generate function's flags in sys.argv
    try:
        parser = argparse.ArgumentParser()
        get_miles_extra_args_provider()(parser)
        args = parser.parse_args(argv)
    finally:
        sys.argv = saved
    host, port = stack["session"].url.removeprefix("http://").rsplit(":", 1)
    args.session_server_ip, args.session_server_ports = host, [int(port)]
    args.use_session_server = "v1"
    engine = stack["engine"].url.removeprefix("http://")
    args.sglang_router_ip, engine_port = engine.rsplit(":", 1)
    args.sglang_router_port = int(engine_port)
    args.rollout_num_gpus = 1
    return args


def _sample(group_index: int, index: int, task: str | None) -> Any:
    from miles.utils.types import Sample

    prompt = [{"role": "user", "content": "Solve the task in /app."}]
    return Sample(
        group_index=group_index, index=index, prompt=prompt, metadata={} if task is None else {"task": task}
    )


async def _generate(args: argparse.Namespace, group: list[Any]) -> list[Any]:
    from miles.rollout.inference_rollout.inference_rollout_common import GenerateState, generate_and_rm_group
    from miles.utils import http_utils

    http_utils._http_client = None
    http_utils.init_http_client(args)
    try:
        state = GenerateState(args)
        return await generate_and_rm_group(state, group, sampling_params=state.sampling_params.copy())
    finally:
        await http_utils._http_client.aclose()
        http_utils._http_client = None


async def test_stock_agentic_generate_counts_only_verifier_rewards(
    stack: dict[str, Service], miles_args: argparse.Namespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    from miles.ray.rollout.train_data_conversion import convert_samples_to_train_data
    from miles.rollout.filter_hub.base_types import call_dynamic_filter
    from miles.utils import http_utils
    from miles.utils.misc import load_function
    from miles.utils.types import Sample

    from rl360_ext.outcomes.provenance import ATTEMPT_CLASS, REWARD_SOURCE, attempt_class
    from rl360_ext.rollout.config import env_name

    monkeypatch.setattr(http_utils, "_http_client", None)
    # Miles' stock generate hands the agent function no args: the environment is its channel
    monkeypatch.setenv(env_name("harbor_url"), stack["harbor"].url)
    monkeypatch.setenv(env_name("deadline_s"), "150")

    group = await _generate(miles_args, [_sample(0, i, task) for i, task in enumerate(TASKS)])
    passing, failing, infra = group
    for sample, reward in ((passing, 1.0), (failing, 0.0)):
        sample.validate()
        assert sample.metadata["task"] and sample.metadata["session"]["id"]
        assert sample.metadata[ATTEMPT_CLASS] == "valid", sample.metadata
        assert sample.metadata[REWARD_SOURCE] == "verifier"
        assert sample.reward == reward  # the verifier's, through the RM
        assert sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
        assert sample.response_length > 0 and any(sample.loss_mask) and not sample.remove_sample
    for sample in group:
        assert 1 <= sample.metadata["agent_metrics"]["turns"] <= AGENT_MAX_TURNS, sample.metadata
    infra.validate()
    assert infra.response_length > 0, "the agent made model calls before the verifier crashed"
    assert infra.metadata[ATTEMPT_CLASS] == "infra:verifier_crash", infra.metadata
    assert infra.reward is None and infra.remove_sample and not any(infra.loss_mask)

    dynamic_filter = load_function(miles_args.dynamic_sampling_filter_path)
    assert call_dynamic_filter(dynamic_filter, miles_args, group).keep
    data = convert_samples_to_train_data(
        miles_args,
        group,
        metadata={},
        custom_convert_samples_to_train_data_func=None,
        custom_reward_post_process_func=load_function(miles_args.custom_reward_post_process_path),
    )
    up, down, masked = data["rewards"]
    assert up == pytest.approx(1 / math.sqrt(2), rel=1e-4) and down == pytest.approx(-up)  # baseline 0.5
    assert masked == 0.0 and math.isnan(data["raw_reward"][2])
    assert [sum(mask) > 0 for mask in data["loss_masks"]] == [True, True, False]

    # No metadata task: rl360's agent raises before any model call. Stock generate records no turns,
    # returns the input sample ABORTED and skips the RM: no reward, and provenance reads it as infra.
    (no_turns,) = await _generate(miles_args, [_sample(1, len(TASKS), None)])
    assert no_turns.status == Sample.Status.ABORTED and no_turns.reward is None
    assert ATTEMPT_CLASS not in no_turns.metadata and attempt_class(no_turns) == "infra:unclassified"
