"""The agent function: one Harbor `/run` per attempt, returning reward provenance, never a made-up reward.

Owns Miles' agent-function contract (`async def run(base_url, prompt, request_kwargs, metadata,
**kwargs) -> dict | None` and `async def abort(args)`, as Miles' `agentic_tool_call.generate`
and rl360's generate hook call them): building the `/run` body, the client-side deadline, the
bearer token, and mapping the answer (or its absence) to the metadata dict every rl360 hook
reads. It does not run trials (the rl360 Harbor server does) or decide validity: the server's
answer carries its verdict (`attempt_class`), read here with `rl360_ext.outcomes.verdict.
attempt_class`, never classified again; the only causes this module names are the client's own
(`Cause.CLIENT_DEADLINE`, `Cause.TRANSPORT_ERROR`, `Cause.RUN_REJECTED`, `Cause.NO_SANDBOX` and
`Cause.SANDBOX_LOST` for a replica that refused the connection or went away mid-run (a refused
attempt first moves to every other live replica: nothing ran), and
`Cause.HARBOR_INTERNAL_ERROR` for a server that answered 500 or no JSON, and
`Cause.TASK_QUARANTINED` for a task on the `--rl360-quarantine-file` of `rl360 tasks audit`, or
on the live list the training-time tracker writes next to it (`quarantine_live.json`,
`rl360_ext.tasks.tracker`): that attempt is not run, and its sample is masked like any
infrastructure failure, never scored 0).
It does not touch sessions or samples (the generate hook does).

Several Harbor /run servers (a `rl360_ext.harbor.pool.HarborPool`'s replicas) are given as a
comma-separated URL list; each attempt goes to the replica its image group pins
(`metadata["image_group"]`, else the task), or to the least-loaded one
(`rl360_ext.rollout.harbor_routing.HarborRouter`, one per URL list in this process).

Configuration is an `rl360_ext.rollout.config.AgentConfig`: the generate hook passes the one it
read from its flags (`run(..., rl360_config=...)`); called without one (Miles' stock generate, which
hands the agent function no args), `run` reads `AgentConfig.from_env()`, the RL360_* variables.
`abort(args)` reads `AgentConfig.from_args(args)`. No configuration is kept in module state.

Deadline: the request carries the client's remaining deadline (`metadata["deadline_s"]` when the
generate hook set it, else the configured deadline), and the client waits that long plus
`client_margin_s`. The server subtracts its own margins from the same number, so a healthy server
always answers first; a server that does not is an infrastructure failure ("client_deadline").
A transport failure is "transport_error". Neither ever carries a reward: upstream's example
scores both as 0.0, which is exactly the bug this package exists to fix.

Evaluation: Miles hands an agent function no `evaluation` flag (31f1ca96,
`miles/rollout/generate_hub/agentic_tool_call.py:75-80` passes base_url, prompt, request_kwargs
and metadata only); rl360's generate hook sets `metadata["evaluation"] = True` for an eval
attempt (Miles' `GenerateFnInput.evaluation`), and an eval dataset's `metadata_overrides` can set
it under the stock generate. An eval attempt runs exactly as a training one (the request kwargs
are already the eval dataset's sampling params, the session stays the model endpoint and what
`abort` flushes), and its answer says `evaluation: True` so every reader tells eval from training.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from rl360_ext.errors import Rl360Error
from rl360_ext.outcomes.attribution import (
    ATTRIBUTED_TO,
    EVIDENCE,
    Attribution,
    Control,
    Evidence,
    Phase,
    as_attribution,
)
from rl360_ext.outcomes.causes import CLIENT_CAUSES, FAILURE_TO_INFRA, Cause, infra_class
from rl360_ext.outcomes.provenance import ATTEMPT_CLASS, FAILURE_CAUSE, PHASE_TIMINGS, REWARD_SOURCE, TIMELINE
from rl360_ext.outcomes.verdict import attempt_class
from rl360_ext.rollout.config import AgentConfig, flag_name
from rl360_ext.rollout.harbor_routing import HarborRouter
from rl360_ext.tasks.health import read_quarantine
from rl360_ext.tasks.tracker import LIVE_QUARANTINE_FILE

logger = logging.getLogger(__name__)

DEADLINE_KEY = "deadline_s"  # metadata key the generate hook sets to the remaining deadline
IMAGE_GROUP_KEY = "image_group"  # optional metadata key: the task's image group, for replica pinning
AGENT_CONFIG_KWARG = "rl360_config"  # keyword the generate hook passes its AgentConfig as
EVALUATION_KEY = "evaluation"  # metadata key: True for an eval attempt (Miles' evaluation=True)
MESSAGE_LIMIT = 2000


class AgentConfigError(Rl360Error, ValueError):
    """The caller's configuration or data is wrong for every attempt alike (no Harbor URL, no task key)."""


