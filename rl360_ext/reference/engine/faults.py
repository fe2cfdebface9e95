"""Fault injection for the tiny engine: a fraction of 503s, added latency, and aborted generations.

Owns the fault settings (validated: rates in [0, 1], a finite latency of at most
`MAX_LATENCY_S`, a seed in [0, 2^64)), and their seeded random draws per request. The errors
(`ServiceUnavailable`, 503; `FaultConfigError`, 400) are in `errors.py`. Used by tests of
everything downstream (session servers, rollout hooks) that must tell an infrastructure failure
from a policy failure. It does not run requests.

How a request's faults are drawn (`FaultConfig.draw_by`, a `FaultKey`):
- `request` (default): one seeded stream in the order requests arrive, so which request fails
  depends on timing and on every other request in flight;
- `sampling_seed`: a request that carries a `sampling_seed` draws from a generator seeded by
  (`seed`, that sampling seed) alone, so every request of one attempt (an A/B arm gives each
  attempt a sampling seed derived from the run's seed and the attempt's identity:
  `rl360_ext.local.demo.plan.attempt_sampling_seed`) gets the same draw, in every arm, on every
  engine, whatever the arrival order. `error_rate` is then the fraction of attempts whose
  requests are all refused. A request without a sampling seed falls back to the stream.
"""

from __future__ import annotations

import math
import threading
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from rl360_ext.reference.engine.errors import FaultConfigError, ServiceUnavailable

__all__ = [
    "MAX_LATENCY_S",
    "MAX_SEED",
    "FaultConfig",
    "FaultConfigError",
    "FaultDraw",
    "FaultInjector",
    "FaultKey",
    "ServiceUnavailable",
]

MAX_LATENCY_S = 600.0  # longest injected delay: a worker thread sleeps it, so it must be bounded
MAX_SEED = 2**64 - 1


class FaultKey(StrEnum):
    """What a request's fault draw is a function of (see the module docstring)."""

    REQUEST = "request"  # the arrival order: one seeded stream per engine
    SAMPLING_SEED = "sampling_seed"  # the request's sampling seed: one draw per attempt, paired across arms


@dataclass(frozen=True)
class FaultConfig:
    """The faults the engine injects (`/rl360/faults`); a bad value is a `FaultConfigError` naming it."""

    error_rate: float = 0.0
    """Fraction of /generate calls answered 503."""
    latency_s: float = 0.0
    """Seconds added before each /generate call runs."""
    abort_rate: float = 0.0
    """Fraction of /generate calls aborted part-way (finish_reason abort)."""
    seed: int = 0
    """Seed of the draws."""
    draw_by: FaultKey = FaultKey.REQUEST
    """What each draw is a function of (`FaultKey`)."""

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "draw_by", FaultKey(self.draw_by))
        except ValueError:
            choices = ", ".join(key.value for key in FaultKey)
            raise FaultConfigError("draw_by", f"must be one of {choices}, got {self.draw_by!r}") from None
        for name in ("error_rate", "abort_rate"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, int | float) and 0.0 <= value <= 1.0):
                raise FaultConfigError(name, f"must be a number in [0, 1], got {value!r}")
        latency = self.latency_s
        if (
            isinstance(latency, bool)
            or not isinstance(latency, int | float)
            or not (math.isfinite(latency) and 0 <= latency <= MAX_LATENCY_S)
        ):
            raise FaultConfigError(
                "latency_s", f"must be a number in [0, {MAX_LATENCY_S:g}], got {latency!r}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED:
            raise FaultConfigError("seed", f"must be an integer in [0, 2^64), got {self.seed!r}")

    @classmethod
    def from_dict(cls, raw: Any) -> FaultConfig:
        if not isinstance(raw, dict):
            raise FaultConfigError("body", "fault settings must be an object")
        unknown = sorted(set(raw) - set(cls.__dataclass_fields__))
        if unknown:
            raise FaultConfigError(unknown[0], "unknown fault setting")
        return cls(**raw)

    @classmethod
    def parse_flag(cls, text: str) -> FaultConfig:
        """`error_rate=0.1,latency_s=0.2,abort_rate=0.05,seed=1,draw_by=sampling_seed` (the --faults
        CLI flag)."""
        raw: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = part.partition("=")
            if not sep:
                raise FaultConfigError(part, "is not key=value")
            if key.strip() == "draw_by":
                raw["draw_by"] = value.strip()
                continue
            try:
                raw[key.strip()] = int(value) if key.strip() == "seed" else float(value)
            except ValueError:
                raise FaultConfigError(key.strip(), f"{value!r} is not a number") from None
        return cls.from_dict(raw)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "draw_by": self.draw_by.value}


@dataclass(frozen=True)
class FaultDraw:
    """What happens to one request: refuse it, delay it, abort it after `abort_after` tokens."""

    unavailable: bool = False
    latency_s: float = 0.0
    abort_after: int | None = None


class FaultInjector:
    """Seeded per-request fault draws; settings can be replaced at runtime (thread-safe)."""

    def __init__(self, config: FaultConfig | None = None) -> None:
        self._lock = threading.Lock()
        self.configure(config or FaultConfig())
        self.injected = {"unavailable": 0, "aborted": 0, "delayed": 0}

    def configure(self, config: FaultConfig) -> None:
        with self._lock:
            self.config = config
            import numpy as np  # here, not at import: `rl360 engine --help` reads FaultConfig

            self._rng = np.random.default_rng(config.seed)

    def draw(self, max_new_tokens: int, sampling_seed: int | None = None) -> FaultDraw:
        """The faults of one request; with `draw_by=sampling_seed` and a `sampling_seed`, a pure
        function of (`seed`, `sampling_seed`, `max_new_tokens`)."""
        import numpy as np

        with self._lock:
            cfg = self.config
            if cfg.error_rate == 0 and cfg.abort_rate == 0 and cfg.latency_s == 0:
                return FaultDraw()
            rng = self._rng
            if cfg.draw_by == FaultKey.SAMPLING_SEED and sampling_seed is not None:
                rng = np.random.default_rng([cfg.seed, sampling_seed % (MAX_SEED + 1)])
            refuse = bool(rng.random() < cfg.error_rate)
            abort = bool(rng.random() < cfg.abort_rate)
            abort_after = int(rng.integers(0, max(max_new_tokens, 1))) if abort else None
            self.injected["delayed"] += cfg.latency_s > 0
            if refuse:
                self.injected["unavailable"] += 1
                return FaultDraw(unavailable=True, latency_s=cfg.latency_s)
            self.injected["aborted"] += abort
            return FaultDraw(latency_s=cfg.latency_s, abort_after=abort_after)
