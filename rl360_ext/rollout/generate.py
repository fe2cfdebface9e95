"""The generate hook (`--custom-generate-function-path rl360_ext.rollout.generate.generate`).

Owns one attempt end to end on Miles' side: open a session on this process's SessionPool, run the
agent function (rl360's Harbor `/run` client by default) against the session's OpenAI URL,
collect the merged sample, delete the session, and fill Miles' `Sample`: tokens, response,
response_length, loss_mask, rollout_log_probs, rollout_routed_experts, weight_versions, status,
reward (only when valid), routing_key, non_generation_time and the provenance metadata every rl360
hook reads. Infrastructure failures are turned into samples Miles trains on nothing
(`rl360_ext.outcomes.infra.mark_infra_sample`) with status ABORTED, which is also what keeps
Miles from running a reward model on them. It owns the rl360 rollout flags (`add_arguments`)
and the per-process pool (`session_pool`, `shutdown_session_pool`).

It does not decide validity rules (`infra.classify_attempt`), run trials (the Harbor server),
hold sessions (the session servers) or merge turns (`rl360_ext.session.merge`).

Alignment with Miles: `Sample.tokens` is prompt + response; `response_length`, `loss_mask` and
`rollout_log_probs` cover the response part only (`MergedSample.loss_mask[prompt_length:]`),
as Miles' own session server builds them; `rollout_routed_experts` covers every token but the
last (int32 `[len(tokens) - 1, layers, top_k]`).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import importlib
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from rl360_ext.outcomes.infra import (
    AGENT_TIMEOUT_POLICIES,
    classify_attempt,
    infra_class,
    mark_infra_sample,
    worst_engine_failure,
)
from rl360_ext.outcomes.provenance import ATTEMPT_CLASS, FAILURE_CAUSE, PHASE_TIMINGS, REWARD_SOURCE, VALID
from rl360_ext.rollout import agent as agent_module
from rl360_ext.rollout import metrics as metrics_module
from rl360_ext.rollout.rewards import verifier_reward_value
from rl360_ext.rollout.sample import GenerateFnInput, GenerateFnOutput, Sample
from rl360_ext.session.merge import ABORTED, COMPLETED, FAILED, TRUNCATED, MergedSample
from rl360_ext.templates.drift import DRIFT_KEY
from rl360_ext.train import reducers as reducers_module

logger = logging.getLogger(__name__)

SESSION_VANISHED = "session_vanished"
DEFAULT_AGENT_FUNCTION = "rl360_ext.rollout.agent.run"
ABORTED_CAUSE = "aborted"
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
_NOT_METADATA = frozenset({"reward", "rewards", ATTEMPT_CLASS})
_SGLANG_TO_OPENAI = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "sampling_seed": "seed"}


# ---- options --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolKey:
    """What makes two session pools interchangeable."""

    num_servers: int
    backend_url: str
    tokenizer_dir: str
    chat_template: str | None
    r3: bool
    host: str | None = None  # the address session servers bind; None: the Ray node's IP


@dataclass(frozen=True)
class GenerateOptions:
    harbor_url: str
    harbor_token: str | None
    pool: PoolKey
    deadline_s: float
    client_margin_s: float
    agent_timeout_policy: str
    agent: str | None
    task_key: str
    max_seq_len: int | None
    agent_function_path: str | None
    on_template_drift: str = "keep"


TEMPLATE_DRIFT_POLICIES = ("keep", "mask")


def _arg(args: Any, name: str, default: Any = None) -> Any:
    value = getattr(args, name, None)
    return default if value is None else value


def options_from_args(args: Any) -> GenerateOptions:
    """The hook's options from Miles' args; a ValueError names the flag that is missing or wrong."""
    env = agent_module.AgentSettings.from_env()
    harbor_url = _arg(args, "rl360_harbor_url", env.harbor_url)
    if not harbor_url:
        raise ValueError(f"--rl360-harbor-url is required (or set ${agent_module.HARBOR_URL_ENV})")
    backend = getattr(args, "rl360_session_backend", None)
    if backend is None:
        ip, port = getattr(args, "sglang_router_ip", None), getattr(args, "sglang_router_port", None)
        if not ip or not port:
            raise ValueError(
                "--rl360-session-backend is required when Miles' --sglang-router-ip and "
                "--sglang-router-port are unset"
            )
        backend = f"http://{ip}:{port}"
    tokenizer_dir = _arg(args, "rl360_tokenizer", getattr(args, "hf_checkpoint", None))
    if not tokenizer_dir:
        raise ValueError("--rl360-tokenizer is required when Miles' --hf-checkpoint is unset")
    servers = int(_arg(args, "rl360_session_servers", 1))
    if servers < 1:
        raise ValueError(f"--rl360-session-servers must be >= 1, got {servers}")
    r3 = _arg(args, "rl360_r3", bool(getattr(args, "use_rollout_routing_replay", False)))
    deadline_s = float(_arg(args, "rl360_deadline_s", agent_module.DEFAULT_DEADLINE_S))
    if not deadline_s > 0:
        raise ValueError(f"--rl360-deadline-s must be > 0, got {deadline_s}")
    policy = _arg(args, "rl360_agent_timeout_policy", env.agent_timeout_policy)
    if policy not in AGENT_TIMEOUT_POLICIES:
        raise ValueError(
            f"--rl360-agent-timeout-policy must be one of {AGENT_TIMEOUT_POLICIES}, got {policy!r}"
        )
    max_seq_len = getattr(args, "max_seq_len", None)
    return GenerateOptions(
        harbor_url=str(harbor_url),
        harbor_token=_arg(args, "rl360_harbor_token", env.token),
        pool=PoolKey(
            servers,
            str(backend),
            str(tokenizer_dir),
            getattr(args, "rl360_chat_template", None),
            bool(r3),
            getattr(args, "rl360_session_host", None),
        ),
        deadline_s=deadline_s,
        client_margin_s=float(_arg(args, "rl360_client_margin_s", agent_module.DEFAULT_CLIENT_MARGIN_S)),
        agent_timeout_policy=policy,
        agent=_arg(args, "rl360_agent", env.agent),
        task_key=_arg(args, "rl360_task_key", env.task_key),
        max_seq_len=None if max_seq_len is None else int(max_seq_len),
        agent_function_path=getattr(args, "custom_agent_function_path", None),
        on_template_drift=_drift_policy(args),
    )


def _drift_policy(args: Any) -> str:
    policy = _arg(args, "rl360_on_template_drift", "keep")
    if policy not in TEMPLATE_DRIFT_POLICIES:
        raise ValueError(
            f"--rl360-on-template-drift must be one of {TEMPLATE_DRIFT_POLICIES}, got {policy!r}"
        )
    return policy


def _has_option(parser: argparse.ArgumentParser, option: str) -> bool:
    return option in getattr(parser, "_option_string_actions", {})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every rl360 rollout flag (also the metrics and loss-reducer flags); safe to call twice."""
    if not _has_option(parser, "--rl360-harbor-url"):
        group = parser.add_argument_group("rl360 rollout (rl360_ext.rollout.generate)")
        group.add_argument("--rl360-harbor-url", type=str, default=None, help="Harbor /run server base URL.")
        group.add_argument(
            "--rl360-harbor-token", type=str, default=None, help="Bearer token for the Harbor /run server."
        )
        group.add_argument(
            "--rl360-session-servers", type=int, default=1, help="Session servers (Ray actors)."
        )
        group.add_argument(
            "--rl360-session-backend",
            type=str,
            default=None,
            help="SGLang-protocol URL the session servers use (default http://<sglang-router-ip>:<port>).",
        )
        group.add_argument(
            "--rl360-session-host",
            type=str,
            default=None,
            help="Address the session servers bind (default: the Ray node's IP; 127.0.0.1 on one machine).",
        )
        group.add_argument(
            "--rl360-tokenizer", type=str, default=None, help="Tokenizer directory (default --hf-checkpoint)."
        )
        group.add_argument(
            "--rl360-chat-template",
            type=str,
            default=None,
            help="Session servers' chat template: unset (the tokenizer's), 'fixed', or a template file.",
        )
        group.add_argument(
            "--rl360-r3",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="Record routing replay (default: --use-rollout-routing-replay).",
        )
        group.add_argument(
            "--rl360-deadline-s",
            type=float,
            default=None,
            help="Client deadline per attempt (default 3600 s).",
        )
        group.add_argument(
            "--rl360-client-margin-s",
            type=float,
            default=None,
            help="Extra seconds the client waits past the deadline it sends the server (default 5).",
        )
        group.add_argument(
            "--rl360-agent-timeout-policy",
            choices=AGENT_TIMEOUT_POLICIES,
            default=None,
            help="Agent timeouts: 'score' (default; the verifier's reward counts) or 'mask' (infra).",
        )
        group.add_argument(
            "--rl360-agent", type=str, default=None, help="Harbor agent for /run (default: the server's)."
        )
        group.add_argument(
            "--rl360-on-template-drift",
            choices=TEMPLATE_DRIFT_POLICIES,
            default=None,
            help="Trajectories whose tokens drift from the canonical render: 'keep' (default; counted in "
            "tito/render_mismatch_frac) or 'mask' (zero loss mask).",
        )
        group.add_argument(
            "--rl360-task-key",
            type=str,
            default=None,
            help="Sample.metadata key holding the task path under the Harbor tasks root (default 'task').",
        )
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


