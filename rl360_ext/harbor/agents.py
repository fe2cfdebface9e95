"""Which Harbor agent a /run attempt uses and how it is pointed at the session's OpenAI URL.

Owns turning an agent spec (a Harbor built-in name such as `oracle`, `nop`, `terminus-2`, or a
`module.path:Class` import path) plus the request's model settings into Harbor's `AgentConfig`.
Utility agents (oracle, nop) get no model. terminus-2 gets `openai/<model>` through LiteLLM with
`api_base` = the session's base URL, the request's temperature/top_p/max tokens, its context
length, and no terminal recording (no asciinema in a sandbox without network). Import-path agents
(such as rl360's demo agent) get the rl360 agent kwargs `api_base`, `api_model`,
`sampling_params`, `max_seq_len`. It does not own running agents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harbor.agents.base import BaseAgent
from harbor.models.agent.name import AgentName
from harbor.models.trial.config import AgentConfig
from harbor.utils.import_path import import_class

UTILITY_AGENTS = frozenset({AgentName.ORACLE.value, AgentName.NOP.value})
TERMINUS_2 = AgentName.TERMINUS_2.value
DEMO_AGENT = "rl360_ext.local.agents:BashToolAgent"
PLACEHOLDER_API_KEY = "rl360-session"  # session servers do not check keys; LiteLLM insists on one


class UnknownAgent(ValueError):
    """The agent spec is neither a Harbor agent name nor an importable `module.path:Class`."""


@dataclass(frozen=True)
class ModelSettings:
    base_url: str | None
    model: str | None
    sampling_params: dict[str, Any]
    max_seq_len: int | None


def validate_agent(spec: str) -> str:
    """The spec, if Harbor can build it; raises UnknownAgent naming what is wrong."""
    if ":" in spec:
        try:
            import_class(spec, base=BaseAgent, label="agent")
        except (ValueError, TypeError, ImportError) as exc:
            raise UnknownAgent(f"agent {spec!r} cannot be imported: {exc}") from exc
        return spec
    if spec not in AgentName.values():
        raise UnknownAgent(f"agent {spec!r} is not a Harbor agent name or a module.path:Class")
    return spec


def needs_model(spec: str) -> bool:
    return spec not in UTILITY_AGENTS


def _terminus_kwargs(settings: ModelSettings, max_turns: int | None) -> dict[str, Any]:
    params = settings.sampling_params
    call_kwargs = {key: params[key] for key in ("top_p", "top_k", "seed") if key in params}
    max_new = params.get("max_new_tokens", params.get("max_tokens"))
    if max_new is not None:
        call_kwargs["max_tokens"] = int(max_new)
    model_info: dict[str, Any] = {"input_cost_per_token": 0.0, "output_cost_per_token": 0.0}
    if settings.max_seq_len is not None:
        model_info["max_input_tokens"] = settings.max_seq_len
    if max_new is not None:
        model_info["max_output_tokens"] = int(max_new)
    kwargs: dict[str, Any] = {
        "api_base": settings.base_url,
        "llm_kwargs": {"api_key": PLACEHOLDER_API_KEY},
        "llm_call_kwargs": call_kwargs,
        "model_info": model_info,
        "record_terminal_session": False,
        "suppress_max_turns_warning": True,
    }
    if "temperature" in params:
        kwargs["temperature"] = float(params["temperature"])
    if max_turns is not None:
        kwargs["max_turns"] = max_turns
    return kwargs


def agent_config(
    spec: str,
    settings: ModelSettings,
    max_turns: int | None,
    extra_kwargs: dict[str, Any],
    timeout_s: float,
    setup_timeout_s: float,
) -> AgentConfig:
    """Harbor's AgentConfig for one attempt; `extra_kwargs` (the request's agent_kwargs) win."""
    is_import = ":" in spec
    common: dict[str, Any] = {
        "override_timeout_sec": timeout_s,
        "override_setup_timeout_sec": setup_timeout_s,
        ("import_path" if is_import else "name"): spec,
    }
    if not needs_model(spec):
        return AgentConfig(**common, kwargs=dict(extra_kwargs))
    if settings.base_url is None or settings.model is None:
        raise ValueError(f"agent {spec!r} needs base_url and model")
    if spec == TERMINUS_2:
        kwargs = _terminus_kwargs(settings, max_turns)
        return AgentConfig(**common, model_name=f"openai/{settings.model}", kwargs={**kwargs, **extra_kwargs})
    if is_import:
        kwargs = {
            "api_base": settings.base_url,
            "api_model": settings.model,
            "sampling_params": dict(settings.sampling_params),
            "max_seq_len": settings.max_seq_len,
        }
        if max_turns is not None:
            kwargs["max_turns"] = max_turns
        return AgentConfig(**common, kwargs={**kwargs, **extra_kwargs})
    return AgentConfig(
        **common,
        model_name=f"openai/{settings.model}",
        base_url=settings.base_url,
        kwargs=dict(extra_kwargs),
    )
