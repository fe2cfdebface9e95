"""The session server's configuration: the one home of its defaults (sessions held, idle TTL, served name).

Owns `ServerConfig`, what `SessionCore` runs with; `rl360 session serve`'s flags, the service's
`ServiceOptions` and the rollout hooks (the model name agents ask for) take their defaults from
its fields. It imports nothing heavy, so the CLI can read the defaults without loading the
server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from rl360_ext.session.routing import RoutingShape


@dataclass
class ServerConfig:
    """How one session server runs."""

    r3: bool = False
    """Record routing replay (delta R3) rows per turn."""
    routing_shape: RoutingShape | None = None
    """(layers, top_k, num_experts); required with R3."""
    history_mismatch: Literal["fork", "reject"] = "fork"
    """When an agent's history is not an append: fork (new segment) or reject (409)."""
    max_sessions: int = 4096
    """Sessions held at once; a create beyond it is refused."""
    idle_ttl_s: float = 7200.0
    """Drop sessions idle this many seconds."""
    model_name: str = "rl360-policy"
    """Model name in replies and /v1/models; the name rl360's agent function asks for."""
    template_facts: dict[str, Any] = field(default_factory=dict)
    """What the template checker found, reported with every session."""
    template_append_only: bool = True
    """False only when started with --allow-non-append-only."""

    def __post_init__(self) -> None:
        if self.history_mismatch not in ("fork", "reject"):
            raise ValueError(f"history_mismatch must be fork or reject, got {self.history_mismatch!r}")
        if self.r3 and self.routing_shape is None:
            raise ValueError("R3 needs the routing shape (layers, top_k, num_experts)")
        if self.max_sessions < 1 or self.idle_ttl_s <= 0:
            raise ValueError("max_sessions must be >= 1 and idle_ttl_s > 0")
