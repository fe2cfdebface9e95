"""Configuration of rl360's rollout hooks: one dataclass per component, the single home of each default.

Owns `AgentConfig` (the agent function, `rl360_ext.rollout.agent`: how it reaches the Harbor /run
server and what it asks for), `SessionPoolConfig` (the generate hook's session servers; also the
identity of a pool), `GenerateConfig` (the generate hook: both, plus the Miles flags it reads)
and `MetricsConfig` (the rollout-metrics hook); the training-time task-health tracker's flags
derive from `rl360_ext.tasks.tracker.TrackerConfig` (`tracker_config`).
Every field carries its documentation in `metadata["help"]`; `add_arguments` derives the
`--rl360-<field>` flags from the fields (name, type, choices, help and the default it shows), so
a default is written once, here.

Channels, in the order they win:
- Miles' args: the generate hook (`GenerateConfig.from_args`), the abort hook and the reward hook
  read their flags from the `args` Miles hands them, on every call; nothing is kept between calls
  or hooks in module state.
- The environment, only where Miles gives no other channel: Miles' stock
  `agentic_tool_call.generate` calls the agent function with `(base_url, prompt,
  request_kwargs, metadata)` and never hands it `args`, and there rl360's flags do not exist
  (Miles lets only the generate function add flags). So `AgentConfig.from_env` reads
  `RL360_<FIELD>` (RL360_HARBOR_URL, RL360_HARBOR_TOKEN, RL360_DEADLINE_S, RL360_CLIENT_MARGIN_S,
  RL360_AGENT, RL360_TASK_KEY, RL360_MODEL, RL360_AGENT_TIMEOUT_POLICY) for that path, and
  `MetricsConfig.from_args` (and `tracker_config`) fall back to RL360_METRICS_PATH /
  RL360_METRICS_ATTEMPTS (RL360_QUARANTINE_VACUOUS_ATTEMPTS, ...) for a flag that is not there.
  Under rl360's generate hook the agent's environment is read for one field only, the bearer
  token, so a secret can stay out of the command line.
"""

from __future__ import annotations

import argparse
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, TypeVar

from rl360_ext.outcomes.verdict import AGENT_TIMEOUT_POLICIES
from rl360_ext.session.options import DEFAULT_MODEL_NAME
from rl360_ext.tasks.tracker import TrackerConfig

_Config = TypeVar("_Config")
FLAG_PREFIX = "rl360"
ENV_PREFIX = "RL360_"


