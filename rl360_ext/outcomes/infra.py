"""Infrastructure-failure classifier: the one place that decides whether an attempt's reward counts.

Owns the mapping from what an attempt reports (the Harbor `/run` response fields `reward`,
`reward_source`, `failure_cause`, `exception_type`, plus client-side events: transport errors,
the client deadline, session-server errors, gateway status codes) to an attempt class,
"valid" or "infra:<cause>", and the helper that turns an infra attempt into a Miles sample the
trainer ignores (`mark_infra_sample`). It writes the class into `Sample.metadata` through the
keys of `rl360_ext.outcomes.provenance`; it does not read samples for filtering or baselines
(that is provenance's `attempt_class` / `is_valid`), and it makes no HTTP calls.

Rule: a reward counts only if this run's verifier wrote it. "valid" requires
`reward_source == "verifier"`, a finite numeric reward, no client-side failure and no failure
we classify as infrastructure. Every failure text or exception type not in the tables below
becomes infra ("infra:unclassified" or "infra:harbor_internal_error"), never a reward of 0.

Agent timeout is a policy decision (`agent_timeout_policy`): "score" (default) keeps the
verifier's reward when the verifier ran after the timeout; "mask" turns every agent timeout into
"infra:agent_timeout". Masking looks cleaner but removes exactly the slow, failing attempts from
the batch, so the policy is never penalized for running out the clock; runs that masked timeouts
have been reported to see reward degrade until training collapsed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from rl360_ext.outcomes.harbor_exceptions import AGENT_TIMEOUT_ERROR, HARBOR_EXCEPTIONS, POLICY_CAUSES
from rl360_ext.outcomes.provenance import ATTEMPT_CLASS, INFRA_PREFIX, UNCLASSIFIED, VALID

AGENT_TIMEOUT_POLICIES = ("score", "mask")

# Canonical infrastructure causes ("infra:<cause>"). The rl360 Harbor /run server reports these
# names verbatim in `failure_cause`; Harbor's own exception types (through their failure cause in
# rl360_ext.outcomes.harbor_exceptions) and legacy causes map onto them.
INFRA_CAUSES: dict[str, str] = {
    "aborted": "the attempt was cancelled or aborted before its verifier wrote a reward",
    "no_sandbox": "no sandbox could be started (build/launch failure, no capacity)",
    "sandbox_lost": "the sandbox died or became unreachable during the run",
    "environment_start_timeout": "the sandbox did not start within its timeout",
    "agent_setup_timeout": "installing/starting the agent in the sandbox timed out",
    "verifier_timeout": "the verifier did not finish within its timeout",
    "verifier_crash": "the verifier failed before producing a reward",
    "reward_file_missing": "the verifier finished without writing a reward file",
    "reward_file_empty": "the verifier wrote an empty reward file",
    "reward_file_invalid": "the reward could not be parsed or is not a finite number",
    "harbor_internal_error": "an exception Harbor or the /run server did not expect",
    "client_deadline": "the client's deadline passed before the run returned",
    "transport_error": "the /run request failed in transport (connection reset, refused, bad HTTP)",
    "session_vanished": "the session server lost the trajectory (actor died, session evicted)",
    "no_engine_available": "the model gateway or engine failed (5xx, overloaded, unreachable)",
    "model_request_rejected": "the model endpoint rejected a request (4xx) the agent could not recover from",
    "agent_config_error": "the agent could not authenticate or find its model (configuration)",
    "judge_failure": "the judge the verifier depends on failed",
    "agent_timeout": "the agent timed out (policy 'mask', or no verifier reward after the timeout)",
    "no_verifier_reward": "the run reported no failure but its reward was not written by a verifier",
    "unclassified": "a failure this classifier does not know",
}

# Outcomes of the policy itself: the verifier still grades the final state, so its reward counts.
POLICY_OUTCOME_CAUSES = POLICY_CAUSES | {"agent_exhausted_budget"}
POLICY_OUTCOME_EXCEPTIONS = frozenset(
    name for name, known in HARBOR_EXCEPTIONS.items() if known.failure_cause in POLICY_CAUSES
)
AGENT_TIMEOUT_EXCEPTION = AGENT_TIMEOUT_ERROR

# Harbor <= 0.25 `TrialResult.failure_cause` values that are infrastructure.
_LEGACY_FAILURE_CAUSES: dict[str, str] = {
    "sandbox_failed": "sandbox_lost",
    "model_provider_failed": "no_engine_available",
    "harbor_failed": "harbor_internal_error",
    "verifier_failed": "verifier_crash",
    "cancelled": "aborted",
    "unclassified": "unclassified",
    "memory_limit_exceeded": "sandbox_lost",
    "insufficient_budget": "no_sandbox",
    "insufficient_capacity": "no_sandbox",
    "deadline_exceeded": "client_deadline",
    "reward_key_missing": "reward_file_invalid",
}

_POLICY = "policy"  # verdict: the policy's own outcome, verifier reward counts
_TIMEOUT = "agent_timeout"  # verdict: agent timed out, policy flag decides


def infra_class(cause: str) -> str:
    """ "infra:<cause>" for a canonical cause; a ValueError names an unknown one."""
    if cause not in INFRA_CAUSES:
        raise ValueError(f"unknown infra cause {cause!r}; known causes: {sorted(INFRA_CAUSES)}")
    return f"{INFRA_PREFIX}{cause}"


def is_verifier_reward(reward: Any) -> bool:
    """A reward a verifier can have written: a finite number, or a non-empty flat dict of them."""
    if isinstance(reward, Mapping):
        return bool(reward) and all(_finite_number(v) for v in reward.values())
    return _finite_number(reward)


def _finite_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return False
    return math.isfinite(float(value))


def _cause_verdict(failure_cause: Any) -> str | None:
    if failure_cause is None or failure_cause == "":
        return None
    if not isinstance(failure_cause, str):
        return UNCLASSIFIED
    if failure_cause in POLICY_OUTCOME_CAUSES:
        return _POLICY
    if failure_cause == "agent_timeout":
        return _TIMEOUT
    if failure_cause in INFRA_CAUSES:
        return infra_class(failure_cause)
    if failure_cause in _LEGACY_FAILURE_CAUSES:
        return infra_class(_LEGACY_FAILURE_CAUSES[failure_cause])
    return UNCLASSIFIED


def _exception_verdict(exception_type: Any) -> str | None:
    if exception_type is None or exception_type == "":
        return None
    if not isinstance(exception_type, str):
        return infra_class("harbor_internal_error")
    known = HARBOR_EXCEPTIONS.get(exception_type)
    if known is None:
        return infra_class("harbor_internal_error")
    if known.infra_cause is not None:
        return infra_class(known.infra_cause)
    return _cause_verdict(known.failure_cause)


def _client_side_class(
    transport_error: Any, client_deadline: bool, session_error: str | None, gateway_status: int | None
) -> str | None:
    if client_deadline:
        return infra_class("client_deadline")
    if session_error:
        return infra_class(session_error) if session_error in INFRA_CAUSES else UNCLASSIFIED
    if gateway_status is not None:
        if not isinstance(gateway_status, int) or isinstance(gateway_status, bool):
            raise ValueError(f"gateway_status must be an int HTTP status, got {gateway_status!r}")
        if gateway_status >= 500 or gateway_status == 429:
            return infra_class("no_engine_available")
        if gateway_status >= 400:
            return infra_class("model_request_rejected")
    if transport_error is not None and transport_error is not False:
        return infra_class("transport_error")
    return None


def worst_engine_failure(metadata: Mapping[str, Any] | None) -> int | None:
    """The highest 5xx status among the session's failed turns (`metadata["session"]["turn_errors"]`,
    as rl360's session server reports them to Miles), or None when no turn failed that way."""
    session = metadata.get("session") if isinstance(metadata, Mapping) else None
    errors = session.get("turn_errors") if isinstance(session, Mapping) else None
    statuses = [
        int(error["status"])
        for error in errors or []
        if isinstance(error, Mapping) and isinstance(error.get("status"), int) and error["status"] >= 500
    ]
    return max(statuses, default=None)