# Session-server instance ids of this process's pools (state, not configuration): the generate
# hook registers them when it starts a pool, `abort` flushes their trials.
_instance_ids: set[str] = set()
_routers: dict[tuple[str, ...], HarborRouter] = {}  # runtime state: in-flight counts, down marks


def register_instance_ids(instance_ids: list[str] | tuple[str, ...] | set[str]) -> None:
    """Session-server instance ids whose trials `abort` flushes (the generate hook registers its pool's)."""
    _instance_ids.update(instance_ids)


def forget_instance_ids(instance_ids: list[str] | tuple[str, ...] | set[str]) -> None:
    _instance_ids.difference_update(instance_ids)


# ---- pure parts ---------------------------------------------------------------------------------


def build_run_body(
    settings: AgentConfig, base_url: str, request_kwargs: Mapping[str, Any], metadata: Mapping[str, Any]
) -> dict[str, Any]:
    """The `/run` body for one attempt. Raises AgentConfigError naming a missing or bad metadata key."""
    task = metadata.get(settings.task_key)
    if not isinstance(task, str) or not task:
        raise AgentConfigError(
            f"metadata[{settings.task_key!r}] must name the Harbor task (a path relative to the "
            f"server's tasks root), got {task!r}; set --rl360-task-key to the key your dataset uses"
        )
    deadline_s = metadata.get(DEADLINE_KEY, settings.deadline_s)
    if isinstance(deadline_s, bool) or not isinstance(deadline_s, int | float) or not deadline_s > 0:
        raise AgentConfigError(
            f"metadata[{DEADLINE_KEY!r}] must be a positive number of seconds, got {deadline_s!r}"
        )
    body: dict[str, Any] = {
        "task": task,
        "deadline_s": float(deadline_s),
        "base_url": base_url.rstrip("/") + "/v1",
        "model": settings.model,
        "sampling_params": dict(request_kwargs),
    }
    for key in ("session_id", "session_server_instance_id", "max_seq_len"):
        if metadata.get(key) is not None:
            body[key] = metadata[key]
    if settings.agent is not None:
        body["agent"] = settings.agent
    return body


def _bounded(text: Any) -> str | None:
    if text is None:
        return None
    text = str(text)
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 15] + " ...[truncated]"