def _doc(help: str, default: Any = MISSING, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


@dataclass(frozen=True)
class AgentConfig:
    """How rl360's agent function reaches the Harbor /run server and what it asks for."""

    harbor_url: str | None = _doc(
        "Harbor /run server base URL (required); several, comma-separated, for a HarborPool's replicas.", None
    )
    harbor_token: str | None = _doc("Bearer token for the Harbor /run server (or $RL360_HARBOR_TOKEN).", None)
    deadline_s: float = _doc("Client deadline per attempt, seconds; the server plans within it.", 3600.0)
    client_margin_s: float = _doc(
        "Extra seconds the client waits past the deadline it sends the server.", 5.0
    )
    agent: str | None = _doc("Harbor agent for /run (default: the server's).", None)
    task_key: str = _doc("Sample.metadata key holding the task path under the Harbor tasks root.", "task")
    model: str = _doc("Model name the agent asks the session server for.", DEFAULT_MODEL_NAME)
    agent_timeout_policy: str = _doc(
        "Agent timeouts: 'score' (the verifier's reward counts) or 'mask' (infra).",
        "score",
        choices=AGENT_TIMEOUT_POLICIES,
    )
    quarantine_file: str | None = _doc(
        "quarantine.json of `rl360 tasks audit`: its tasks are not run, their attempts masked "
        "(infra:task_quarantined, never a 0 reward).",
        None,
    )

    def __post_init__(self) -> None:
        if not self.deadline_s > 0:
            raise ValueError(f"--rl360-deadline-s (deadline_s) must be > 0, got {self.deadline_s!r}")
        if self.client_margin_s < 0:
            raise ValueError(
                f"--rl360-client-margin-s (client_margin_s) must be >= 0, got {self.client_margin_s!r}"
            )
        if self.agent_timeout_policy not in AGENT_TIMEOUT_POLICIES:
            raise ValueError(
                f"--rl360-agent-timeout-policy (agent_timeout_policy) must be one of "
                f"{AGENT_TIMEOUT_POLICIES}, got {self.agent_timeout_policy!r}"
            )
        if not self.task_key:
            raise ValueError("--rl360-task-key (task_key) must be a non-empty metadata key")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AgentConfig:
        """The configuration Miles' stock generate path can give: `RL360_<FIELD>` over the defaults."""
        env = os.environ if environ is None else environ
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        for spec in fields(cls):
            name = env_name(spec.name)
            text = env.get(name)
            if text:
                values[spec.name] = _parse(_scalar_type(hints[spec.name]), text, f"${name}")
        return cls(**values)

    @classmethod
    def from_args(cls, args: Any, environ: Mapping[str, str] | None = None) -> AgentConfig:
        """The flags in Miles' args over the defaults; the token may come from $RL360_HARBOR_TOKEN.
        Args without rl360's flags (Miles' stock generate registered none) mean `from_env`."""
        if not hasattr(args, flag_dest("harbor_url")):
            return cls.from_env(environ)
        values = _set_flags(cls, args)
        if values.get("harbor_token") is None:
            env = os.environ if environ is None else environ
            values["harbor_token"] = env.get(env_name("harbor_token")) or None
        return cls(**values)


@dataclass(frozen=True)
class SessionPoolConfig:
    """The generate hook's session servers; two hooks with equal configs share one pool."""

    session_servers: int = _doc("Session servers (Ray actors).", 1)
    session_backend: str | None = _doc(
        "SGLang-protocol URL the session servers use (default http://<sglang-router-ip>:<port>).", None
    )
    session_host: str | None = _doc(
        "Address the session servers bind (default: the Ray node's IP; 127.0.0.1 on one machine).", None
    )
    tokenizer: str | None = _doc("Tokenizer directory (default --hf-checkpoint).", None)
    chat_template: str | None = _doc(
        "Session servers' chat template: unset (the tokenizer's), 'fixed', or a template file.", None
    )
    r3: bool | None = _doc("Record routing replay (default: --use-rollout-routing-replay).", None)
    top_logprobs_num: int = _doc(
        "Top-k log-probs per generated token the session servers ask (SGLang's top_logprobs_num) and "
        "keep in the merged sample, for the trainer's top-k parity metrics; 0: none.",
        0,
    )

    def __post_init__(self) -> None:
        if self.session_servers < 1:
            raise ValueError(f"--rl360-session-servers must be >= 1, got {self.session_servers}")
        if self.top_logprobs_num < 0:
            raise ValueError(f"--rl360-top-logprobs-num must be >= 0, got {self.top_logprobs_num}")

    def resolved(self, args: Any) -> SessionPoolConfig:
        """Unset fields filled from Miles' own flags; a ValueError names the flag still missing."""
        backend = self.session_backend
        if backend is None:
            ip, port = getattr(args, "sglang_router_ip", None), getattr(args, "sglang_router_port", None)
            if not ip or not port:
                raise ValueError(
                    "--rl360-session-backend is required when Miles' --sglang-router-ip and "
                    "--sglang-router-port are unset"
                )
            backend = f"http://{ip}:{port}"
        tokenizer = self.tokenizer or getattr(args, "hf_checkpoint", None)
        if not tokenizer:
            raise ValueError("--rl360-tokenizer is required when Miles' --hf-checkpoint is unset")
        r3 = self.r3 if self.r3 is not None else bool(getattr(args, "use_rollout_routing_replay", False))
        return replace(self, session_backend=str(backend), tokenizer=str(tokenizer), r3=bool(r3))


TEMPLATE_DRIFT_POLICIES = ("keep", "mask")


@dataclass(frozen=True)
class TemplateDriftConfig:
    """What the generate hook does with a trajectory whose tokens drift from the canonical render."""

    on_template_drift: str = _doc(
        "Trajectories whose tokens drift from the canonical render: 'keep' (counted in "
        "tito/render_mismatch_frac) or 'mask' (zero loss mask).",
        "keep",
    )

    def __post_init__(self) -> None:
        if self.on_template_drift not in TEMPLATE_DRIFT_POLICIES:
            raise ValueError(
                f"--rl360-on-template-drift must be one of {TEMPLATE_DRIFT_POLICIES}, "
                f"got {self.on_template_drift!r}"
            )


@dataclass(frozen=True)
class GenerateConfig:
    """Everything the generate hook reads from Miles' args for one attempt."""

    agent: AgentConfig
    """How the agent function reaches the Harbor /run server."""
    pool: SessionPoolConfig
    """The hook's session servers."""
    max_seq_len: int | None = None
    """Miles' --max-seq-len."""
    agent_function_path: str | None = None
    """Miles' --custom-agent-function-path."""
    on_template_drift: str = TemplateDriftConfig.on_template_drift
    """`TemplateDriftConfig.on_template_drift`."""

    @classmethod
    def from_args(cls, args: Any) -> GenerateConfig:
        """The hook's configuration from Miles' args; a ValueError names the flag missing or wrong."""
        agent = AgentConfig.from_args(args)
        if not agent.harbor_url:
            raise ValueError("--rl360-harbor-url is required")
        pool = SessionPoolConfig(**_set_flags(SessionPoolConfig, args)).resolved(args)
        max_seq_len = getattr(args, "max_seq_len", None)
        return cls(
            agent=agent,
            pool=pool,
            max_seq_len=None if max_seq_len is None else int(max_seq_len),
            agent_function_path=getattr(args, "custom_agent_function_path", None),
            on_template_drift=TemplateDriftConfig(**_set_flags(TemplateDriftConfig, args)).on_template_drift,
        )


@dataclass(frozen=True)
class MetricsConfig:
    """The rollout-metrics hook (`rl360_ext.rollout.metrics.log_rollout_metrics`)."""

    metrics_path: str | None = _doc("Per-step rl360 metrics JSONL (no file when unset).", None)
    metrics_attempts: bool = _doc("Also write one JSONL line per attempt.", True)

    @classmethod
    def from_args(cls, args: Any, environ: Mapping[str, str] | None = None) -> MetricsConfig:
        """Each field from its flag in Miles' args, else `RL360_<FIELD>`, else its default. The
        environment is for Miles' stock generate, where rl360's flags are not registered."""
        return from_args_or_env(cls, args, environ)


def tracker_config(args: Any, environ: Mapping[str, str] | None = None) -> TrackerConfig:
    """The training-time task-health tracker's thresholds (`rl360_ext.tasks.tracker.TrackerConfig`,
    whose fields carry their flags' help), read as `MetricsConfig.from_args` reads its fields; a
    ValueError names the field that is wrong."""
    return from_args_or_env(TrackerConfig, args, environ)


def from_args_or_env(cls: type[_Config], args: Any, environ: Mapping[str, str] | None = None) -> _Config:
    """Each field of `cls` from its flag in Miles' args, else `RL360_<FIELD>`, else its default."""
    env = os.environ if environ is None else environ
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for spec in fields(cls):
        value = getattr(args, flag_dest(spec.name), None)
        text = env.get(env_name(spec.name))
        if value is None and text:
            value = _parse(_scalar_type(hints[spec.name]), text, f"${env_name(spec.name)}")
        if value is not None:
            values[spec.name] = value
    return cls(**values)


# ---- flags derived from the fields ------------------------------------------------------------


def flag_dest(name: str) -> str:
    return f"{FLAG_PREFIX}_{name}"


def flag_name(name: str) -> str:
    return f"--{FLAG_PREFIX}-{name.replace('_', '-')}"


def env_name(name: str) -> str:
    return f"{ENV_PREFIX}{name.upper()}"


def add_dataclass_arguments(group: Any, cls: type) -> None:
    """One `--rl360-<field>` per field of `cls`, default None (unset: the field's default applies)."""
    hints = typing.get_type_hints(cls)
    for spec in fields(cls):
        kind = _scalar_type(hints[spec.name])
        help_text = spec.metadata["help"]
        if spec.default is not None and spec.default is not MISSING:
            help_text = f"{help_text} Default: {spec.default}."
        options: dict[str, Any] = {"default": None, "dest": flag_dest(spec.name), "help": help_text}
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif "choices" in spec.metadata:
            options["choices"] = spec.metadata["choices"]
        else:
            options["type"] = kind
        group.add_argument(flag_name(spec.name), **options)


def _set_flags(cls: type, args: Any) -> dict[str, Any]:
    """The fields of `cls` whose flag is set (not None) in `args`."""
    values = {spec.name: getattr(args, flag_dest(spec.name), None) for spec in fields(cls)}
    return {name: value for name, value in values.items() if value is not None}


def _scalar_type(annotation: Any) -> type:
    """`str | None` -> str, `float` -> float."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        (annotation,) = [a for a in typing.get_args(annotation) if a is not type(None)]
    return annotation


def _parse(kind: type, text: str, where: str) -> Any:
    if kind is bool:
        return text.strip().lower() not in ("0", "false", "no", "off")
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{where} must be a {kind.__name__}, got {text!r}") from None