# ---- the per-process session pool ------------------------------------------------------------------


@dataclass
class PoolHandle:
    """A SessionPool and what the hook needs next to it."""

    pool: Any  # rl360_ext.session.pool.SessionPool
    instance_ids: list[str]  # one per actor: the key Harbor's /flush cancels trials by
    routing_shape: tuple[int, int] | None  # (layers, top_k) with R3


_pools: dict[PoolKey, concurrent.futures.Future[PoolHandle]] = {}
_pools_lock = threading.Lock()


def _start_pool(key: PoolKey) -> PoolHandle:
    from rl360_ext.session.pool import SessionPool
    from rl360_ext.session.service import ServiceOptions, resolve_routing_shape

    options: dict[str, Any] = {"chat_template": key.chat_template} if key.chat_template else {}
    shape = None
    if key.r3:
        resolved = resolve_routing_shape(
            ServiceOptions(backend_url=key.backend_url, tokenizer_dir=key.tokenizer_dir, r3=True)
        )
        assert resolved is not None
        shape = (resolved.layers, resolved.top_k)
        options.update(
            routing_layers=resolved.layers, routing_top_k=resolved.top_k, routing_experts=resolved.num_experts
        )
    pool = SessionPool(key.num_servers, key.backend_url, key.tokenizer_dir, key.r3, host=key.host, **options)
    instance_ids = [uuid.uuid4().hex for _ in pool.actors]
    agent_module.register_instance_ids(instance_ids)
    return PoolHandle(pool, instance_ids, shape)


