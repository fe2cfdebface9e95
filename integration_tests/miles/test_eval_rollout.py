"""Miles' own eval path with rl360's hooks: `eval_rollout_single_dataset` calls rl360's generate
hook with `evaluation=True`, and `log_eval_rollout_data` calls rl360's eval log hook.

The generate hook runs for real (flags, agent call, merged-sample fill, verdict reading); only
its session pool is an in-process stand-in (sessions that hand back a fixed two-turn trajectory
with R3 rows), so no engine or Ray is needed. The agent function maps a Harbor `/run` answer
with rl360's own `result_metadata`: a verifier grade, or an infrastructure failure. The test
also runs Miles' default eval logger on the same data, to show the number it would have logged.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from rl360_ext.rollout import generate as generate_module
from rl360_ext.rollout.agent import result_metadata
from rl360_ext.rollout.config import GenerateConfig
from rl360_ext.session.samples.merge import MergedSample, TurnRecord, merge

EVAL_LOG_HOOK = "rl360_ext.rollout.eval_metrics.log_eval_metrics"
LAYERS, TOP_K = 2, 3
SEEN_REQUEST_KWARGS: list[dict[str, Any]] = []
SEEN_METADATA: list[dict[str, Any]] = []
HALF_CALLS: list[int] = []
SEEN_R3: list[bool | None] = []  # what each session was opened with


def _turn(index: int, start: int, n_in: int, n_out: int, rows_from: int) -> TurnRecord:
    end = start + n_in + n_out
    return TurnRecord(
        index=index,
        segment=0,
        input_start=start,
        input_ids=np.arange(start, start + n_in, dtype=np.int32) + 10,
        output_ids=np.arange(start + n_in, end, dtype=np.int32) + 10,
        output_logprobs=np.full(n_out, -0.5, dtype=np.float32),
        finish_reason="stop",
        weight_version="7",
        prompt_tokens=start + n_in,
        routing=np.zeros((end - 1 - rows_from, LAYERS, TOP_K), dtype=np.uint8),
        routing_start=rows_from,
        routing_source=np.zeros(end - 1 - rows_from, np.uint8),
    )


def _trajectory(session_id: str) -> MergedSample:
    first = _turn(0, 0, 5, 3, 0)
    second = _turn(1, first.end, 4, 2, first.end - 1)
    return merge([first, second], session_id, {"session": {"routing_key": session_id}})


class _Pool:
    """The SessionPool calls the generate hook makes, in process."""

    def __init__(self) -> None:
        self.urls = ["http://session.invalid"]
        self.count = 0

    async def acreate_session(
        self, metadata: Any = None, routing_key: Any = None, r3: bool | None = None
    ) -> tuple[str, str]:
        SEEN_R3.append(r3)
        self.count += 1
        sid = f"session-{self.count:012d}"
        return sid, f"{self.urls[0]}/sessions/{sid}/v1"

    def server_for(self, session_id: str) -> int:
        return 0

    async def acollect(self, session_ids: list[str]) -> list[MergedSample]:
        return [_trajectory(sid) for sid in session_ids]

    async def adelete(self, session_id: str) -> None:
        return None


async def harbor_answer_agent(
    base_url: str, prompt: Any, request_kwargs: dict[str, Any], metadata: dict[str, Any], **_: Any
) -> dict[str, Any]:
    """A `/run` answer by task: "pass" always passes, "half" every other call, "outage" never got
    a sandbox."""
    SEEN_REQUEST_KWARGS.append(dict(request_kwargs))
    SEEN_METADATA.append(dict(metadata))
    task = metadata["task"]
    if task == "outage":
        answer = {"attempt_class": "infra:no_sandbox", "failure_cause": "no_sandbox", "reward_source": None}
    else:
        if task == "half":
            HALF_CALLS.append(len(HALF_CALLS))
        reward = 1.0 if task == "pass" or (task == "half" and HALF_CALLS[-1] % 2 == 0) else 0.0
        answer = {
            "attempt_class": "valid",
            "reward": reward,
            "rewards": {"reward": reward, "score": reward},
            "reward_source": "verifier",
        }
    return {**result_metadata(answer), "evaluation": metadata.get("evaluation", False)}


def _args(tmp_path: Path, reward_key: str | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    generate_module.add_arguments(parser)
    args = parser.parse_args(
        [
            "--rl360-harbor-url", "http://harbor.invalid",
            "--rl360-session-backend", "http://engine.invalid",
            "--rl360-tokenizer", str(tmp_path),
            "--rl360-r3",
            "--rl360-metrics-path", str(tmp_path / "metrics.jsonl"),
            "--custom-agent-function-path", f"{__name__}.harbor_answer_agent",
        ]
    )  # fmt: skip
    miles_fields = {
        "group_rm": False,
        "hf_checkpoint": str(tmp_path),
        "apply_chat_template": False,
        "chat_template_path": None,
        "eval_reward_key": None,
        "reward_key": reward_key,
        "sglang_enable_deterministic_inference": False,
        "sglang_router_policy": "manual",
        "rollout_seed": 0,
        "rollout_stop": None,
        "rollout_stop_token_ids": None,
        "rollout_skip_special_tokens": False,
        "partial_rollout": False,
        "mask_offpolicy_in_partial_rollout": False,
        "custom_eval_rollout_log_function_path": EVAL_LOG_HOOK,
        "log_passrate": False,
        "n_samples_per_eval_prompt": 4,
        "use_session_server": None,
        "ci_test": False,
        "wandb_always_use_train_step": False,
        "rollout_batch_size": 1,
        "n_samples_per_prompt": 1,
        "use_dynamic_global_batch_size": False,
        "advantage_estimator": "grpo",
        "rollout_num_gpus": 1,
        "sglang_speculative_algorithm": None,
        "log_reward_category": None,
    }
    for key, value in miles_fields.items():
        setattr(args, key, value)
    return args


class _Tokenizer:
    eos_token_id = 0

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))


def _install_pool(args: argparse.Namespace, monkeypatch: pytest.MonkeyPatch) -> None:
    key = GenerateConfig.from_args(args).pool
    future: concurrent.futures.Future[generate_module.PoolHandle] = concurrent.futures.Future()
    future.set_result(generate_module.PoolHandle(_Pool(), ["instance-0"], (LAYERS, TOP_K)))
    monkeypatch.setitem(generate_module._pools, key, future)
    monkeypatch.setattr(generate_module, "_tokenizer", lambda directory: _Tokenizer())


def _eval_data(args: argparse.Namespace) -> dict[str, Any]:
    from miles.rollout.inference_rollout.inference_rollout_eval import eval_rollout_single_dataset
    from miles.utils.eval_config import EvalDatasetConfig
    from miles.utils.types import Sample

    config = EvalDatasetConfig(
        name="quiz", path="quiz.jsonl", n_samples_per_eval_prompt=4, temperature=0.0, top_p=1.0, top_k=1,
        max_response_len=16, custom_generate_function_path="rl360_ext.rollout.generate.generate",
    )  # fmt: skip
    prompts = [Sample(prompt=f"solve {task}", metadata={"task": task}) for task in ("pass", "half", "outage")]
    cache_key = (*config.cache_key, args.hf_checkpoint, args.apply_chat_template, args.chat_template_path)
    cache = {cache_key: SimpleNamespace(samples=prompts)}
    state = SimpleNamespace(
        args=args,
        generate_fn_semaphore=asyncio.Semaphore(4),
        aborted=False,
        generate_function=generate_module.generate,
    )

    async def run() -> dict[str, Any]:
        return await eval_rollout_single_dataset(state, config, cache)

    return asyncio.run(run())


@pytest.fixture(autouse=True)
def _fresh_records() -> None:
    SEEN_REQUEST_KWARGS.clear()
    SEEN_METADATA.clear()
    HALF_CALLS.clear()
    SEEN_R3.clear()


@pytest.mark.parametrize("reward_key", [None, "score"])
def test_miles_eval_rollout_runs_rl360s_hooks_and_logs_honest_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reward_key: str | None
) -> None:
    from miles.ray.rollout.metrics import log_eval_rollout_data
    from miles.utils import tracking_utils

    args = _args(tmp_path, reward_key)
    _install_pool(args, monkeypatch)
    data = _eval_data(args)
    entry = data["quiz"]
    samples = entry["samples"]
    assert len(samples) == 12 and [s.index for s in samples] == list(range(12))
    # the eval dataset's sampling params reached the agent, and the hook told it this is an eval
    assert all(
        kw["temperature"] == 0.0 and kw["top_k"] == 1 and kw["max_tokens"] == 16 for kw in SEEN_REQUEST_KWARGS
    )
    assert all(meta["evaluation"] is True for meta in SEEN_METADATA)
    assert SEEN_R3 == [False] * 12  # eval sessions opt out of the pool's routing replay
    assert all(s.rollout_routed_experts is None and s.metadata["evaluation"] is True for s in samples)
    outage = [s for s in samples if s.metadata["task"] == "outage"]
    assert all(s.metadata["attempt_class"] == "infra:no_sandbox" for s in outage)
    assert entry["rewards"][8:] == [None] * 4  # Miles read None, with or without a reward key
    logged: list[dict[str, Any]] = []
    monkeypatch.setattr(tracking_utils.tracking, "log", lambda _args, d, step_key: logged.append(dict(d)))
    monkeypatch.setattr(
        "miles.ray.rollout.metrics.tracking.log", lambda _args, d, step_key: logged.append(dict(d))
    )
    assert log_eval_rollout_data(5, args, data) is None  # the hook returned True: Miles' default skipped
    (ours,) = logged
    # "pass" 4/4, "half" 2/4, "outage" all infra
    assert ours["eval/quiz/pass_rate"] == pytest.approx(6 / 8)
    assert ours["eval/quiz/infra_rate"] == pytest.approx(4 / 12)
    assert ours["eval/quiz/upstream"] == pytest.approx(6 / 12)
    assert ours["eval/quiz/pass@4"] == pytest.approx(1.0) and ours["eval/quiz/pass@4_tasks"] == 2
    assert ours["eval/quiz/pass@2"] == pytest.approx((1.0 + (1 - 1 / 6)) / 2)
    assert "eval/step" in ours and "eval/quiz" not in ours
    assert "eval/quiz/response_len/mean" in ours  # Miles' own sample metrics, over the valid attempts
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert (record["kind"], record["rollout_id"], record["dataset"]) == ("eval", 5, "quiz")
    # Miles' default logger on the same data: the outage reads as failed answers
    args.custom_eval_rollout_log_function_path = None
    logged.clear()
    upstream = log_eval_rollout_data(5, args, data)
    assert (
        upstream["eval/quiz"] == pytest.approx(6 / 12) and upstream["eval/quiz-none_reward_ratio"] == 4 / 12
    )
