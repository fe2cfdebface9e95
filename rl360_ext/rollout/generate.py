"""The generate hook (`--custom-generate-function-path rl360_ext.rollout.generate.generate`).

Owns one attempt end to end on Miles' side: open a session on this process's SessionPool, run the
agent function (rl360's Harbor `/run` client by default) against the session's OpenAI URL,
collect the merged sample, delete the session, and fill Miles' `Sample`: tokens, response,
response_length, loss_mask, rollout_log_probs, rollout_routed_experts, weight_versions, status,
reward (only when valid), routing_key, non_generation_time and the provenance metadata every rl360
hook reads. Infrastructure failures are turned into samples Miles trains on nothing
(`rl360_ext.outcomes.infra.mark_infra_sample`) with status ABORTED, which is also what keeps
Miles from running a reward model on them. It owns the rl360 rollout flags (`add_arguments`)
and the per-process pool (`session_pool`, `shutdown_session_pool`); filling the `Sample` from
the merged sample and the verdict is `rl360_ext.rollout.sample_fill`.

It does not decide validity: it reads the verdict the Harbor server sent through the agent
function and adds only what this client alone sees (the session it lost, an engine failure the
session recorded, a turn the engine aborted, a sample `--max-seq-len` leaves empty), through
`rl360_ext.outcomes.verdict`. It does not run trials (the Harbor server), hold sessions (the
session servers) or merge turns (`rl360_ext.session.samples.merge`).

Alignment with Miles: the Sample's token fields come from `rl360_ext.session.samples.miles_sample.
to_miles_sample`, the converter the `/samples` wire uses too, so a trajectory trains the same
under this hook and under Miles' stock `agentic_tool_call.generate`: `Sample.tokens` is prompt +
response; `response_length`, `loss_mask` and `rollout_log_probs` cover the response part only;
`rollout_routed_experts` covers every token but the last (int32 `[len(tokens) - 1, layers,
top_k]`); `--max-seq-len` cuts at turn boundaries as Miles' session server does.

Evaluation (`GenerateFnInput.evaluation`, Miles 31f1ca96: `eval_rollout_single_dataset` in
`miles/rollout/inference_rollout/inference_rollout_eval.py:67-98` and
`miles/rollout/sglang_rollout.py:601-636` calls the same generate function with
`evaluation=True` and the eval dataset's sampling params; nothing it returns is trained on or
filtered). The hook then: sends `input.sampling_params` as they are (the dataset's temperature,
top_p, top_k, max_new_tokens), reads the reward under `--eval-reward-key` or `--reward-key`
(Miles' rule, `inference_rollout_eval.py:126`), keeps the session (it is the model endpoint and
records the engine failures that make an attempt infra), opens it without routing replay
(`acreate_session(r3=False)`: R3 serves only training, so the engine computes and ships no routed
experts for an eval turn and the Sample carries none) and skips `--rl360-on-template-drift mask`
(a loss mask that is never used). An infra attempt keeps `reward = None`, or `{key: None}` under a
reward key, so Miles' `sample.reward[reward_key]` (`inference_rollout_eval.py:129`) reads None
instead of raising TypeError; `rl360_ext.rollout.eval_metrics` then excludes it from the pass rate.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import inspect
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

from rl360_ext.outcomes.causes import Cause
from rl360_ext.rollout import agent as agent_module
from rl360_ext.rollout import metrics as metrics_module
from rl360_ext.rollout import version_buffer
from rl360_ext.rollout.agent import AGENT_CONFIG_KWARG, EVALUATION_KEY
from rl360_ext.rollout.config import (
    AgentConfig,
    GenerateConfig,
    SessionPoolConfig,
    TemplateDriftConfig,
    add_dataclass_arguments,
    flag_name,
)
from rl360_ext.rollout.sample import GenerateFnInput, GenerateFnOutput
from rl360_ext.rollout.sample_fill import classify, finish_sample, mask_template_drift, non_generation_time
from rl360_ext.session.samples.merge import MergedSample
from rl360_ext.train import reducers as reducers_module
from rl360_ext.util.dotted import load_function

logger = logging.getLogger(__name__)


DEFAULT_AGENT_FUNCTION = "rl360_ext.rollout.agent.run"


OPENAI_REQUEST_KEYS = frozenset(
    {
        "max_tokens",
        "max_completion_tokens",
        "min_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "stop",
        "stop_token_ids",
        "seed",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "logit_bias",
        "ignore_eos",
        "skip_special_tokens",
        "no_stop_trim",
        "n",
    }
)


_SGLANG_TO_OPENAI = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "sampling_seed": "seed"}


def _has_option(parser: argparse.ArgumentParser, option: str) -> bool:
    return option in getattr(parser, "_option_string_actions", {})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every rl360 rollout flag (also the metrics and loss-reducer flags); safe to call twice.

    The `--rl360-*` flags of the agent function and the session pool are derived from the fields
    of `AgentConfig` and `SessionPoolConfig` (`rl360_ext.rollout.config`), their one home.
    """
    if not _has_option(parser, flag_name("harbor_url")):
        group = parser.add_argument_group("rl360 rollout (rl360_ext.rollout.generate)")
        add_dataclass_arguments(group, AgentConfig)
        add_dataclass_arguments(group, SessionPoolConfig)
        add_dataclass_arguments(group, TemplateDriftConfig)
    if not _has_option(parser, "--custom-agent-function-path"):
        parser.add_argument(
            "--custom-agent-function-path",
            type=str,
            default=DEFAULT_AGENT_FUNCTION,
            help="Agent function; Miles calls the `abort` next to it when a rollout is aborted.",
        )
    if not _has_option(parser, "--max-seq-len"):
        parser.add_argument(
            "--max-seq-len",
            type=int,
            default=None,
            dest="max_seq_len",
            help="Max tokens (prompt + completion + tool output) per trajectory; longer ones are truncated.",
        )
    if not _has_option(parser, "--rl360-metrics-path"):
        metrics_module.add_arguments(parser)
    if not _has_option(parser, "--rl360-pg-loss-constant"):
        reducers_module.add_arguments(parser)
    if not _has_option(parser, flag_name("max_token_age")):
        version_buffer.add_arguments(parser)


