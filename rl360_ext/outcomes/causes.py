"""Every failure cause rl360 names, once: the enum, the failure -> infra map, the policy causes.

Owns the vocabulary of `failure_cause` (what the rl360 Harbor /run server reports, Harbor's own
causes included) and of the infra classes `"infra:<cause>"` every hook reads through
`rl360_ext.outcomes.provenance`. `Cause` is a `StrEnum`, so a cause in `Sample.metadata` or a
/run response is a plain JSON string and compares equal to it. It decides nothing itself: the
verdict (`rl360_ext.outcomes.verdict`) reads these tables, nothing else does.

Three kinds of cause:
- server causes, reported by the Harbor /run server in `failure_cause` (Harbor's coarse ones,
  rl360's finer ones, and the policy outcomes whose verifier reward still counts);
- infra causes, the `<cause>` of `"infra:<cause>"`: `INFRA_CAUSES`; a server cause that is not
  itself one maps onto one through `FAILURE_TO_INFRA`;
- client causes (`CLIENT_CAUSES`): what only the client can see (the session, the engine behind
  it, its own clock and its own connection); the Harbor server never reports them.
"""

from __future__ import annotations

from enum import StrEnum

from rl360_ext.outcomes.provenance import INFRA_PREFIX


class Cause(StrEnum):
    """One failure cause; its value is the string on the wire and in metadata."""

    # Harbor's own TrialResult.failure_cause values (0.25) and coarse failure classes.
    SANDBOX_FAILED = "sandbox_failed"
    MODEL_PROVIDER_FAILED = "model_provider_failed"
    HARBOR_FAILED = "harbor_failed"
    VERIFIER_FAILED = "verifier_failed"
    CANCELLED = "cancelled"
    UNCLASSIFIED = "unclassified"
    AGENT_EXHAUSTED_BUDGET = "agent_exhausted_budget"
    # rl360's Harbor /run server: failures decided outside a trial result.
    INSUFFICIENT_BUDGET = "insufficient_budget"
    INSUFFICIENT_CAPACITY = "insufficient_capacity"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    HARBOR_INTERNAL_ERROR = "harbor_internal_error"
    # rl360's Harbor /run server: finer causes of a trial's failure.
    ENVIRONMENT_START_TIMEOUT = "environment_start_timeout"
    MEMORY_LIMIT_EXCEEDED = "memory_limit_exceeded"
    AGENT_SETUP_TIMEOUT = "agent_setup_timeout"
    AGENT_TIMEOUT = "agent_timeout"
    VERIFIER_TIMEOUT = "verifier_timeout"
    VERIFIER_CRASH = "verifier_crash"
    REWARD_FILE_MISSING = "reward_file_missing"
    REWARD_FILE_EMPTY = "reward_file_empty"
    REWARD_FILE_INVALID = "reward_file_invalid"
    REWARD_KEY_MISSING = "reward_key_missing"
    JUDGE_FAILURE = "judge_failure"
    # Policy outcomes: the policy failed, the verifier's grade of what it left counts.
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    OUTPUT_LENGTH_EXCEEDED = "output_length_exceeded"
    AGENT_NONZERO_EXIT = "agent_nonzero_exit"
    AGENT_REFUSED_TASK = "agent_refused_task"
    # Infra causes no server reports as such (the verdict's finer reading of a failure).
    ABORTED = "aborted"
    NO_SANDBOX = "no_sandbox"
    SANDBOX_LOST = "sandbox_lost"
    NO_ENGINE_AVAILABLE = "no_engine_available"
    MODEL_REQUEST_REJECTED = "model_request_rejected"
    AGENT_CONFIG_ERROR = "agent_config_error"
    NO_VERIFIER_REWARD = "no_verifier_reward"
    SANDBOX_TREE_REFUSED = "sandbox_tree_refused"
    # The task audit's own agents (rl360_ext.harbor.canaries): their findings and failures.
    VERIFIER_DISAGREED = "verifier_disagreed"
    CONTROL_INCOMPLETE = "control_incomplete"
    # Client causes: only the client sees them.
    CLIENT_DEADLINE = "client_deadline"
    TRANSPORT_ERROR = "transport_error"
    SESSION_VANISHED = "session_vanished"
    RUN_REJECTED = "run_rejected"
    TASK_QUARANTINED = "task_quarantined"


# Causes where the policy failed and the verifier's grade of what it left still counts.
POLICY_CAUSES = frozenset(
    {
        Cause.CONTEXT_LENGTH_EXCEEDED,
        Cause.OUTPUT_LENGTH_EXCEEDED,
        Cause.AGENT_NONZERO_EXIT,
        Cause.AGENT_REFUSED_TASK,
    }
)
# Harbor 0.25's name for an agent that ran out of its own budget is a policy outcome too.
POLICY_OUTCOME_CAUSES = POLICY_CAUSES | {Cause.AGENT_EXHAUSTED_BUDGET}