def _build(key: PoolKey, future: concurrent.futures.Future[PoolHandle]) -> None:
    try:
        future.set_result(_start_pool(key))
    except BaseException as exc:  # handed to every waiter; a later call retries
        with _pools_lock:
            _pools.pop(key, None)
        future.set_exception(exc)


async def session_pool(key: PoolKey) -> PoolHandle:
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


# ---- pure parts ---------------------------------------------------------------------------------------


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


def load_agent_function(path: str | None) -> Callable[..., Awaitable[dict[str, Any] | None]]:
    """`module.attr` (Miles' load_function convention), or rl360's agent.run when unset."""
    if not path or path == DEFAULT_AGENT_FUNCTION:
        return agent_module.run
    module, _, attr = path.rpartition(".")
    if not module:
        raise ValueError(f"--custom-agent-function-path must be module.function, got {path!r}")
    return getattr(importlib.import_module(module), attr)


def fill_from_merged(
    sample: Any, merged: MergedSample, decode: Callable[[list[int]], str], max_seq_len: int | None = None
) -> tuple[bool, str | None]:
    """Put the merged sample's tokens into `sample`: (filled, why it cannot be trained on or None).

    Sets tokens, response, response_length, loss_mask and rollout_log_probs (response part),
    rollout_routed_experts (int32, every token but the last), weight_versions and status. A
    trajectory longer than `max_seq_len` is cut there (status TRUNCATED), as Miles' session
    server does.
    """
    if merged.status == FAILED or len(merged.tokens) == 0:
        return False, "the agent made no model calls (the session recorded no turns)"
    prompt_length = merged.prompt_length
    truncated = max_seq_len is not None and len(merged.tokens) > max_seq_len
    keep = max_seq_len if truncated and max_seq_len is not None else len(merged.tokens)
    if keep <= prompt_length and truncated:
        return False, f"the first prompt ({prompt_length} tokens) does not fit --max-seq-len {max_seq_len}"
    if keep <= prompt_length:
        return False, "the model produced no response tokens"
    sample.tokens = merged.tokens[:keep].tolist()
    sample.response_length = keep - prompt_length
    sample.response = decode(sample.tokens[prompt_length:])
    sample.loss_mask = merged.loss_mask[prompt_length:keep].astype(int).tolist()
    sample.rollout_log_probs = merged.rollout_log_probs[prompt_length:keep].astype(float).tolist()
    routed = merged.routed_experts
    sample.rollout_routed_experts = None if routed is None else routed[: keep - 1].astype(np.int32)
    sample.weight_versions = [str(v) for v in merged.weight_versions if v is not None]
    status = TRUNCATED if truncated else merged.status
    sample.status = (
        Sample.Status[status] if status in (COMPLETED, TRUNCATED, ABORTED) else Sample.Status.FAILED
    )
    if merged.status == ABORTED:
        return True, "the engine aborted a turn, so the sample is a prefix of what the verifier graded"
    return True, None