@dataclass
class PoolHandle:
    """A SessionPool and what the hook needs next to it."""

    pool: Any  # rl360_ext.session.pool.SessionPool
    instance_ids: list[str]  # one per actor: the key Harbor's /flush cancels trials by
    routing_shape: tuple[int, int] | None  # (layers, top_k) with R3


_pools: dict[SessionPoolConfig, concurrent.futures.Future[PoolHandle]] = {}


_pools_lock = threading.Lock()


def _start_pool(key: SessionPoolConfig) -> PoolHandle:
    from rl360_ext.session.pool import SessionPool
    from rl360_ext.session.service import SessionServerConfig, resolve_routing_shape

    options: dict[str, Any] = {"chat_template": key.chat_template} if key.chat_template else {}
    if key.top_logprobs_num:
        options["top_logprobs_num"] = key.top_logprobs_num
    shape = None
    if key.r3:
        resolved = resolve_routing_shape(
            SessionServerConfig(
                backend_url=str(key.session_backend), tokenizer_dir=str(key.tokenizer), r3=True
            )
        )
        assert resolved is not None
        shape = (resolved.layers, resolved.top_k)
        options.update(
            routing_layers=resolved.layers, routing_top_k=resolved.top_k, routing_experts=resolved.num_experts
        )
    pool = SessionPool(
        key.session_servers,
        str(key.session_backend),
        str(key.tokenizer),
        bool(key.r3),
        host=key.session_host,
        **options,
    )
    instance_ids = [uuid.uuid4().hex for _ in pool.actors]
    agent_module.register_instance_ids(instance_ids)
    return PoolHandle(pool, instance_ids, shape)


def _build(key: SessionPoolConfig, future: concurrent.futures.Future[PoolHandle]) -> None:
    try:
        future.set_result(_start_pool(key))
    except BaseException as exc:  # handed to every waiter; a later call retries
        with _pools_lock:
            _pools.pop(key, None)
        future.set_exception(exc)


async def session_pool(key: SessionPoolConfig) -> PoolHandle:
    """This process's pool for `key`, started on first use (in a thread; concurrent callers share it)."""
    with _pools_lock:
        future = _pools.get(key)
        if future is None:
            future = _pools[key] = concurrent.futures.Future()
            threading.Thread(
                target=_build, args=(key, future), name="rl360-session-pool", daemon=True
            ).start()
    return await asyncio.wrap_future(future)