def _mapping(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def result_metadata(response: Mapping[str, Any], agent_timeout_policy: str = "score") -> dict[str, Any]:
    """The agent function's dict for a `/run` answer (HTTP 200): provenance, the server's verdict, timings.

    `reward` is kept only when the verdict is "valid"; otherwise it is None whatever the server said.
    """
    verdict = attempt_class(response, agent_timeout_policy=agent_timeout_policy)
    valid = verdict == "valid"
    failure_cause = response.get("failure_cause")
    attributed = as_attribution(response.get(ATTRIBUTED_TO))
    if attributed is None and not valid:
        attributed = Attribution.INFRASTRUCTURE  # a masked attempt the server gave no attribution
    return {
        "reward": response.get("reward") if valid else None,
        "rewards": response.get("rewards") if valid else None,
        REWARD_SOURCE: response.get("reward_source"),
        FAILURE_CAUSE: failure_cause,
        "exception_type": response.get("exception_type"),
        "exception_message": _bounded(response.get("exception_message")),
        ATTEMPT_CLASS: verdict,
        ATTRIBUTED_TO: None if attributed is None else attributed.value,
        EVIDENCE: _mapping(response.get(EVIDENCE)) or None,
        "exit_status": failure_cause or ("completed" if valid else "no_reward"),
        PHASE_TIMINGS: _mapping(response.get("phase_timings")),
        TIMELINE: _mapping(response.get("timeline")),
        "agent_metrics": _mapping(response.get("agent_metrics")),
        "placement": response.get("placement"),
        "trial_name": response.get("trial_name"),
        "transport_error": None,
        "client_deadline": False,
    }


def failure_metadata(
    cause: Cause, message: str, exception_type: str | None = None, elapsed_s: float | None = None
) -> dict[str, Any]:
    """The agent function's dict when no usable `/run` answer arrived: no reward, the client's cause
    (one of `CLIENT_CAUSES`; any other cause is the server's to give, so it is refused here)."""
    cause = Cause(cause)
    if cause not in CLIENT_CAUSES:
        raise ValueError(f"{cause!r} is not a client-side cause; the server's verdict carries it")
    return {
        "reward": None,
        "rewards": None,
        REWARD_SOURCE: None,
        FAILURE_CAUSE: cause.value,
        "exception_type": exception_type,
        "exception_message": _bounded(message),
        ATTEMPT_CLASS: infra_class(FAILURE_TO_INFRA.get(cause, cause)),
        ATTRIBUTED_TO: Attribution.INFRASTRUCTURE.value,
        EVIDENCE: Evidence(Phase.HOST, Control.RULE, signal=cause.value).as_json(),
        "exit_status": cause.value,
        PHASE_TIMINGS: {} if elapsed_s is None else {"client_wait": elapsed_s},
        TIMELINE: {},
        "agent_metrics": {},
        "placement": None,
        "trial_name": None,
        "transport_error": message if cause == Cause.TRANSPORT_ERROR else None,
        "client_deadline": cause == Cause.CLIENT_DEADLINE,
    }


def response_metadata(
    status_code: int, body: Any, agent_timeout_policy: str = "score", elapsed_s: float | None = None
) -> dict[str, Any]:
    """Map an HTTP answer of `/run` (status and decoded JSON body, or None) to the agent's dict."""
    if status_code == 200 and isinstance(body, Mapping):
        return result_metadata(body, agent_timeout_policy)
    if status_code == 200:
        return failure_metadata(
            Cause.HARBOR_INTERNAL_ERROR, f"/run answered 200 without a JSON object: {body!r}"
        )
    detail = body.get("detail", body) if isinstance(body, Mapping) else body
    message = f"/run answered HTTP {status_code}: {detail!r}"
    if 400 <= status_code < 500:
        return failure_metadata(Cause.RUN_REJECTED, message, elapsed_s=elapsed_s)
    if status_code == 500:
        return failure_metadata(Cause.HARBOR_INTERNAL_ERROR, message, elapsed_s=elapsed_s)
    return failure_metadata(Cause.TRANSPORT_ERROR, message, elapsed_s=elapsed_s)


def _transport_cause(exc: httpx.HTTPError) -> Cause:
    """A refused connection started no sandbox; a connection lost mid-run lost its sandbox."""
    if isinstance(exc, httpx.ConnectError):
        return Cause.NO_SANDBOX
    if isinstance(exc, httpx.ReadError | httpx.WriteError | httpx.RemoteProtocolError):
        return Cause.SANDBOX_LOST
    return Cause.TRANSPORT_ERROR


def _headers(settings: AgentConfig) -> dict[str, str]:
    return {"Authorization": f"Bearer {settings.harbor_token}"} if settings.harbor_token else {}


def _harbor_urls(settings: AgentConfig) -> tuple[str, ...]:
    urls = tuple(url.strip().rstrip("/") for url in (settings.harbor_url or "").split(",") if url.strip())
    if not urls:
        raise AgentConfigError(
            f"no Harbor /run server configured: pass {flag_name('harbor_url')} "
            "(or, under Miles' stock generate, set $RL360_HARBOR_URL)"
        )
    return urls


def harbor_router(settings: AgentConfig) -> HarborRouter:
    """The router over this configuration's Harbor replicas (one per URL list, kept for the process,
    so its in-flight counts and down marks span attempts)."""
    urls = _harbor_urls(settings)
    router = _routers.get(urls)
    if router is None:
        router = _routers[urls] = HarborRouter(urls)
    return router


def _image_group(settings: AgentConfig, metadata: Mapping[str, Any]) -> str:
    group = metadata.get(IMAGE_GROUP_KEY)
    return group if isinstance(group, str) and group else str(metadata.get(settings.task_key))


# ---- Miles' agent-function contract -------------------------------------------------------------


def _quarantined(settings: AgentConfig, task: str) -> dict[str, Any] | None:
    """The masked result for a task on the audit's quarantine list or on the live list the
    training-time tracker keeps next to it (`rl360_ext.tasks.tracker`), else None. Both reads are
    cached by each file's identity, size and mtime: per attempt, two stats and two lookups."""
    if settings.quarantine_file is None:
        return None
    source = Path(settings.quarantine_file)
    live = source.with_name(LIVE_QUARANTINE_FILE)
    try:
        found = read_quarantine(source).get(task)
        if found is None:
            # No live list: no task quarantined during training (yet, or any more).
            with contextlib.suppress(FileNotFoundError):
                found, source = read_quarantine(live).get(task), live
    except (OSError, ValueError) as exc:
        raise AgentConfigError(f"--rl360-quarantine-file: {exc}") from exc
    if found is None:
        return None
    why = ", ".join(found) or "no verdict"
    return failure_metadata(Cause.TASK_QUARANTINED, f"task {task!r} is quarantined ({why}) by {source}")


async def run(
    base_url: str,
    prompt: Any,
    request_kwargs: dict[str, Any],
    metadata: dict[str, Any],
    *,
    rl360_config: AgentConfig | None = None,
    **kwargs: Any,
) -> dict[str, Any] | None:
    """Run one attempt on the Harbor `/run` server; see the module docstring for the result.

    `base_url` is the session's URL without `/v1` (as Miles passes it). `prompt` is not sent:
    Harbor reads the task's own instruction. `rl360_config` is the generate hook's; None reads
    the environment. Raises AgentConfigError only for a caller error (no Harbor URL configured, no
    task in the metadata); every failure of the attempt is returned.
    """
    settings = rl360_config if rl360_config is not None else AgentConfig.from_env()
    router = harbor_router(settings)
    body = build_run_body(settings, base_url, request_kwargs, metadata)
    masked = _quarantined(settings, body["task"])
    result = masked if masked is not None else await _post_run(settings, router, body, metadata)
    if metadata.get(EVALUATION_KEY) is True:
        result[EVALUATION_KEY] = True
    return result


async def _post_run(
    settings: AgentConfig, router: HarborRouter, body: dict[str, Any], metadata: Mapping[str, Any]
) -> dict[str, Any]:
    """POST the body to the replica the attempt's image group pins; the answer as the agent's dict.

    A refused connection reached no server, so nothing ran: the attempt moves to the next live
    replica it has not tried, within the same client deadline. Only when every replica refused is
    it `infra:no_sandbox`. Any other failure is final (a sandbox may have run)."""
    limit_s = body["deadline_s"] + settings.client_margin_s
    started = time.monotonic()
    tried: list[str] = []
    refused: dict[str, Any] | None = None
    while True:
        with router.attempt(_image_group(settings, metadata), exclude=tried) as replica:
            spent_s = time.monotonic() - started
            if refused is not None and (replica is None or spent_s >= body["deadline_s"]):
                return refused
            assert replica is not None  # a first try always has one: a router has >= 1 replica
            tried.append(replica)
            url, left_s = replica + "/run", limit_s - spent_s
            sent = body if refused is None else {**body, "deadline_s": body["deadline_s"] - spent_s}
            try:
                async with asyncio.timeout(left_s):
                    async with httpx.AsyncClient(timeout=httpx.Timeout(left_s, connect=30.0)) as http:
                        response = await http.post(url, json=sent, headers=_headers(settings))
            except (TimeoutError, httpx.TimeoutException) as exc:
                elapsed = time.monotonic() - started
                message = f"no answer from {url} within the client deadline ({limit_s:.1f}s incl. margin)"
                logger.warning("rl360 agent: %s (task %s)", message, body["task"])
                return failure_metadata(Cause.CLIENT_DEADLINE, message, type(exc).__name__, elapsed)
            except httpx.HTTPError as exc:
                elapsed = time.monotonic() - started
                cause = _transport_cause(exc)
                if cause != Cause.TRANSPORT_ERROR:
                    router.mark_down(replica)
                message = f"{type(exc).__name__} talking to {url}: {exc}"
                logger.warning("rl360 agent: %s (task %s)", message, body["task"])
                failure = failure_metadata(cause, message, type(exc).__name__, elapsed)
                if cause != Cause.NO_SANDBOX:
                    return failure
                refused = failure
                continue
        break
    elapsed = time.monotonic() - started
    try:
        decoded: Any = response.json()
    except ValueError:
        decoded = response.text[:MESSAGE_LIMIT]
    result = response_metadata(response.status_code, decoded, settings.agent_timeout_policy, elapsed)
    if response.status_code != 200:
        logger.warning("rl360 agent: %s (task %s)", result["exception_message"], body["task"])
    return result


async def abort(args: Any) -> None:
    """Flush this process's trials on the Harbor server (Miles calls it when a rollout is aborted).

    Flushes every session-server instance id the generate hook registered, plus Miles' own
    `args.session_server_instance_id(s)` when set (stock `agentic_tool_call.generate`). The
    Harbor URL and token come from `args` (rl360's flags), or the environment without them.
    """
    settings = AgentConfig.from_args(args)
    if not settings.harbor_url:
        return
    ids = set(_instance_ids)
    if getattr(args, "session_server_instance_id", None):
        ids.add(str(args.session_server_instance_id))
    ids.update(str(v) for v in (getattr(args, "session_server_instance_ids", None) or {}).values())
    if not ids:
        return
    targets = [(url + "/flush", i) for url in _harbor_urls(settings) for i in sorted(ids)]
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0, connect=10.0)) as http:
        answers = await asyncio.gather(
            *(
                http.post(url, json={"session_server_instance_id": i}, headers=_headers(settings))
                for url, i in targets
            ),
            return_exceptions=True,
        )
    for (url, instance_id), answer in zip(targets, answers, strict=True):
        if isinstance(answer, BaseException) or answer.status_code != 200:
            logger.warning("rl360 agent: flushing instance %s at %s failed: %r", instance_id, url, answer)