def session_metadata(merged: MergedSample | None) -> dict[str, Any]:
    """Template/session facts and the token counters the metrics hook reads."""
    if merged is None:
        return {"cached_tokens": 0, "prompt_tokens": 0, "routing_bytes": 0}
    merge_facts = merged.metadata.get("merge", {})
    return {
        "session": merged.metadata.get("session"),
        "merge": merge_facts,
        "turns": merged.turns,
        "cached_tokens": int(merge_facts.get("cached_tokens_total", 0)),
        "prompt_tokens": int(merge_facts.get("prompt_tokens_total", 0)),
        "routing_bytes": int(merge_facts.get("routing_wire_bytes_moved", 0)),
        "r3_rows_from_prefill_fraction": merged.r3_rows_from_prefill_fraction,
        DRIFT_KEY: merged.metadata.get(DRIFT_KEY),
    }


def mask_template_drift(sample: Any, policy: str) -> bool:
    """`--rl360-on-template-drift mask`: a trajectory whose tokens drift from the canonical render
    is kept out of the loss (loss mask all zero; its verifier reward still counts in the group
    baseline). True when the sample was masked."""
    record = (sample.metadata or {}).get(DRIFT_KEY) or {}
    if policy != "mask" or not record.get("mismatch") or not sample.loss_mask:
        return False
    sample.loss_mask = [0] * len(sample.loss_mask)
    sample.metadata["template_drift_masked"] = True
    return True


