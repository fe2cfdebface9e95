"""Reward provenance: the metadata contract every rl360 hook reads to tell valid from infra.

Owns the keys rl360 writes into `Sample.metadata` and the single rule for reading them back.
`rl360_ext.outcomes.verdict` decides the class of an attempt and the hooks write it here; filters, reward
post-processing, metrics, reducers and the audit only read it through `attempt_class` /
`is_valid`, so there is one way to ask "does this sample's reward count?".

Rule: a reward counts only if a verifier wrote it, or it is the task's floor for a failure the
verdict attributed to the policy by evidence (`reward_source == "floor"`: the policy's own processes
left no end state a healthy verifier could grade). A sample that carries no class is judged by its
`reward_source` alone: "verifier" is valid, anything else is `infra:unclassified`, never a reward of 0.
"""

from __future__ import annotations

from typing import Any

VALID = "valid"
INFRA_PREFIX = "infra:"
UNCLASSIFIED = f"{INFRA_PREFIX}unclassified"
VERIFIER = "verifier"  # the `reward_source` of a reward this run's verifier wrote
FLOOR = "floor"  # the `reward_source` of the task's floor, scored for a failure attributed to the policy

# Keys rl360 writes into Sample.metadata.
ATTEMPT_CLASS = "attempt_class"  # "valid" | "infra:<cause>"
REWARD_SOURCE = "reward_source"  # "verifier" | None
FAILURE_CAUSE = "failure_cause"  # Harbor's or ours, as reported by the /run server
PHASE_TIMINGS = (
    "phase_timings"  # {"queue": s, "environment_setup": s, "agent_setup": s, "agent": s, "verifier": s}
)
TIMELINE = "timeline"  # {"received_at": unix s, "sandbox_started_at": ..., "finished_at": ...} from Harbor
DOMAIN = "domain"  # optional task domain for per-domain metrics


def _metadata(sample: Any) -> dict[str, Any]:
    metadata = getattr(sample, "metadata", None)
    if metadata is None and isinstance(sample, dict):
        metadata = sample.get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def attempt_class(sample: Any) -> str:
    """ "valid" or "infra:<cause>" for a Miles Sample, a duck-typed object or a dict."""
    metadata = _metadata(sample)
    recorded = metadata.get(ATTEMPT_CLASS)
    if isinstance(recorded, str) and (recorded == VALID or recorded.startswith(INFRA_PREFIX)):
        return recorded
    return VALID if metadata.get(REWARD_SOURCE) == VERIFIER else UNCLASSIFIED


def is_valid(sample: Any) -> bool:
    return attempt_class(sample) == VALID


def infra_cause(sample: Any) -> str | None:
    """The cause after "infra:", or None for a valid sample."""
    cls = attempt_class(sample)
    return None if cls == VALID else cls[len(INFRA_PREFIX) :]