def classify_attempt(
    run_result: Mapping[str, Any] | None,
    *,
    transport_error: BaseException | str | bool | None = None,
    client_deadline: bool = False,
    session_error: str | None = None,
    gateway_status: int | None = None,
    agent_timeout_policy: str = "score",
) -> str:
    """Classify one attempt as "valid" or "infra:<cause>".

    `run_result` is the Harbor /run response (keys `reward`, `reward_source`, `failure_cause`,
    `exception_type`; others ignored) or None when no response arrived. Client-side events win
    over the response: `client_deadline` (the client gave up), `session_error` (a cause name from
    the session server, e.g. "session_vanished"), `gateway_status` (worst HTTP status the
    gateway returned to the agent: 5xx/429 -> no_engine_available, other 4xx ->
    model_request_rejected), `transport_error` (anything truthy).
    """
    if agent_timeout_policy not in AGENT_TIMEOUT_POLICIES:
        raise ValueError(
            f"agent_timeout_policy must be one of {AGENT_TIMEOUT_POLICIES}, got {agent_timeout_policy!r}"
        )
    client_side = _client_side_class(transport_error, client_deadline, session_error, gateway_status)
    if client_side is not None:
        return client_side
    if run_result is None:
        return UNCLASSIFIED
    if not isinstance(run_result, Mapping):
        raise ValueError(
            f"run_result must be a dict (the /run response) or None, got {type(run_result).__name__}"
        )

    cause_verdict = _cause_verdict(run_result.get("failure_cause"))
    exception_verdict = _exception_verdict(run_result.get("exception_type"))
    # Harbor's coarse causes (sandbox_failed, verifier_failed, ...) yield to a specific exception:
    # a sandbox that never started (SandboxBuildFailedError) is no_sandbox, not sandbox_lost.
    specific = exception_verdict not in (None, _POLICY, _TIMEOUT, infra_class("harbor_internal_error"))
    coarse = (
        isinstance(run_result.get("failure_cause"), str)
        and run_result["failure_cause"] in _LEGACY_FAILURE_CAUSES
    )
    if coarse and specific:
        verdicts = [exception_verdict, cause_verdict]
    else:
        verdicts = [cause_verdict, exception_verdict]
    infra = [v for v in verdicts if v is not None and v.startswith(INFRA_PREFIX)]
    if infra:
        return infra[0]
    timed_out = _TIMEOUT in verdicts
    if timed_out and agent_timeout_policy == "mask":
        return infra_class("agent_timeout")

    if run_result.get("reward_source") != "verifier":
        return infra_class("agent_timeout") if timed_out else infra_class("no_verifier_reward")
    if not is_verifier_reward(run_result.get("reward")):
        return infra_class("reward_file_invalid")
    return VALID