def run_metadata(result: Mapping[str, Any] | None) -> dict[str, Any]:
    """The agent function's answer as Sample.metadata entries (as Miles merges an agent's dict), less
    the reward itself (it goes to Sample.reward, and only when valid) and its class (decided here)."""
    if result is None:
        return {REWARD_SOURCE: None, FAILURE_CAUSE: None, PHASE_TIMINGS: {}}
    entries = {key: value for key, value in result.items() if key not in _NOT_METADATA}
    entries[REWARD_SOURCE] = result.get(REWARD_SOURCE)
    timings = result.get(PHASE_TIMINGS)
    entries[PHASE_TIMINGS] = dict(timings) if isinstance(timings, Mapping) else {}
    return entries


def classify(
    result: Mapping[str, Any] | None,
    session_error: str | None,
    agent_timeout_policy: str,
    merged: MergedSample | None = None,
) -> str:
    """The attempt's class from the agent's answer (or None) and what the session side saw.

    A turn the engine side failed with a 5xx during the attempt (recorded by the session server)
    makes the attempt `infra:no_engine_available` even when the agent carried on and a verifier
    graded it: the trajectory it graded was cut short by infrastructure, not by the policy.
    """
    return classify_attempt(
        result,
        transport_error=(result or {}).get("transport_error"),
        client_deadline=bool((result or {}).get("client_deadline")),
        session_error=session_error,
        gateway_status=worst_engine_failure(None if merged is None else merged.metadata),
        agent_timeout_policy=agent_timeout_policy,
    )


def non_generation_time(
    result: Mapping[str, Any] | None, agent_wall_s: float, merged: MergedSample | None
) -> float:
    """Seconds the attempt spent outside the engine: the agent's total_tool_time when it reports one
    (Miles' convention), else the agent's wall time minus the engine time of its turns."""
    reported = ((result or {}).get("agent_metrics") or {}).get("total_tool_time")
    if isinstance(reported, int | float):
        return float(reported)
    engine_s = sum(float(turn.get("latency_s") or 0.0) for turn in (merged.turns if merged else []))
    return max(0.0, agent_wall_s - engine_s)


def finish_sample(
    sample: Any,
    *,
    merged: MergedSample | None,
    result: Mapping[str, Any] | None,
    attempt_class: str,
    detail: str | None,
    decode: Callable[[list[int]], str],
    fallback_token_id: int,
    routing_shape: tuple[int, int] | None,
    max_seq_len: int | None = None,
    reward_key: str | None = None,
) -> Any:
    """Fill `sample` from what the attempt produced. A valid class whose tokens cannot be trained on
    becomes "infra:aborted"; every infra attempt goes through `mark_infra_sample` (status ABORTED)."""
    filled, unusable = (
        (False, "no merged sample was collected")
        if merged is None
        else fill_from_merged(sample, merged, decode, max_seq_len)
    )
    if attempt_class == VALID and unusable is not None:
        attempt_class, detail = f"infra:{ABORTED_CAUSE}", unusable
    reward = None
    if attempt_class == VALID:
        assert result is not None
        reward, missing = verifier_reward_value(result, reward_key)
        if missing is not None:
            attempt_class, detail = infra_class("reward_file_invalid"), missing
    sample.metadata = {**(sample.metadata or {}), **run_metadata(result), **session_metadata(merged)}
    if attempt_class == VALID:
        sample.metadata[ATTEMPT_CLASS] = VALID
        sample.reward = reward
        sample.remove_sample = False
        return sample
    if not filled:
        _reset_response(sample)
    mark_infra_sample(
        sample,
        attempt_class,
        detail=detail,
        fallback_token_id=fallback_token_id,
        routed_experts_shape=routing_shape,
    )
    sample.status = Sample.Status.ABORTED
    return sample


def _reset_response(sample: Any) -> None:
    """No usable turns: whatever the input sample held as a response is not this attempt's."""
    if int(getattr(sample, "response_length", 0) or 0) > 0:
        sample.tokens = list(sample.tokens)[: -int(sample.response_length)]
    sample.response_length = 0
    sample.response = ""
    sample.loss_mask = None
    sample.rollout_log_probs = None
    sample.rollout_routed_experts = None


