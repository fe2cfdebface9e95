"""Harbor's failure vocabulary, written once: exception type names and failure causes, without Harbor.

Owns rl360's Harbor-side failure causes (the `failure_cause` values rl360's Harbor /run server
reports), the table from each exception type name Harbor records
(harbor/models/trial/error_policy.py, 0.25-0.26) to one of them, and Harbor 0.25's own
`TrialResult.failure_cause` values. `rl360_ext.harbor.outcome` reads it to build a /run outcome;
`rl360_ext.outcomes.infra` reads it to classify an attempt, mapping the failure cause onto its
infra causes, or using a row's `infra_cause` where the classifier draws a finer line than the
failure cause does (a sandbox that never started vs. one that was lost). It imports nothing
from Harbor, so it loads on Python 3.11; it does not decide validity (that is infra's job).
"""

from __future__ import annotations

from dataclasses import dataclass

# failure_cause values rl360 adds to Harbor's own (sandbox_failed, model_provider_failed,
# agent_refused_task, verifier_failed, unclassified, cancelled).
INSUFFICIENT_BUDGET = "insufficient_budget"
INSUFFICIENT_CAPACITY = "insufficient_capacity"
DEADLINE_EXCEEDED = "deadline_exceeded"
CANCELLED = "cancelled"
HARBOR_INTERNAL_ERROR = "harbor_internal_error"
UNCLASSIFIED = "unclassified"
SANDBOX_FAILED = "sandbox_failed"
ENVIRONMENT_START_TIMEOUT = "environment_start_timeout"
MEMORY_LIMIT_EXCEEDED = "memory_limit_exceeded"
AGENT_SETUP_TIMEOUT = "agent_setup_timeout"
AGENT_TIMEOUT = "agent_timeout"
MODEL_PROVIDER_FAILED = "model_provider_failed"
VERIFIER_FAILED = "verifier_failed"
VERIFIER_TIMEOUT = "verifier_timeout"
VERIFIER_CRASH = "verifier_crash"
REWARD_FILE_MISSING = "reward_file_missing"
REWARD_FILE_EMPTY = "reward_file_empty"
REWARD_FILE_INVALID = "reward_file_invalid"
REWARD_KEY_MISSING = "reward_key_missing"
JUDGE_FAILURE = "judge_failure"
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
OUTPUT_LENGTH_EXCEEDED = "output_length_exceeded"
AGENT_NONZERO_EXIT = "agent_nonzero_exit"
AGENT_REFUSED_TASK = "agent_refused_task"

# Causes where the policy failed and the verifier's grade of what it left still counts.
POLICY_CAUSES = frozenset(
    {CONTEXT_LENGTH_EXCEEDED, OUTPUT_LENGTH_EXCEEDED, AGENT_NONZERO_EXIT, AGENT_REFUSED_TASK}
)

AGENT_TIMEOUT_ERROR = "AgentTimeoutError"

# A verifier whose judge (an LLM grader or another grading service) failed says so by exiting
# with 75 (sysexits EX_TEMPFAIL). Whatever reward file it left does not count: the grade was not
# the judge's, it was a fallback.
JUDGE_FAILURE_EXIT_CODE = 75


@dataclass(frozen=True)
class HarborException:
    """What rl360 makes of one Harbor exception type."""

    failure_cause: str
    # The classifier's cause when it is finer than what `failure_cause` maps to; None: follow it.
    infra_cause: str | None = None


def _rows(failure_cause: str, *names: str, infra_cause: str | None = None) -> dict[str, HarborException]:
    return dict.fromkeys(names, HarborException(failure_cause, infra_cause))