def shutdown_session_pool() -> None:
    """Stop every session pool this process started (the demo and tests call it at exit)."""
    with _pools_lock:
        futures = list(_pools.values())
        _pools.clear()
    for future in futures:
        try:
            handle = future.result(timeout=300)
        except Exception:  # a pool that never started has nothing to stop
            continue
        agent_module.forget_instance_ids(handle.instance_ids)
        handle.pool.shutdown()


@lru_cache(maxsize=8)
def _tokenizer(directory: str) -> Any:
    from rl360_ext.templates.tokenizer import load_hf_tokenizer

    return load_hf_tokenizer(directory)


def _fallback_token_id(tokenizer: Any) -> int:
    for name in ("eos_token_id", "pad_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            return value
    return 0


def request_kwargs_from_sampling_params(sampling_params: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI chat parameters from Miles' SGLang sampling params (max_new_tokens -> max_tokens, ...).

    Keys an OpenAI-compatible chat request does not take are dropped, and so are None values;
    `logit_bias` passes through only when the caller gave one.
    """
    kwargs: dict[str, Any] = {}
    for key, value in sampling_params.items():
        name = _SGLANG_TO_OPENAI.get(key, key)
        if value is None or name not in OPENAI_REQUEST_KEYS:
            continue
        if key in _SGLANG_TO_OPENAI and name in sampling_params and sampling_params[name] is not None:
            continue  # an explicit OpenAI name wins over its SGLang alias
        kwargs[name] = value
    return kwargs


def load_agent_function(
    path: str | None, config: AgentConfig | None = None
) -> Callable[..., Awaitable[dict[str, Any] | None]]:
    """`module.attr` (Miles' load_function convention), or rl360's agent.run when unset.

    With `config` (the hook's flags), a function that takes `**kwargs` (Miles' agent-function
    contract) or an `rl360_config` parameter gets it as `rl360_config=`: rl360's own `agent.run`
    reads it, and a wrapper that forwards `**kwargs` to it passes it on. No module state.
    """
    if not path or path == DEFAULT_AGENT_FUNCTION:
        function: Callable[..., Awaitable[dict[str, Any] | None]] = agent_module.run
    else:
        function = load_function(path, "--custom-agent-function-path")
    if config is None or not _takes_config(function):
        return function
    return partial(function, rl360_config=config)


def _takes_config(function: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: pass nothing extra
        return False
    return any(p.kind is p.VAR_KEYWORD or p.name == AGENT_CONFIG_KWARG for p in parameters)


def eval_reward_key(args: Any) -> str | None:
    """The reward key Miles reads eval rewards by: `--eval-reward-key`, else `--reward-key`
    (`miles/rollout/inference_rollout/inference_rollout_eval.py:126`)."""
    return getattr(args, "eval_reward_key", None) or getattr(args, "reward_key", None)


async def _collect(handle: PoolHandle, session_id: str) -> tuple[MergedSample | None, str | None]:
    """(merged, None), or (None, why): any collect failure is SESSION_VANISHED (infra, never a reward),
    including the session server's 410 `session_lost` (its process restarted) and `session_expired`."""
    try:
        (merged,) = await handle.pool.acollect([session_id])
        return merged, None
    except Exception as exc:  # the actor died, the session was deleted or evicted: the tokens are gone
        return None, f"collecting session {session_id} failed: {type(exc).__name__}: {exc}"


async def _delete(handle: PoolHandle, session_id: str) -> None:
    try:
        await handle.pool.adelete(session_id)
    except Exception as exc:  # already gone (deleted, evicted, actor died): nothing left to free
        logger.debug("rl360 generate: deleting session %s: %r", session_id, exc)


async def _run_agent(
    options: GenerateConfig,
    base_url: str,
    sample: Any,
    request_kwargs: dict[str, Any],
    metadata: dict[str, Any],
) -> tuple[dict[str, Any] | None, str | None]:
    """(the agent function's answer, why there is none); a hung custom agent hits the client deadline."""
    agent_fn = load_agent_function(options.agent_function_path, options.agent)
    limit_s = float(metadata[agent_module.DEADLINE_KEY]) + 2 * options.agent.client_margin_s
    try:
        async with asyncio.timeout(limit_s):
            result = await agent_fn(
                base_url=base_url, prompt=sample.prompt, request_kwargs=request_kwargs, metadata=metadata
            )
    except TimeoutError:
        message = f"the agent function did not return within {limit_s:.1f}s"
        return agent_module.failure_metadata(Cause.CLIENT_DEADLINE, message, "TimeoutError"), message
    except agent_module.AgentConfigError:
        raise
    except Exception as exc:  # a custom agent function's bug costs this attempt, not the run
        logger.warning("rl360 generate: agent function raised %r", exc, exc_info=True)
        return None, f"the agent function raised {type(exc).__name__}: {exc}"
    if result is None:
        return None, "the agent function returned None"
    if not isinstance(result, Mapping):
        return None, f"the agent function returned {type(result).__name__}, not a dict"
    return dict(result), None


async def generate(input: GenerateFnInput) -> GenerateFnOutput:
    """Miles' generate-function contract: one attempt -> one Sample (see the module docstring)."""
    args = input.args
    options = GenerateConfig.from_args(args)  # read from Miles' args on every call; no module state
    handle = await session_pool(options.pool)
    tokenizer = _tokenizer(str(options.pool.tokenizer))
    sample = input.sample
    started = time.monotonic()
    timings: dict[str, float] = {}
    session_meta = {"group_index": sample.group_index, "index": sample.index}
    try:
        session_id, v1_url = await handle.pool.acreate_session(
            metadata=session_meta,
            routing_key=sample.routing_key or None,
            r3=False if input.evaluation and handle.routing_shape is not None else None,
        )
    except Exception as exc:  # no session server answered: nothing ran
        detail = f"could not open a session: {type(exc).__name__}: {exc}"
        return GenerateFnOutput(samples=_infra_without_session(input, detail, tokenizer, handle))
    timings["session_open"] = time.monotonic() - started
    server = handle.pool.server_for(session_id)
    instance_id = handle.instance_ids[server]
    base_url = v1_url.removesuffix("/v1")
    metadata = {
        **(sample.metadata or {}),
        "session_id": session_id,
        "session_server_instance_id": instance_id,
        agent_module.DEADLINE_KEY: max(options.agent.deadline_s - timings["session_open"], 1e-3),
    }
    if options.max_seq_len is not None:
        metadata["max_seq_len"] = options.max_seq_len
    if input.evaluation:
        metadata[EVALUATION_KEY] = True
    try:
        agent_started = time.monotonic()
        result, why = await _run_agent(
            options, base_url, sample, request_kwargs_from_sampling_params(input.sampling_params), metadata
        )
        timings["agent"] = time.monotonic() - agent_started
        merged, session_problem = await _collect(handle, session_id)
    finally:
        await asyncio.shield(_delete(handle, session_id))
    timings["total"] = time.monotonic() - started
    attempt_class = classify(
        result,
        Cause.SESSION_VANISHED if session_problem else None,
        options.agent.agent_timeout_policy,
        merged,
    )
    detail = session_problem or why or (result or {}).get("exception_message")
    sample.routing_key = sample.routing_key or (merged.metadata["session"]["routing_key"] if merged else None)
    finish_sample(
        sample,
        merged=merged,
        result=result,
        attempt_class=attempt_class,
        detail=detail,
        decode=lambda ids: tokenizer.decode(ids),
        fallback_token_id=_fallback_token_id(tokenizer),
        routing_shape=handle.routing_shape,
        max_seq_len=options.max_seq_len,
        reward_key=eval_reward_key(args) if input.evaluation else getattr(args, "reward_key", None),
        evaluation=input.evaluation,
    )
    if not input.evaluation:  # an eval sample is never trained: its loss mask is unused
        mask_template_drift(sample, options.on_template_drift)
    sample.non_generation_time = non_generation_time(result, timings["agent"], merged)
    sample.metadata.update(
        session_id=session_id,
        session_server_instance_id=instance_id,
        session_server_url=handle.pool.urls[server],
        generate_timings=timings,
    )
    return GenerateFnOutput(samples=sample)


def _infra_without_session(input: GenerateFnInput, detail: str, tokenizer: Any, handle: PoolHandle) -> Any:
    attempt_class = classify(None, Cause.SESSION_VANISHED, "score")
    return finish_sample(
        input.sample,
        merged=None,
        result=None,
        attempt_class=attempt_class,
        detail=detail,
        decode=lambda ids: tokenizer.decode(ids),
        fallback_token_id=_fallback_token_id(tokenizer),
        routing_shape=handle.routing_shape,
        reward_key=eval_reward_key(input.args) if input.evaluation else None,
        evaluation=input.evaluation,
    )


generate.add_arguments = add_arguments  # type: ignore[attr-defined]
