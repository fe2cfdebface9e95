"""Known-good evidence: what a task's verifier did on the task's known-good state (its oracle's end state).

Owns `KnownGood` (healthy, unknown or failing; which control said so) and the one reading of the
task audit's oracle records into it (`from_oracle_attempts`), shared by the audit and the Harbor
server's controls. The attribution rules (`rl360_ext.outcomes.verdict`) ask for it when a verifier
fails on an agent's end state: a verifier that grades the known-good state within its budget and
limits is healthy, so its failure on the agent's state is the policy's; one that fails there too
makes the failure the task's. It runs nothing itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rl360_ext.outcomes.attribution import Control
from rl360_ext.outcomes.causes import Cause, as_cause
from rl360_ext.outcomes.provenance import VALID

# Failures of the verifier itself on the oracle's end state (what "not healthy" means).
VERIFIER_FAILURES = frozenset(
    {
        Cause.VERIFIER_TIMEOUT,
        Cause.VERIFIER_CRASH,
        Cause.VERIFIER_FAILED,
        Cause.REWARD_FILE_MISSING,
        Cause.REWARD_FILE_EMPTY,
        Cause.REWARD_FILE_INVALID,
        Cause.REWARD_KEY_MISSING,
        Cause.MEMORY_LIMIT_EXCEEDED,
    }
)


@dataclass(frozen=True)
class KnownGood:
    """What the task's verifier did on the task's known-good state."""

    healthy: bool | None
    """True: it graded within its budget and limits; False: it failed there too; None: unknown."""
    control: Control
    """Where the evidence came from: the audit, a control regrade, or none to be had."""
    detail: str = ""


def from_oracle_attempts(attempts: Sequence[Mapping[str, Any]], control: Control) -> KnownGood:
    """The verifier's health from oracle attempts as the audit records them (`attempt_class`,
    `failure_cause`, `verifier_s`): healthy when a verifier graded one (a valid attempt with a
    verifier phase), failing when none did and one failed in the verifier for a reason of its own
    (not the policy's, not infrastructure outside the sandbox), else unknown."""
    graded = [a for a in attempts if a.get("attempt_class") == VALID and a.get("verifier_s") is not None]
    if graded:
        slowest = max(float(a["verifier_s"]) for a in graded)
        detail = f"the verifier graded the oracle's end state ({slowest:.1f}s at most)"
        return KnownGood(True, control, detail)
    failed = [as_cause(a.get("failure_cause")) for a in attempts]
    failing = [cause for cause in failed if cause in VERIFIER_FAILURES]
    if failing:
        return KnownGood(False, control, f"the verifier failed on the oracle's end state too ({failing[0]})")
    return KnownGood(None, control, "no oracle attempt reached a verdict of the verifier")

