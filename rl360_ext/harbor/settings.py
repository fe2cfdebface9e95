"""The Harbor /run server's settings: one flat dataclass, one field per `rl360 harbor serve` flag.

Owns every server setting, its default, its bounds and its help text: the docstring under each
field is the flag's help (`rl360_ext.util.fielddocs.field_docs` reads them), `metadata` holds
a field's `min`, a repeatable flag's `repeatable`, and an environment variable. The CLI
(`rl360_ext.cli.harbor`) builds its flags from these fields and nothing else; the runner reads
the derived objects (`environment`, `budget`, `capacity`, ...). Validation errors are
`ValueError`s naming the flag. It does not own the HTTP adapter or running trials.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from rl360_ext.harbor.admission import Reservation
from rl360_ext.harbor.budget import BudgetPolicy
from rl360_ext.harbor.guard import HttpLimits
from rl360_ext.outcomes.attribution import AttributionRule
from rl360_ext.outcomes.rewards import RewardRange
from rl360_ext.util.fielddocs import flag_of
from rl360_ext.util.flags import key_values

KEEP_TRIALS = ("all", "failed", "none")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _min(value: float) -> dict[str, Any]:
    return {"min": value}


@dataclass
class HarborServerConfig:
    """Everything `rl360 harbor serve` is configured with."""

    tasks_root: Path
    """Directory of Harbor tasks; /run's task is relative to it. Default: rl360's example tasks."""
    trials_dir: Path
    """Where Harbor writes trial dirs (default: a temp dir removed at exit)."""
    host: str = "127.0.0.1"
    """Bind address."""
    port: int = 8765
    """Bind port."""
    env: str = "bwrap"
    """bwrap, a Harbor environment type (docker, daytona, ...) or module:Class."""
    env_kwarg: tuple[str, ...] = field(default=(), metadata={"repeatable": True})
    """Environment kwarg KEY=VALUE (repeatable; VALUE is read as JSON when it parses)."""
    placement_kwarg: str | None = None
    """Environment kwarg that receives the node label (bwrap: node_label)."""
    agent: tuple[str, ...] = field(default=(), metadata={"repeatable": True})
    """An agent clients may choose, fixed at start (repeatable): NAME=module.path:Class, a Harbor agent
    name, or module.path:Class (named by its path). Always available: oracle, nop, terminus-2."""
    default_agent: str | None = None
    """Agent for requests that name none. Default: the first --agent, else oracle."""
    token: str | None = field(default=None, repr=False, metadata={"envvar": "RL360_HARBOR_TOKEN"})
    """Require this bearer token (prefer --token-file: a flag's value is in the process list)."""
    token_file: Path | None = None
    """Read the bearer token from this file (its first line)."""
    max_concurrent: int = field(default=64, metadata=_min(1))
    """Trials running at once, at most."""
    rolling_start_size: int | None = field(default=None, metadata=_min(1))
    """At most K sandbox starts per interval."""
    rolling_start_interval: float = field(default=1.0, metadata=_min(0.001))
    """Rolling-start interval, seconds."""
    keep_trials: str = "failed"
    """Keep trial dirs: all, failed or none."""
    nodes: str = "local"
    """Comma-separated node labels for image-group pinning."""
    capacity_cpus: float | None = field(default=None, metadata=_min(0.0))
    """CPUs reservations may add up to."""
    capacity_memory_mb: int | None = field(default=None, metadata=_min(0))
    """Memory (MB) reservations may add up to."""
    default_cpus: float = field(default=1.0, metadata=_min(0.0))
    """Reservation for tasks that declare no cpus."""
    default_memory_mb: int = field(default=2048, metadata=_min(1))
    """Reservation for tasks that declare no memory_mb."""
    env_setup_s: float = field(default=120.0, metadata=_min(0.0))
    """Budget (and timeout) for starting the sandbox."""
    agent_setup_s: float = field(default=30.0, metadata=_min(0.0))
    """Budget (and timeout) for agent setup."""
    max_verifier_s: float = field(default=600.0, metadata=_min(0.0))
    """Cap on the task's verifier timeout."""
    margin_s: float = field(default=15.0, metadata=_min(0.0))
    """Deadline margin for Harbor bookkeeping and the reply."""
    min_agent_s: float = field(default=10.0, metadata=_min(0.0))
    """Below this agent budget: insufficient_budget."""
    max_deadline_s: float = field(default=86_400.0, metadata=_min(1.0))
    """Largest deadline_s a request may ask for (a larger one is a 422)."""
    max_turns: int | None = field(default=None, metadata=_min(1))
    """Turn limit passed to model-driven agents."""
    log_level: str = "warning"
    """Server log level."""
    allow_env: tuple[str, ...] = field(default=(), metadata={"repeatable": True})
    """A server environment variable that tasks' env tables may name in ${NAME} templates (repeatable).
    Every other template is refused when the task loads: no other server variable reaches a task."""
    reward_min: float = RewardRange.low
    """Smallest reward a verifier may write; a smaller one is reward_file_invalid."""
    reward_max: float = RewardRange.high
    """Largest reward a verifier may write; a larger one is reward_file_invalid."""
    attribution: str = AttributionRule.EVIDENCE.value
    """Who a failure belongs to: evidence (the audit's, else a control regrade), regrade (always a
    control regrade) or list (the cause list alone, for the A/B; docs/harbor.md's table)."""
    task_health: Path | None = None
    """The task audit's task_health.jsonl: its oracle runs are the evidence that a task's verifier
    grades the task's known-good state (matched by the task's content digest)."""
    floor_reward: float = 0.0
    """The reward of a failure attributed to the policy that left nothing to grade (a task's
    [metadata] floor_reward wins)."""
    max_controls: int = field(default=4, metadata=_min(1))
    """Control regrades on known-good states running at once (one per task digest, cached)."""
    max_body_bytes: int = field(default=HttpLimits.max_body_bytes, metadata=_min(1))
    """Largest request body, bytes (a larger Content-Length, or a body that streams past it: 413)."""
    header_timeout_s: float = field(default=HttpLimits.header_timeout_s, metadata=_min(0.001))
    """A request's start line and headers must arrive within this many seconds, else it is dropped."""
    body_timeout_s: float = field(default=HttpLimits.body_timeout_s, metadata=_min(0.001))
    """A request's body must arrive within this many seconds of its headers (else 408)."""

    def __post_init__(self) -> None:
        for item in fields(self):
            value, low = getattr(self, item.name), item.metadata.get("min")
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{flag_of(item)} must be finite, got {value}")
            if low is not None and value is not None and value < low:
                raise ValueError(f"{flag_of(item)} must be >= {low}, got {value}")
        if self.keep_trials not in KEEP_TRIALS:
            raise ValueError(
                f"--keep-trials must be one of {', '.join(KEEP_TRIALS)}, got {self.keep_trials!r}"
            )
        if (self.capacity_cpus is None) != (self.capacity_memory_mb is None):
            raise ValueError("give both --capacity-cpus and --capacity-memory-mb, or neither")
        if not self.node_labels:
            raise ValueError("--nodes names no node label")
        if not self.reward_min < self.reward_max:
            raise ValueError(
                f"--reward-min ({self.reward_min}) must be below --reward-max ({self.reward_max})"
            )
        if self.attribution not in {rule.value for rule in AttributionRule}:
            known = ", ".join(rule.value for rule in AttributionRule)
            raise ValueError(f"--attribution must be one of {known}, got {self.attribution!r}")
        if bad := [name for name in self.allow_env if not _ENV_NAME.fullmatch(name)]:
            raise ValueError(f"--allow-env takes environment variable names, got {bad}")
        self.parse_env_kwargs()  # a bad pair is a start-time error

    def parse_env_kwargs(self) -> dict[str, Any]:
        """--env-kwarg pairs; a VALUE is read as JSON when it parses (true, 3, "x"), else as a string."""
        try:
            return key_values(self.env_kwarg)
        except ValueError as exc:
            raise ValueError(f"--env-kwarg: {exc}") from None

    @property
    def node_labels(self) -> tuple[str, ...]:
        return tuple(label.strip() for label in self.nodes.split(",") if label.strip())

    @property
    def capacity(self) -> Reservation | None:
        if self.capacity_cpus is None or self.capacity_memory_mb is None:
            return None
        return Reservation(self.capacity_cpus, self.capacity_memory_mb)

    @property
    def default_reservation(self) -> Reservation:
        return Reservation(self.default_cpus, self.default_memory_mb)

    @property
    def budget(self) -> BudgetPolicy:
        return BudgetPolicy(
            self.env_setup_s, self.agent_setup_s, self.max_verifier_s, self.margin_s, self.min_agent_s
        )

    @property
    def http_limits(self) -> HttpLimits:
        return HttpLimits(self.max_body_bytes, self.header_timeout_s, self.body_timeout_s)

    @property
    def reward_range(self) -> RewardRange:
        return RewardRange(self.reward_min, self.reward_max)

    def bearer_token(self) -> str | None:
        """The token from --token-file (first line), else --token / RL360_HARBOR_TOKEN."""
        if self.token_file is not None:
            try:
                token = self.token_file.read_text().splitlines()[0].strip()
            except (OSError, IndexError) as exc:
                raise ValueError(f"--token-file {self.token_file}: no token could be read ({exc})") from exc
            if not token:
                raise ValueError(f"--token-file {self.token_file} is empty")
            return token
        return self.token or None