HARBOR_EXCEPTIONS: dict[str, HarborException] = {
    **_rows(ENVIRONMENT_START_TIMEOUT, "EnvironmentStartTimeoutError"),
    **_rows(SANDBOX_FAILED, "SandboxBuildFailedError", infra_cause="no_sandbox"),
    **_rows(
        SANDBOX_FAILED,
        "HealthcheckError",
        "SSHAccessError",
        "GKEExecStreamClosedError",
        "GKEPodNotFoundError",
        "RuntimeRequestError",
    ),
    **_rows(MEMORY_LIMIT_EXCEEDED, "SandboxLikelyOutOfMemoryError", "MemoryLimitExceededError"),
    **_rows(AGENT_SETUP_TIMEOUT, "AgentSetupTimeoutError"),
    **_rows(AGENT_TIMEOUT, AGENT_TIMEOUT_ERROR),
    **_rows(VERIFIER_FAILED, "AddTestsDirError", "DownloadVerifierDirError"),
    **_rows(VERIFIER_TIMEOUT, "VerifierTimeoutError"),
    **_rows(REWARD_FILE_MISSING, "RewardFileNotFoundError"),
    **_rows(REWARD_FILE_EMPTY, "RewardFileEmptyError"),
    **_rows(REWARD_FILE_INVALID, "VerifierOutputParseError"),
    **_rows(CONTEXT_LENGTH_EXCEEDED, "ContextWindowExceededError", "ContextLengthExceededError"),
    **_rows(OUTPUT_LENGTH_EXCEEDED, "OutputTokenExceededError", "OutputLengthExceededError"),
    **_rows(AGENT_NONZERO_EXIT, "NonZeroAgentExitCodeError"),
    **_rows(AGENT_REFUSED_TASK, "AgentSafetyRefusalError", "ContentPolicyViolationError"),
    **_rows(CANCELLED, "CancelledError"),
    **_rows(
        HARBOR_INTERNAL_ERROR,
        "ServiceOperationsUnsupportedError",
        "VercelScopeError",
        "DspyImportError",
        "MissingExtraError",
        "RegradeError",
        infra_cause="agent_config_error",
    ),
    **_rows(
        MODEL_PROVIDER_FAILED,
        "ApiError",
        "ApiRateLimitError",
        "ApiInternalServerError",
        "ApiOverloadedError",
        "ApiConnectionClosedError",
        "ApiResponseStalledError",
        "UnknownApiError",
        "NetworkConnectionError",
        "ApiConnectionError",
        "ApiUsageLimitError",
        "RateLimitError",
        "InternalServerError",
        "ServiceUnavailableError",
        "APIConnectionError",
        "APIError",
        "Timeout",
    ),
    **_rows(
        MODEL_PROVIDER_FAILED,
        "UnsupportedModelParametersError",
        "BadRequestError",
        "UnprocessableEntityError",
        "UnsupportedParamsError",
        "APIResponseValidationError",
        "BudgetExceededError",
        infra_cause="model_request_rejected",
    ),
    **_rows(
        MODEL_PROVIDER_FAILED,
        "AgentAuthenticationError",
        "ModelNotFoundError",
        "ApiProviderResourceNotFoundError",
        "AuthenticationError",
        "PermissionDeniedError",
        "NotFoundError",
        infra_cause="agent_config_error",
    ),
}

# Harbor 0.25's TrialResult.failure_cause values, for exception types not in the table above.
HARBOR_025_CAUSES: dict[str, str] = {
    "sandbox_failed": SANDBOX_FAILED,
    "model_provider_failed": MODEL_PROVIDER_FAILED,
    "harbor_failed": HARBOR_INTERNAL_ERROR,
    "unclassified": UNCLASSIFIED,
    "agent_exhausted_budget": AGENT_TIMEOUT,
    "agent_refused_task": AGENT_REFUSED_TASK,
    "verifier_failed": VERIFIER_FAILED,
    "cancelled": CANCELLED,
}


def cause_for_exception_type(exception_type: str, harbor_025_cause: str | None = None) -> str:
    """rl360's failure_cause for a Harbor-recorded exception type name."""
    if exception_type in HARBOR_EXCEPTIONS:
        return HARBOR_EXCEPTIONS[exception_type].failure_cause
    if harbor_025_cause is not None:
        return HARBOR_025_CAUSES.get(str(harbor_025_cause), UNCLASSIFIED)
    return UNCLASSIFIED