def mark_infra_sample(
    sample: Any,
    attempt_class: str,
    *,
    detail: str | None = None,
    fallback_token_id: int | None = None,
    routed_experts_shape: tuple[int, int] | None = None,
) -> Any:
    """Make `sample` (a Miles Sample or duck-typed equivalent) an infra sample Miles trains on nothing.

    Sets metadata[ATTEMPT_CLASS] (and metadata["infra_detail"] when `detail` is given), a loss
    mask of zeros, `remove_sample = True` and `reward = None` (excluded, never 0). Per-token
    fields are made consistent with the tokens so Miles can still batch the sample:
    `rollout_log_probs` becomes zeros when missing, `rollout_routed_experts` is padded with zero
    rows to `len(tokens) - 1` (or created from `routed_experts_shape` = (layers, top_k)).

    An attempt with no response tokens (aborted before generating) gets a one-token response that
    borrows the prompt's last token (or `fallback_token_id`, twice, when the sample has no tokens
    at all). That token is masked out (loss mask 0) and carries log-prob 0.0; it only exists so
    tensors line up. `attempt_class` is "infra:<cause>" or a bare cause.
    """
    if attempt_class == VALID:
        raise ValueError("mark_infra_sample needs an infra class or cause, got 'valid'")
    cause = attempt_class.removeprefix(INFRA_PREFIX)
    cls = infra_class(cause)

    metadata = sample.metadata if isinstance(getattr(sample, "metadata", None), dict) else {}
    metadata[ATTEMPT_CLASS] = cls
    if detail is not None:
        metadata["infra_detail"] = detail
    sample.metadata = metadata

    if int(sample.response_length) <= 0:
        _borrow_one_token(sample, fallback_token_id)
    response_length = int(sample.response_length)
    sample.loss_mask = [0] * response_length
    log_probs = getattr(sample, "rollout_log_probs", None)
    if log_probs is None or len(log_probs) != response_length:
        sample.rollout_log_probs = [0.0] * response_length
    _fit_routed_experts(sample, routed_experts_shape)
    sample.remove_sample = True
    sample.reward = None
    return sample


def _borrow_one_token(sample: Any, fallback_token_id: int | None) -> None:
    tokens = list(sample.tokens or [])
    if not tokens:
        if fallback_token_id is None:
            raise ValueError(
                "sample has no tokens; pass fallback_token_id (e.g. the tokenizer's eos or pad id) "
                "so the masked placeholder response can be built"
            )
        tokens = [int(fallback_token_id)]
    tokens.append(tokens[-1])
    sample.tokens = tokens
    sample.response_length = 1
    if getattr(sample, "response", None) is None:
        sample.response = ""


def _fit_routed_experts(sample: Any, routed_experts_shape: tuple[int, int] | None) -> None:
    rows = len(sample.tokens) - 1
    routed = getattr(sample, "rollout_routed_experts", None)
    if routed is None:
        if routed_experts_shape is not None:
            sample.rollout_routed_experts = np.zeros((rows, *routed_experts_shape), dtype=np.int32)
        return
    routed = np.asarray(routed, dtype=np.int32)
    if routed.ndim != 3:
        raise ValueError(
            f"rollout_routed_experts must be [tokens-1, layers, top_k], got shape {routed.shape}"
        )
    if len(routed) < rows:
        padding = np.zeros((rows - len(routed), *routed.shape[1:]), dtype=np.int32)
        routed = np.concatenate([routed, padding])
    sample.rollout_routed_experts = routed[:rows]
