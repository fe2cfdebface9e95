"""Attribution: who a failed attempt belongs to (the policy, the infrastructure or the task), and why.

Owns the vocabulary of the line between a failed environment and a failed policy, read in both
directions: `Attribution` (who), `Phase` (when), `Resource` (which limit), `Control` (what
decided: the evidence a known-good state gave), `LimitHit` (a limit the sandbox's own processes
hit, as the environment saw it from the host) and `Evidence` (the record every failed attempt
carries in the /run answer and in `Sample.metadata`). It decides nothing: the verdict
(`rl360_ext.outcomes.verdict`) applies the rules, environments only report what they saw.

What each attribution does to the loss:
- policy: scored. The verifier's grade of the end state where the verifier could run, else the
  task's floor. RL must see it, or it learns to fail this way.
- infrastructure: masked (out of the loss and the group baseline): what happens outside the
  sandbox, or what the task's known-good state reproduces in it.
- task: masked too, and the task is the one to fix: its verifier fails on its own known-good state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

ATTRIBUTED_TO = "attributed_to"  # /run answer and Sample.metadata key: an `Attribution` value
EVIDENCE = "evidence"  # /run answer and Sample.metadata key: an `Evidence.as_json()` dict
_E = TypeVar("_E", bound=StrEnum)


class Attribution(StrEnum):
    """Who a failed attempt belongs to."""

    POLICY = "policy"
    INFRASTRUCTURE = "infrastructure"
    TASK = "task"


class Phase(StrEnum):
    """Where a failure happened: a phase of the sandbox, or outside it (`HOST`)."""

    ENVIRONMENT_SETUP = "environment_setup"
    AGENT = "agent"
    VERIFIER = "verifier"
    HOST = "host"
    """Outside the sandbox: engine, gateway, session server, Harbor, the replica, the host."""


class Resource(StrEnum):
    """A limit a sandbox's processes can hit."""

    MEMORY = "memory"
    PIDS = "pids"
    DISK = "disk"
    INODES = "inodes"
    OUTPUT = "output"
    TIME = "time"


class Control(StrEnum):
    """What decided an attribution: the evidence about the task's verifier on its known-good state."""

    AUDIT = "audit"
    """The task audit's oracle runs (cached by task digest): the verifier graded the known-good
    state within its budget and limits (healthy), or did not."""
    REGRADE = "regrade"
    """A control regrade in a fresh sandbox on the known-good state, run by the server."""
    RULE = "rule"
    """No control was needed: the rule alone decides (a limit in the agent phase, a host failure)."""
    NONE = "none"
    """A control was needed and none could be had (no oracle, no time left): not the policy's."""


class AttributionRule(StrEnum):
    """`--attribution`: how the server attributes a verifier-phase failure on the agent's end state."""

    EVIDENCE = "evidence"
    """The audit's evidence where there is one for the task's digest, else a control regrade."""
    REGRADE = "regrade"
    """Always a control regrade (cached per task digest for the server's life)."""
    LIST = "list"
    """The list of causes alone (rl360 before attribution): kept for the A/B, not for training."""


@dataclass(frozen=True)
class LimitHit:
    """A limit the sandbox's own processes hit, seen from the host, with the phase it was hit in."""

    phase: Phase
    resource: Resource
    detail: str = ""

    def as_json(self) -> dict[str, str]:
        return {"phase": self.phase.value, "resource": self.resource.value, "detail": self.detail}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LimitHit:
        """Raises ValueError naming the field that is not a phase or resource."""
        return cls(
            _member(Phase, data.get("phase"), "phase"),
            _member(Resource, data.get("resource"), "resource"),
            str(data.get("detail") or ""),
        )


@dataclass(frozen=True)
class Evidence:
    """Why an attempt was attributed as it was: the phase, the resource or signal, the control."""

    phase: Phase
    control: Control
    resource: Resource | None = None
    signal: str | None = None
    """The cause or exception that was seen (e.g. "verifier_timeout", "VerifierTimeoutError")."""
    detail: str | None = None

    def as_json(self) -> dict[str, str | None]:
        return {
            "phase": self.phase.value,
            "resource": None if self.resource is None else self.resource.value,
            "signal": self.signal,
            "control": self.control.value,
            "detail": self.detail,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Evidence:
        """Raises ValueError naming the field that is not of the vocabulary."""
        resource = data.get("resource")
        return cls(
            phase=_member(Phase, data.get("phase"), "phase"),
            control=_member(Control, data.get("control"), "control"),
            resource=None if resource is None else _member(Resource, resource, "resource"),
            signal=_text(data.get("signal")),
            detail=_text(data.get("detail")),
        )


def _member(enum: type[_E], value: Any, field: str) -> _E:
    try:
        return enum(value)
    except ValueError:
        known = ", ".join(member.value for member in enum)
        raise ValueError(f"{field} must be one of {known}, got {value!r}") from None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def as_attribution(value: Any) -> Attribution | None:
    """The `Attribution` a recorded string names, or None for a missing or unknown one."""
    try:
        return Attribution(value)
    except ValueError:
        return None
