"""Known-good evidence: what a task's verifier did on the task's known-good state (its oracle's end state).

Owns `KnownGood` (healthy, unknown or failing; which control said so) and the one reading of the
task audit's record of the verifier on the oracle's end state into it (`from_audit_evidence`),
read by the Harbor server's controls (`--task-health`) and by anything reading an audit's result. The
attribution rules (`rl360_ext.outcomes.verdict`) ask for it when a verifier fails on an agent's
end state: a verifier that grades the known-good state within its budget and limits is healthy,
so its failure on the agent's state is the policy's; one that fails there too makes the failure
the task's. It runs nothing itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rl360_ext.outcomes.attribution import Control
from rl360_ext.outcomes.causes import Cause

# Failures of the verifier itself on an end state: past its timeout, or no usable reward (a limit in
# its phase is told by the attempt's evidence, not by a cause).
VERIFIER_FAILURES = frozenset(
    {
        Cause.VERIFIER_TIMEOUT,
        Cause.VERIFIER_CRASH,
        Cause.VERIFIER_FAILED,
        Cause.REWARD_FILE_MISSING,
        Cause.REWARD_FILE_EMPTY,
        Cause.REWARD_FILE_INVALID,
        Cause.REWARD_KEY_MISSING,
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


def from_audit_evidence(evidence: Mapping[str, Any], control: Control = Control.AUDIT) -> KnownGood:
    """The verifier's health from a task audit result's evidence (`evidence["oracle"]["verifier"]`,
    written by `rl360_ext.tasks.audit` over every oracle run, retries included): failing when it
    failed on the oracle's end state in a run that was not infrastructure (past its timeout,
    crashed, no usable reward, a limit in its phase), healthy when it graded every valid oracle
    run within its timeout, else unknown (no oracle run reached it, or a result from before the
    audit kept this record)."""
    oracle = evidence.get("oracle")
    verifier = oracle.get("verifier") if isinstance(oracle, Mapping) else None
    if not isinstance(verifier, Mapping):
        return KnownGood(None, control, "the audit's result holds no record of the verifier on the oracle")
    if verifier.get("failed"):
        causes = verifier.get("causes") or []
        detail = f"the verifier failed on the oracle's end state in the audit ({', '.join(map(str, causes))})"
        return KnownGood(False, control, detail)
    if verifier.get("graded"):
        slowest = verifier.get("max_verifier_s")
        at_most = f" ({float(slowest):.1f}s at most)" if isinstance(slowest, int | float) else ""
        return KnownGood(True, control, f"the verifier graded the oracle's end state in the audit{at_most}")
    return KnownGood(None, control, "no oracle run of the audit reached the verifier")