# ---- the hook ------------------------------------------------------------------------------------------


def _configure_agent(options: GenerateOptions) -> None:
    settings = agent_module.current_settings()
    wanted = {
        "harbor_url": options.harbor_url,
        "token": options.harbor_token,
        "deadline_s": options.deadline_s,
        "client_margin_s": options.client_margin_s,
        "agent": options.agent,
        "task_key": options.task_key,
        "agent_timeout_policy": options.agent_timeout_policy,
    }
    if any(getattr(settings, key) != value for key, value in wanted.items()):
        agent_module.configure(**{**asdict(settings), **wanted})


async def _collect(handle: PoolHandle, session_id: str) -> tuple[MergedSample | None, str | None]:
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
    options: GenerateOptions,
    base_url: str,
    sample: Any,
    request_kwargs: dict[str, Any],
    metadata: dict[str, Any],
) -> tuple[dict[str, Any] | None, str | None]:
    """(the agent function's answer, why there is none); a hung custom agent hits the client deadline."""
    agent_fn = load_agent_function(options.agent_function_path)
    limit_s = float(metadata[agent_module.DEADLINE_KEY]) + 2 * options.client_margin_s
    try:
        async with asyncio.timeout(limit_s):
            result = await agent_fn(
                base_url=base_url, prompt=sample.prompt, request_kwargs=request_kwargs, metadata=metadata
            )
    except TimeoutError:
        message = f"the agent function did not return within {limit_s:.1f}s"
        return agent_module.failure_metadata(agent_module.CLIENT_DEADLINE, message, "TimeoutError"), message
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
    options = options_from_args(args)
    _configure_agent(options)
    handle = await session_pool(options.pool)
    tokenizer = _tokenizer(options.pool.tokenizer_dir)
    sample = input.sample
    started = time.monotonic()
    timings: dict[str, float] = {}
    session_meta = {"group_index": sample.group_index, "index": sample.index}
    try:
        session_id, v1_url = await handle.pool.acreate_session(
            metadata=session_meta, routing_key=sample.routing_key or None
        )
    except Exception as exc:  # no session server answered: nothing ran
        detail = f"could not open a session: {type(exc).__name__}: {exc}"
        return GenerateFnOutput(samples=_infra_without_session(sample, detail, tokenizer, handle))
    timings["session_open"] = time.monotonic() - started
    server = handle.pool.server_for(session_id)
    instance_id = handle.instance_ids[server]
    base_url = v1_url.removesuffix("/v1")
    metadata = {
        **(sample.metadata or {}),
        "session_id": session_id,
        "session_server_instance_id": instance_id,
        agent_module.DEADLINE_KEY: max(options.deadline_s - timings["session_open"], 1e-3),
    }
    if options.max_seq_len is not None:
        metadata["max_seq_len"] = options.max_seq_len
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
        result, SESSION_VANISHED if session_problem else None, options.agent_timeout_policy, merged
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
        reward_key=getattr(args, "reward_key", None),
    )
    mask_template_drift(sample, options.on_template_drift)
    sample.non_generation_time = non_generation_time(result, timings["agent"], merged)
    sample.metadata.update(
        session_id=session_id,
        session_server_instance_id=instance_id,
        session_server_url=handle.pool.urls[server],
        generate_timings=timings,
    )
    return GenerateFnOutput(samples=sample)


def _infra_without_session(sample: Any, detail: str, tokenizer: Any, handle: PoolHandle) -> Any:
    attempt_class = classify(None, SESSION_VANISHED, "score")
    return finish_sample(
        sample,
        merged=None,
        result=None,
        attempt_class=attempt_class,
        detail=detail,
        decode=lambda ids: tokenizer.decode(ids),
        fallback_token_id=_fallback_token_id(tokenizer),
        routing_shape=handle.routing_shape,
    )


generate.add_arguments = add_arguments  # type: ignore[attr-defined]
