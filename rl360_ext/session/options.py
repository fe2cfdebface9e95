"""The session server's configuration: one dataclass, the single source of every default and flag help.

Owns `SessionServerConfig`, the one config of a session server (what `rl360 session serve`, the
Ray pool and the generate hook pass to build one). Each field's docstring is its help text and
`field(metadata=...)` names its CLI flag when that differs from the field name (`flag`) and its
lower bound (`min`); `rl360_ext.cli.session` derives the flags from here. `service.build_core`
resolves it (backend probes, template check, routing shape) into the `config.SessionCoreConfig`
the core runs with, which takes its defaults from here (`default_of`). It does not own building
or serving (`service.py`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HISTORY_MISMATCH_MODES = ("fork", "reject")
SAMPLES_WIRES = ("v1", "v2")  # Miles' --use-session-server versions POST /samples answers
DEFAULT_MODEL_NAME = "rl360-policy"  # replies' model name when neither the flag nor the backend names one


@dataclass
class SessionServerConfig:
    """One session server's configuration, as given (flags, the pool, the generate hook)."""

    backend_url: str = field(metadata={"flag": "backend"})
    """SGLang-protocol base URL: an engine or the SMG gateway."""

    tokenizer_dir: str = field(metadata={"flag": "tokenizer"})
    """Tokenizer directory (with its chat template)."""

    r3: bool = False
    """Record routing replay (delta R3) rows per turn."""

    history_mismatch: str = "fork"
    """When an agent's history is not an append: fork (new segment) or reject (409)."""

    allow_non_append_only: bool = False
    """Start even if the template checker rejects the template."""

    max_sessions: int = field(default=4096, metadata={"min": 1})
    """Sessions held at once."""

    idle_ttl_s: float = field(default=7200.0, metadata={"flag": "idle-ttl", "min": 0.001})
    """Drop sessions idle this many seconds."""

    model_name: str | None = None
    """Model name in replies and /v1/models (default: the backend's /v1/models id, as SGLang names it)."""

    routing_layers: int | None = field(default=None, metadata={"flag": "r3-layers", "min": 1})
    """MoE layers (default: config.json, /model_info)."""

    routing_top_k: int | None = field(default=None, metadata={"flag": "r3-top-k", "min": 1})
    """Experts per token (default: as above)."""

    routing_experts: int | None = field(default=None, metadata={"flag": "r3-experts", "min": 1})
    """Experts per layer (default: as above)."""

    engine_timeout_s: float = field(default=3600.0, metadata={"flag": "engine-timeout", "min": 0.001})
    """Seconds one /generate call (connecting included) may take before the turn fails as engine_timeout."""

    public_url: str | None = None
    """Base URL agents reach this server at (default: the request's)."""

    chat_template: str | None = None
    """Template to render with: a .jinja file, or 'fixed' for rl360's fixed template."""

    max_request_bytes: int = field(default=8 * 1024 * 1024, metadata={"min": 1})
    """Largest request body accepted, in bytes; a larger one is answered 413 before it is parsed."""

    max_context_tokens: int | None = field(default=None, metadata={"min": 1})
    """Longest prompt the engine takes, in tokens (default: the backend's /v1/models max_model_len, as
    SGLang reports it; unknown: no bound but the body cap). A request whose new text is longer than
    this times --max-chars-per-token is refused with a 400 before it is tokenized, and a prompt
    longer than this after tokenizing is refused before it is sent."""

    max_chars_per_token: int | None = field(default=None, metadata={"min": 1})
    """Most characters one token covers (default: the longest token in the tokenizer's vocabulary)."""

    vocab_size: int | None = field(default=None, metadata={"min": 1})
    """Token ids the model can emit (default: max of the tokenizer's size and config.json's vocab_size)."""

    api_key: str | None = field(default=None, repr=False)
    """Bearer token every route but /health and /metrics requires (SGLang's --api-key style)."""

    api_key_file: str | None = None
    """File holding the bearer token (keeps it out of the process list); wins over --api-key."""

    instance_id: str | None = None
    """session_server_instance_id that /health reports (Miles' per-server id; default: a random one)."""

    samples_wire: str = "v1"
    """Miles' --use-session-server version POST /samples answers: v1 (one sample), v2 (one per branch)."""

    top_logprobs_num: int = field(default=0, metadata={"min": 0})
    """Top-k log-probs to ask per generated token (SGLang's top_logprobs_num) and keep in the merged
    sample (wire version 4); 0: none (opt-in)."""

    def __post_init__(self) -> None:
        if self.history_mismatch not in HISTORY_MISMATCH_MODES:
            raise ValueError(f"history_mismatch must be fork or reject, got {self.history_mismatch!r}")
        if self.samples_wire not in SAMPLES_WIRES:
            raise ValueError(f"samples_wire must be v1 or v2, got {self.samples_wire!r}")
        if self.instance_id is not None and not self.instance_id:
            raise ValueError("instance_id must not be empty (leave it unset for a random one)")

    def bearer_token(self) -> str | None:
        """The token to require: the file's first line (stripped) when given, else `api_key`."""
        if self.api_key_file is None:
            return self.api_key or None
        token = Path(self.api_key_file).read_text().strip()
        if not token:
            raise ValueError(f"--api-key-file: {self.api_key_file} is empty")
        return token


def default_of(name: str) -> Any:
    """The default of one `SessionServerConfig` field (so other config classes do not retype it)."""
    (found,) = (f for f in dataclasses.fields(SessionServerConfig) if f.name == name)
    if found.default is dataclasses.MISSING:
        raise KeyError(f"SessionServerConfig.{name} has no default")
    return found.default
