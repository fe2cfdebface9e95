"""Which Harbor agents a /run server runs, fixed at start, and how they are pointed at the session.

Owns the server's agent table (`AgentTable`): the names clients may put in `/run`'s `agent`,
each bound when the server starts to a Harbor built-in (the defaults: `oracle`, `nop`,
`terminus-2`) or to a `module.path:Class` the operator named with `--agent NAME=module:Class`
(imported and checked then). A request's `agent` is only ever looked up in that table: no
client-named module is imported. Also owns turning an entry plus the request's model settings
into Harbor's `AgentConfig`: utility agents (oracle, nop, and import-path classes that declare
`MODEL_FREE = True`) get no model; terminus-2 gets
`openai/<model>` through LiteLLM with `api_base` = the session's base URL, the request's
temperature/top_p/max tokens, its context length, and no terminal recording; import-path agents
(such as rl360's demo agent) get the rl360 kwargs `api_base`, `api_model`, `sampling_params`,
`max_seq_len`. A request's `agent_kwargs` win over rl360's kwargs but may not set a key Harbor
passes itself (`HARBOR_AGENT_KWARGS`: logs_dir, model_name, ...). It does not own running agents.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from harbor.agents.base import BaseAgent
from harbor.models.agent.name import AgentName
from harbor.models.trial.config import AgentConfig
from harbor.utils.import_path import import_class

from rl360_ext.errors import Rl360Error

UTILITY_AGENTS = frozenset({AgentName.ORACLE.value, AgentName.NOP.value})
TERMINUS_2 = AgentName.TERMINUS_2.value
DEFAULT_AGENTS = (AgentName.ORACLE.value, AgentName.NOP.value, TERMINUS_2)
# An agent class with `MODEL_FREE = True` (like the audit's canaries) runs like oracle and nop:
# requests need no base_url or model, and it gets only the request's agent_kwargs.
MODEL_FREE_ATTRIBUTE = "MODEL_FREE"
PLACEHOLDER_API_KEY = "rl360-session"  # session servers do not check keys; LiteLLM insists on one
# Keys Harbor's agent factory and trial pass to an agent's constructor themselves: a client
# value would collide (TypeError) or silently redirect Harbor (logs_dir, load_trajectory, ...).
HARBOR_AGENT_KWARGS = frozenset(
    {name for name in inspect.signature(BaseAgent.__init__).parameters if name not in ("self", "kwargs")}
    | {"task_dir", "trial_paths", "agent_timeout_sec", "override_setup_timeout_sec", "registry_spec"}
)


class UnknownAgent(Rl360Error, ValueError):
    """An `--agent` given at start is neither a Harbor agent name nor an importable agent class."""


@dataclass(frozen=True)
class AgentEntry:
    """One agent a server runs: the name clients use and what Harbor builds for it."""

    name: str
    harbor_name: str | None = None
    import_path: str | None = None
    model_free: bool = False  # an import-path agent whose class says `MODEL_FREE = True`

    @property
    def needs_model(self) -> bool:
        return not self.model_free and self.harbor_name not in UTILITY_AGENTS


def _import_checked(path: str) -> type[BaseAgent]:
    try:
        return import_class(path, base=BaseAgent, label="agent")
    except (ValueError, TypeError, ImportError) as exc:
        raise UnknownAgent(f"agent {path!r} cannot be imported: {exc}") from exc


def parse_entry(spec: str) -> AgentEntry:
    """An entry from an `--agent` value: NAME=module.path:Class, a Harbor agent name, or
    module.path:Class (named by its path). Imports and checks the class now."""
    name, sep, target = spec.partition("=")
    if not sep:
        name = target = spec
    if not name or not target:
        raise UnknownAgent(f"--agent expects NAME=module.path:Class or a Harbor agent name, got {spec!r}")
    if ":" in target:
        model_free = getattr(_import_checked(target), MODEL_FREE_ATTRIBUTE, False) is True
        return AgentEntry(name=name, import_path=target, model_free=model_free)
    if target not in AgentName.values():
        raise UnknownAgent(f"agent {target!r} is not a Harbor agent name or a module.path:Class")
    return AgentEntry(name=name, harbor_name=target)


class AgentTable:
    """The agents a server runs, fixed when it starts; `default` is used when a request names none."""

    def __init__(self, specs: Iterable[str] = (), default: str | None = None) -> None:
        entries = [parse_entry(name) for name in DEFAULT_AGENTS]
        given = [parse_entry(spec) for spec in specs]
        self._entries = {entry.name: entry for entry in [*entries, *given]}
        self.default = default or (given[0].name if given else AgentName.ORACLE.value)
        if self.default not in self._entries:
            raise UnknownAgent(f"default agent {self.default!r} is not one of {self.names}")

    @property
    def names(self) -> list[str]:
        return sorted(self._entries)

    def get(self, name: str | None) -> AgentEntry | None:
        """The entry for a request's `agent` (None: the default), or None when there is none."""
        return self._entries.get(self.default if name is None else name)


@dataclass(frozen=True)
class AgentModelConfig:
    """The model an attempt's agent talks to, from the /run request."""

    base_url: str | None
    """OpenAI-compatible base URL the agent's model calls go to."""
    model: str | None
    """Model name the agent asks for."""
    sampling_params: dict[str, Any]
    """SGLang-style sampling parameters (max_new_tokens, top_p, ...)."""
    max_seq_len: int | None
    """Longest sequence the model takes, in tokens (None: unknown)."""


def reserved_kwargs(extra_kwargs: dict[str, Any]) -> list[str]:
    """The keys of a request's agent_kwargs that Harbor sets itself."""
    return sorted(key for key in extra_kwargs if key in HARBOR_AGENT_KWARGS)


def _terminus_kwargs(settings: AgentModelConfig, max_turns: int | None) -> dict[str, Any]:
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
    entry: AgentEntry,
    settings: AgentModelConfig,
    max_turns: int | None,
    extra_kwargs: dict[str, Any],
    timeout_s: float,
    setup_timeout_s: float,
) -> AgentConfig:
    """Harbor's AgentConfig for one attempt; `extra_kwargs` (the request's agent_kwargs) win over
    rl360's kwargs. Raises ValueError for a reserved key or a model agent without a model."""
    if reserved := reserved_kwargs(extra_kwargs):
        raise ValueError(f"agent_kwargs may not set {', '.join(reserved)}: Harbor sets them itself")
    common: dict[str, Any] = {
        "override_timeout_sec": timeout_s,
        "override_setup_timeout_sec": setup_timeout_s,
    }
    if entry.import_path is not None:
        common["import_path"] = entry.import_path
    else:
        common["name"] = entry.harbor_name
    if not entry.needs_model:
        return AgentConfig(**common, kwargs=dict(extra_kwargs))
    if settings.base_url is None or settings.model is None:
        raise ValueError(f"agent {entry.name!r} needs base_url and model")
    if entry.harbor_name == TERMINUS_2:
        kwargs = _terminus_kwargs(settings, max_turns)
        return AgentConfig(**common, model_name=f"openai/{settings.model}", kwargs={**kwargs, **extra_kwargs})
    if entry.import_path is not None:
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