# The infra classes: "infra:<cause>" for each of these.
INFRA_CAUSES: dict[Cause, str] = {
    Cause.ABORTED: "the attempt was cancelled or aborted before its verifier wrote a reward",
    Cause.NO_SANDBOX: "no sandbox could be started (build/launch failure, no capacity)",
    Cause.SANDBOX_LOST: "the sandbox died or became unreachable during the run",
    Cause.ENVIRONMENT_START_TIMEOUT: "the sandbox did not start within its timeout",
    Cause.AGENT_SETUP_TIMEOUT: "installing/starting the agent in the sandbox timed out",
    Cause.VERIFIER_TIMEOUT: "the verifier did not finish within its timeout",
    Cause.VERIFIER_CRASH: "the verifier failed before producing a reward",
    Cause.REWARD_FILE_MISSING: "the verifier finished without writing a reward file",
    Cause.REWARD_FILE_EMPTY: "the verifier wrote an empty reward file",
    Cause.REWARD_FILE_INVALID: "the reward could not be parsed or is not a finite number",
    Cause.HARBOR_INTERNAL_ERROR: "an exception Harbor or the /run server did not expect",
    Cause.CLIENT_DEADLINE: "the client's deadline passed before the run returned",
    Cause.TRANSPORT_ERROR: "the /run request failed in transport (connection reset, refused, bad HTTP)",
    Cause.SESSION_VANISHED: "the session server lost the trajectory (actor died, session evicted)",
    Cause.NO_ENGINE_AVAILABLE: "the model gateway or engine failed (5xx, overloaded, unreachable)",
    Cause.MODEL_REQUEST_REJECTED: (
        "the model endpoint rejected a request (4xx) the agent could not recover from"
    ),
    Cause.AGENT_CONFIG_ERROR: "the agent could not authenticate or find its model (configuration)",
    Cause.JUDGE_FAILURE: "the judge the verifier depends on failed",
    Cause.AGENT_TIMEOUT: "the agent timed out (policy 'mask', or no verifier reward after the timeout)",
    Cause.NO_VERIFIER_REWARD: "the run reported no failure but its reward was not written by a verifier",
    Cause.SANDBOX_TREE_REFUSED: (
        "the sandbox left a tree the host would not walk (past its entry or depth caps, or moving "
        "under the walk); attributed to the policy that left it"
    ),
    Cause.UNCLASSIFIED: "a failure this classifier does not know",
    Cause.TASK_QUARANTINED: "the task is on the task audit's quarantine list: not run, masked, never scored",
    Cause.VERIFIER_DISAGREED: (
        "the audit's regrade: the verifier graded one end state with different rewards (a finding "
        "about the task, not a reward)"
    ),
    Cause.CONTROL_INCOMPLETE: (
        "an audit control's agent could not do its check (no trial layout, a grading that failed, "
        "a work product it could not restore)"
    ),
}

# The failure -> infra map: each server or client cause that is not itself an infra cause (nor a
# policy outcome, nor the agent timeout, which the timeout policy decides) and its infra cause.
FAILURE_TO_INFRA: dict[Cause, Cause] = {
    Cause.SANDBOX_FAILED: Cause.SANDBOX_LOST,
    Cause.MODEL_PROVIDER_FAILED: Cause.NO_ENGINE_AVAILABLE,
    Cause.HARBOR_FAILED: Cause.HARBOR_INTERNAL_ERROR,
    Cause.VERIFIER_FAILED: Cause.VERIFIER_CRASH,
    Cause.CANCELLED: Cause.ABORTED,
    Cause.MEMORY_LIMIT_EXCEEDED: Cause.SANDBOX_LOST,
    Cause.INSUFFICIENT_BUDGET: Cause.NO_SANDBOX,
    Cause.INSUFFICIENT_CAPACITY: Cause.NO_SANDBOX,
    Cause.DEADLINE_EXCEEDED: Cause.CLIENT_DEADLINE,
    Cause.REWARD_KEY_MISSING: Cause.REWARD_FILE_INVALID,
    Cause.RUN_REJECTED: Cause.UNCLASSIFIED,  # the server refused the request; the message says why
}
# Harbor's coarse causes: a specific exception type, when the server names one, reads finer.
COARSE_CAUSES = (frozenset(FAILURE_TO_INFRA) - {Cause.RUN_REJECTED}) | {Cause.UNCLASSIFIED}

# The causes a client may name itself, for what only it sees: its own clock and connection, the
# server's refusal or a server that crashed before a verdict (HTTP 500, no JSON), the session (and,
# through it, the engine and the turns it aborted). Every other cause comes in a server's verdict.
CLIENT_CAUSES = frozenset(
    {
        Cause.CLIENT_DEADLINE,
        Cause.TRANSPORT_ERROR,
        Cause.NO_SANDBOX,  # no Harbor replica took the request (connection refused)
        Cause.SANDBOX_LOST,  # the replica running the attempt went away mid-run
        Cause.RUN_REJECTED,
        Cause.HARBOR_INTERNAL_ERROR,
        Cause.SESSION_VANISHED,
        Cause.NO_ENGINE_AVAILABLE,
        Cause.ABORTED,
        Cause.TASK_QUARANTINED,  # the agent function did not run a task the audit quarantined
    }
)


def infra_class(cause: str) -> str:
    """ "infra:<cause>" for an infra cause; a ValueError names an unknown one."""
    if cause not in INFRA_CAUSES:
        raise ValueError(f"unknown infra cause {cause!r}; known causes: {sorted(INFRA_CAUSES)}")
    return f"{INFRA_PREFIX}{cause}"


def as_cause(value: object) -> Cause | None:
    """The `Cause` a reported string names, or None for an unknown one."""
    if not isinstance(value, str):
        return None
    try:
        return Cause(value)
    except ValueError:
        return None
