"""Harbor's exception types, read once: each type name Harbor records -> rl360's failure cause.

Owns the table from each exception type name Harbor records (harbor/models/trial/error_policy.py,
0.25-0.26) to the `Cause` rl360's Harbor /run server reports, with the finer infra cause where
the verdict draws a finer line than the failure cause does (a sandbox that never started vs. one
that was lost), and Harbor 0.25's own `TrialResult.failure_cause` values for types not in the
table. It imports nothing from Harbor, so it loads on Python 3.11; the causes themselves live in
`rl360_ext.outcomes.causes`, the decision in `rl360_ext.outcomes.verdict`.
"""

from __future__ import annotations

from dataclasses import dataclass

from rl360_ext.outcomes.causes import Cause

AGENT_TIMEOUT_ERROR = "AgentTimeoutError"
VERIFIER_TIMEOUT_ERROR = "VerifierTimeoutError"
# The exceptions rl360's own audit agents end with (rl360_ext.harbor.canaries); named here, not
# imported, so this table loads without Harbor. Harbor does not know them (its policy would keep
# the reward), so without these rows their attempts were `unclassified`.
VERIFIER_DISAGREED_ERROR = "VerifierDisagreed"
CONTROL_INCOMPLETE_ERROR = "CanaryIncomplete"
# The bwrap sandbox's walks refuse a tree the sandbox left past their caps (rl360_ext.harbor.envs.nofollow).
SANDBOX_TREE_ERROR = "SandboxTreeError"


@dataclass(frozen=True)
class HarborException:
    """What rl360 makes of one Harbor exception type."""

    failure_cause: Cause
    # The verdict's infra cause when it is finer than what `failure_cause` maps to; None: follow it.
    infra_cause: Cause | None = None


def _rows(failure_cause: Cause, *names: str, infra_cause: Cause | None = None) -> dict[str, HarborException]:
    return dict.fromkeys(names, HarborException(failure_cause, infra_cause))


HARBOR_EXCEPTIONS: dict[str, HarborException] = {
    **_rows(Cause.ENVIRONMENT_START_TIMEOUT, "EnvironmentStartTimeoutError"),
    **_rows(Cause.SANDBOX_FAILED, "SandboxBuildFailedError", infra_cause=Cause.NO_SANDBOX),
    **_rows(
        Cause.SANDBOX_FAILED,
        "HealthcheckError",
        "SSHAccessError",
        "GKEExecStreamClosedError",
        "GKEPodNotFoundError",
        "RuntimeRequestError",
    ),
    **_rows(Cause.MEMORY_LIMIT_EXCEEDED, "SandboxLikelyOutOfMemoryError", "MemoryLimitExceededError"),
    **_rows(Cause.AGENT_SETUP_TIMEOUT, "AgentSetupTimeoutError"),
    **_rows(Cause.AGENT_TIMEOUT, AGENT_TIMEOUT_ERROR),
    **_rows(Cause.VERIFIER_FAILED, "AddTestsDirError", "DownloadVerifierDirError"),
    **_rows(Cause.VERIFIER_TIMEOUT, VERIFIER_TIMEOUT_ERROR),
    **_rows(Cause.REWARD_FILE_MISSING, "RewardFileNotFoundError"),
    **_rows(Cause.REWARD_FILE_EMPTY, "RewardFileEmptyError"),
    **_rows(Cause.REWARD_FILE_INVALID, "VerifierOutputParseError"),
    **_rows(Cause.CONTEXT_LENGTH_EXCEEDED, "ContextWindowExceededError", "ContextLengthExceededError"),
    **_rows(Cause.OUTPUT_LENGTH_EXCEEDED, "OutputTokenExceededError", "OutputLengthExceededError"),
    **_rows(Cause.AGENT_NONZERO_EXIT, "NonZeroAgentExitCodeError"),
    **_rows(Cause.AGENT_REFUSED_TASK, "AgentSafetyRefusalError", "ContentPolicyViolationError"),
    **_rows(Cause.CANCELLED, "CancelledError"),
    **_rows(Cause.VERIFIER_DISAGREED, VERIFIER_DISAGREED_ERROR),
    **_rows(Cause.CONTROL_INCOMPLETE, CONTROL_INCOMPLETE_ERROR),
    **_rows(Cause.SANDBOX_TREE_REFUSED, SANDBOX_TREE_ERROR),
    **_rows(
        Cause.HARBOR_INTERNAL_ERROR,
        "ServiceOperationsUnsupportedError",
        "VercelScopeError",
        "DspyImportError",
        "MissingExtraError",
        "RegradeError",
        infra_cause=Cause.AGENT_CONFIG_ERROR,
    ),
    **_rows(
        Cause.MODEL_PROVIDER_FAILED,
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
        Cause.MODEL_PROVIDER_FAILED,
        "UnsupportedModelParametersError",
        "BadRequestError",
        "UnprocessableEntityError",
        "UnsupportedParamsError",
        "APIResponseValidationError",
        "BudgetExceededError",
        infra_cause=Cause.MODEL_REQUEST_REJECTED,
    ),
    **_rows(
        Cause.MODEL_PROVIDER_FAILED,
        "AgentAuthenticationError",
        "ModelNotFoundError",
        "ApiProviderResourceNotFoundError",
        "AuthenticationError",
        "PermissionDeniedError",
        "NotFoundError",
        infra_cause=Cause.AGENT_CONFIG_ERROR,
    ),
}

# Harbor 0.25's TrialResult.failure_cause values, for exception types not in the table above.
HARBOR_025_CAUSES: dict[str, Cause] = {
    "sandbox_failed": Cause.SANDBOX_FAILED,
    "model_provider_failed": Cause.MODEL_PROVIDER_FAILED,
    "harbor_failed": Cause.HARBOR_INTERNAL_ERROR,
    "unclassified": Cause.UNCLASSIFIED,
    "agent_exhausted_budget": Cause.AGENT_TIMEOUT,
    "agent_refused_task": Cause.AGENT_REFUSED_TASK,
    "verifier_failed": Cause.VERIFIER_FAILED,
    "cancelled": Cause.CANCELLED,
}


def cause_for_exception_type(exception_type: str, harbor_025_cause: str | None = None) -> Cause:
    """rl360's failure cause for a Harbor-recorded exception type name."""
    if exception_type in HARBOR_EXCEPTIONS:
        return HARBOR_EXCEPTIONS[exception_type].failure_cause
    if harbor_025_cause is not None:
        return HARBOR_025_CAUSES.get(str(harbor_025_cause), Cause.UNCLASSIFIED)
    return Cause.UNCLASSIFIED
