"""What one session server's core runs with: `SessionCoreConfig`, resolved from `SessionServerConfig`.

Owns the run-time configuration `SessionCore` takes: not a second config of the server but what
`service.build_core` resolves `rl360_ext.session.options.SessionServerConfig` (the server's one
config, the source of each default and of the `rl360 session serve` flags) into. Every field
that is also in `SessionServerConfig` takes its default from there (`default_of`), so nothing is
typed twice; the rest (routing shape, template facts, the instance id) is what the service finds
out at start. It imports nothing heavy, so the CLI and the rollout hooks can read the defaults
without loading the server.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from rl360_ext.session.options import DEFAULT_MODEL_NAME, HISTORY_MISMATCH_MODES, SAMPLES_WIRES, default_of

if TYPE_CHECKING:
    from rl360_ext.session.samples.routing import RoutingShape


@dataclass
class SessionCoreConfig:
    """How one session server's core runs (resolved from its `SessionServerConfig` at start)."""

    r3: bool = default_of("r3")
    """Record routing replay (delta R3) rows per turn."""
    routing_shape: RoutingShape | None = None
    """(layers, top_k, num_experts); required with R3."""
    history_mismatch: Literal["fork", "reject"] = default_of("history_mismatch")
    """When an agent's history is not an append: fork (new segment) or reject (409)."""
    max_sessions: int = default_of("max_sessions")
    """Sessions held at once; a create beyond it is refused."""
    idle_ttl_s: float = default_of("idle_ttl_s")
    """Drop sessions idle this many seconds."""
    model_name: str = DEFAULT_MODEL_NAME
    """Model name in replies and /v1/models (the service sets the flag's or the backend's)."""
    template_facts: dict[str, Any] = field(default_factory=dict)
    """What the template checker found, reported with every session."""
    template_append_only: bool = True
    """False only when started with --allow-non-append-only."""
    vocab_size: int | None = None
    """Token ids the engine may return; None: len(tokenizer)."""
    instance_id: str = field(default_factory=lambda: secrets.token_hex(16))
    """One per server process (/health's session_server_instance_id): a session id minted by another
    instance is a lost session, not a typo."""
    samples_wire: Literal["v1", "v2"] = default_of("samples_wire")
    """What POST /samples answers: Miles' v1 wire (one sample) or v2 (one sample per branch)."""
    top_logprobs_num: int = default_of("top_logprobs_num")
    """Top-k log-probs asked per generated token and kept in the merged sample; 0: none."""
    max_context_tokens: int | None = default_of("max_context_tokens")
    """Longest prompt the engine takes; None: unknown (no bound but the body cap)."""
    max_chars_per_token: int | None = default_of("max_chars_per_token")
    """Most characters one token covers (the service sets the tokenizer's longest token)."""

    @property
    def max_text_chars(self) -> int | None:
        """The most characters of new text a turn may tokenize: a longer text cannot fit the context."""
        if self.max_context_tokens is None or self.max_chars_per_token is None:
            return None
        return self.max_context_tokens * self.max_chars_per_token

    def __post_init__(self) -> None:
        if self.history_mismatch not in HISTORY_MISMATCH_MODES:
            raise ValueError(f"history_mismatch must be fork or reject, got {self.history_mismatch!r}")
        if self.r3 and self.routing_shape is None:
            raise ValueError("R3 needs the routing shape (layers, top_k, num_experts)")
        if self.samples_wire not in SAMPLES_WIRES:
            raise ValueError(f"samples_wire must be v1 or v2, got {self.samples_wire!r}")
        if self.top_logprobs_num < 0:
            raise ValueError(f"top_logprobs_num must be >= 0, got {self.top_logprobs_num}")
        for name in ("max_context_tokens", "max_chars_per_token"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.max_sessions < 1 or self.idle_ttl_s <= 0:
            raise ValueError("max_sessions must be >= 1 and idle_ttl_s > 0")
