"""Duck-typed stand-ins for Miles' `Sample` (Miles is not on PyPI): the fields rl360 hooks read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rl360_ext.outcomes.provenance import ATTEMPT_CLASS, DOMAIN, PHASE_TIMINGS, REWARD_SOURCE


@dataclass
class DuckSample:
    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    tokens: list[int] = field(default_factory=lambda: [1, 2, 3, 4])
    response: str = "ok"
    response_length: int = 2
    reward: Any = None
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    rollout_routed_experts: Any = None
    remove_sample: bool = False
    status: str = "completed"
    metadata: dict[str, Any] = field(default_factory=dict)
    non_generation_time: float = 0.0


def valid(
    group: int | None, index: int, reward: float, domain: str | None = None, **metadata: Any
) -> DuckSample:
    meta = {ATTEMPT_CLASS: "valid", REWARD_SOURCE: "verifier", **metadata}
    if domain is not None:
        meta[DOMAIN] = domain
    meta.setdefault(PHASE_TIMINGS, {"agent": 1.5, "verifier": 0.25})
    return DuckSample(group_index=group, index=index, reward=reward, loss_mask=[1, 1], metadata=meta)


def infra(
    group: int | None,
    index: int,
    cause: str = "sandbox_lost",
    reward: Any = None,
    domain: str | None = None,
    **metadata: Any,
) -> DuckSample:
    meta: dict[str, Any] = {ATTEMPT_CLASS: f"infra:{cause}", **metadata}
    if domain is not None:
        meta[DOMAIN] = domain
    return DuckSample(
        group_index=group, index=index, reward=reward, loss_mask=[0, 0], remove_sample=True, metadata=meta
    )
