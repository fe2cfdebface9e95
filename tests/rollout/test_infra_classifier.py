"""The infra classifier: a failure is infra unless a verifier wrote a finite reward for a policy outcome."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl360_ext.outcomes.harbor_exceptions import HARBOR_EXCEPTIONS
from rl360_ext.outcomes.infra import (
    AGENT_TIMEOUT_EXCEPTION,
    INFRA_CAUSES,
    POLICY_OUTCOME_CAUSES,
    POLICY_OUTCOME_EXCEPTIONS,
    classify_attempt,
    mark_infra_sample,
)
from rl360_ext.outcomes.provenance import attempt_class, is_valid

from .duck_samples import DuckSample


def run(reward: object = 1.0, source: object = "verifier", cause: object = None, exc: object = None) -> dict:
    return {"reward": reward, "reward_source": source, "failure_cause": cause, "exception_type": exc}


@pytest.mark.parametrize(
    ("result", "events", "expected"),
    [
        (run(), {}, "valid"),
        (run(reward=0.0), {}, "valid"),
        (run(reward=0, exc="NonZeroAgentExitCodeError"), {}, "valid"),
        (run(reward=0.0, exc="ContextLengthExceededError"), {}, "valid"),
        (run(reward=0.0, cause="agent_exhausted_budget"), {}, "valid"),
        (run(reward={"reward": 0.5, "tests": 1.0}), {}, "valid"),
        (run(source=None), {}, "infra:no_verifier_reward"),
        (run(source="default"), {}, "infra:no_verifier_reward"),
        (run(reward=None), {}, "infra:reward_file_invalid"),
        (run(reward=math.nan), {}, "infra:reward_file_invalid"),
        (run(reward=True), {}, "infra:reward_file_invalid"),
        (run(reward="1.0"), {}, "infra:reward_file_invalid"),
        (run(exc="RewardFileNotFoundError"), {}, "infra:reward_file_missing"),
        (run(exc="RewardFileEmptyError"), {}, "infra:reward_file_empty"),
        (run(exc="VerifierOutputParseError"), {}, "infra:reward_file_invalid"),
        (run(exc="VerifierTimeoutError"), {}, "infra:verifier_timeout"),
        (
            run(exc="EnvironmentStartTimeoutError", source=None, reward=None),
            {},
            "infra:environment_start_timeout",
        ),
        (run(exc="SandboxBuildFailedError", source=None), {}, "infra:no_sandbox"),
        (run(exc="SandboxLikelyOutOfMemoryError"), {}, "infra:sandbox_lost"),
        (run(exc="CancelledError"), {}, "infra:aborted"),
        (run(exc="ApiInternalServerError"), {}, "infra:no_engine_available"),
        (run(exc="KeyError"), {}, "infra:harbor_internal_error"),
        (run(cause="no_sandbox"), {}, "infra:no_sandbox"),
        (run(cause="sandbox_lost"), {}, "infra:sandbox_lost"),
        (run(cause="verifier_crash"), {}, "infra:verifier_crash"),
        (run(cause="judge_failure"), {}, "infra:judge_failure"),
        (run(cause="harbor_internal_error"), {}, "infra:harbor_internal_error"),
        (run(cause="sandbox_failed"), {}, "infra:sandbox_lost"),
        (run(cause="model_provider_failed"), {}, "infra:no_engine_available"),
        (run(cause="cancelled"), {}, "infra:aborted"),
        (run(cause="something new"), {}, "infra:unclassified"),
        (run(cause="no_sandbox", exc="NonZeroAgentExitCodeError"), {}, "infra:no_sandbox"),
        (None, {}, "infra:unclassified"),
        (None, {"transport_error": ConnectionResetError("reset")}, "infra:transport_error"),
        (run(), {"client_deadline": True}, "infra:client_deadline"),
        (None, {"client_deadline": True, "transport_error": "timeout"}, "infra:client_deadline"),
        (run(), {"session_error": "session_vanished"}, "infra:session_vanished"),
        (run(), {"session_error": "aborted"}, "infra:aborted"),
        (run(), {"session_error": "mystery"}, "infra:unclassified"),
        (run(), {"gateway_status": 503}, "infra:no_engine_available"),
        (run(), {"gateway_status": 429}, "infra:no_engine_available"),
        (run(), {"gateway_status": 400}, "infra:model_request_rejected"),
        (run(), {"gateway_status": 200}, "valid"),
    ],
)
def test_classification_table(result: dict | None, events: dict, expected: str) -> None:
    assert classify_attempt(result, **events) == expected


def test_agent_timeout_policy() -> None:
    timed_out = run(reward=0.0, exc=AGENT_TIMEOUT_EXCEPTION)
    assert classify_attempt(timed_out) == "valid"
    assert classify_attempt(timed_out, agent_timeout_policy="mask") == "infra:agent_timeout"
    assert classify_attempt(run(reward=0.0, cause="agent_timeout")) == "valid"
    assert (
        classify_attempt(run(source=None, reward=None, exc=AGENT_TIMEOUT_EXCEPTION)) == "infra:agent_timeout"
    )
    with pytest.raises(ValueError, match="agent_timeout_policy"):
        classify_attempt(timed_out, agent_timeout_policy="ignore")


def test_bad_inputs_name_the_field() -> None:
    with pytest.raises(ValueError, match="run_result"):
        classify_attempt(["reward", 1.0])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gateway_status"):
        classify_attempt(run(), gateway_status="503")  # type: ignore[arg-type]


def test_every_harbor_exception_without_a_valid_reward_is_infra() -> None:
    """Harbor's own policy table: whatever Harbor says carries no valid reward must be infra here."""
    error_policy = pytest.importorskip("harbor.models.trial.error_policy")
    for name, policy in error_policy.ERROR_POLICIES.items():
        cls = classify_attempt(run(exc=name))
        if not policy.has_valid_reward:
            assert cls.startswith("infra:"), name
        else:
            assert cls == "valid", name
    assert error_policy.UNKNOWN_ERROR_POLICY.has_valid_reward  # Harbor keeps unknowns; we do not
    assert classify_attempt(run(exc="BrandNewHarborError")) == "infra:harbor_internal_error"


def test_every_harbor_exception_row_is_known_to_the_classifier() -> None:
    """The /run server's failure causes and the classifier's finer causes come from one table."""
    for name, known in HARBOR_EXCEPTIONS.items():
        assert classify_attempt(run(cause=known.failure_cause)) != "infra:unclassified", name
        assert known.infra_cause is None or known.infra_cause in INFRA_CAUSES, name


KNOWN_OUTCOME_CAUSES = {None, "", "agent_timeout", *POLICY_OUTCOME_CAUSES}
KNOWN_OUTCOME_EXCEPTIONS = {None, "", AGENT_TIMEOUT_EXCEPTION, *POLICY_OUTCOME_EXCEPTIONS}
texts = st.one_of(st.none(), st.text(max_size=16), st.sampled_from(sorted(INFRA_CAUSES)))
causes = st.one_of(
    texts, st.sampled_from(sorted(POLICY_OUTCOME_CAUSES | {"agent_timeout", "sandbox_failed"}))
)
exceptions = st.one_of(texts, st.sampled_from(sorted(POLICY_OUTCOME_EXCEPTIONS | {AGENT_TIMEOUT_EXCEPTION})))
rewards = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-3, 3),
    st.text(max_size=4),
    st.dictionaries(st.text(max_size=4), st.floats(allow_nan=True), max_size=3),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    result=st.one_of(
        st.none(),
        st.fixed_dictionaries(
            {},
            optional={
                "reward": rewards,
                "reward_source": st.one_of(st.none(), st.sampled_from(["verifier", "judge", "default", ""])),
                "failure_cause": causes,
                "exception_type": exceptions,
                "status": st.text(max_size=8),
            },
        ),
    ),
    transport=st.one_of(st.none(), st.just("reset"), st.just(False)),
    deadline=st.booleans(),
    session_error=st.one_of(st.none(), st.text(max_size=10), st.sampled_from(sorted(INFRA_CAUSES))),
    gateway=st.one_of(st.none(), st.integers(100, 599)),
    policy=st.sampled_from(["score", "mask"]),
)
def test_no_path_from_an_unclassified_failure_to_a_valid_reward(
    result: dict | None,
    transport: str | bool | None,
    deadline: bool,
    session_error: str | None,
    gateway: int | None,
    policy: str,
) -> None:
    cls = classify_attempt(
        result,
        transport_error=transport,
        client_deadline=deadline,
        session_error=session_error,
        gateway_status=gateway,
        agent_timeout_policy=policy,
    )
    assert cls == "valid" or (cls.startswith("infra:") and cls.removeprefix("infra:") in INFRA_CAUSES)
    if cls != "valid":
        return
    assert result is not None and result.get("reward_source") == "verifier"
    assert not deadline and not session_error and not transport
    assert gateway is None or gateway < 400
    assert result.get("failure_cause") in KNOWN_OUTCOME_CAUSES
    assert result.get("exception_type") in KNOWN_OUTCOME_EXCEPTIONS
    reward = result["reward"]
    values = list(reward.values()) if isinstance(reward, dict) else [reward]
    assert values and all(
        not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) for v in values
    )
    timed_out = (
        result.get("exception_type") == AGENT_TIMEOUT_EXCEPTION
        or result.get("failure_cause") == "agent_timeout"
    )
    assert not (timed_out and policy == "mask")


def test_mark_infra_sample_excludes_the_sample() -> None:
    sample = DuckSample(
        group_index=3,
        index=7,
        reward=0.0,
        response_length=2,
        loss_mask=[1, 1],
        rollout_log_probs=[-0.1, -0.2],
    )
    sample.metadata = {"reward_source": "verifier"}
    mark_infra_sample(sample, "infra:verifier_timeout", detail="600 s")
    assert attempt_class(sample) == "infra:verifier_timeout" and not is_valid(sample)
    assert sample.loss_mask == [0, 0] and sample.remove_sample and sample.reward is None
    assert sample.rollout_log_probs == [-0.1, -0.2]
    assert sample.metadata["infra_detail"] == "600 s"


def test_aborted_attempt_without_tokens_borrows_the_prompts_last_token() -> None:
    sample = DuckSample(tokens=[5, 6, 9], response="", response_length=0)
    sample.rollout_routed_experts = np.ones((2, 3, 2), dtype=np.int32)
    mark_infra_sample(sample, "aborted")
    assert sample.tokens == [5, 6, 9, 9] and sample.response_length == 1
    assert sample.loss_mask == [0] and sample.rollout_log_probs == [0.0]
    assert sample.rollout_routed_experts.shape == (3, 3, 2)
    assert sample.rollout_routed_experts[-1].sum() == 0 and sample.rollout_routed_experts[:2].sum() == 12
    assert attempt_class(sample) == "infra:aborted"


def test_attempt_without_any_tokens_needs_a_fallback_token() -> None:
    with pytest.raises(ValueError, match="fallback_token_id"):
        mark_infra_sample(DuckSample(tokens=[], response_length=0), "transport_error")
    sample = mark_infra_sample(
        DuckSample(tokens=[], response_length=0),
        "transport_error",
        fallback_token_id=0,
        routed_experts_shape=(4, 2),
    )
    assert sample.tokens == [0, 0] and sample.response_length == 1 and sample.loss_mask == [0]
    assert sample.rollout_routed_experts.shape == (1, 4, 2)


def test_mark_rejects_valid_and_unknown_causes() -> None:
    with pytest.raises(ValueError, match="valid"):
        mark_infra_sample(DuckSample(), "valid")
    with pytest.raises(ValueError, match="unknown infra cause"):
        mark_infra_sample(DuckSample(), "infra:gremlins")


def test_a_coarse_harbor_cause_yields_to_a_specific_exception() -> None:
    from rl360_ext.outcomes.infra import classify_attempt

    never_started = {"failure_cause": "sandbox_failed", "exception_type": "SandboxBuildFailedError"}
    assert classify_attempt(never_started) == "infra:no_sandbox"
    unknown = {"failure_cause": "sandbox_failed", "exception_type": "SomethingNew"}
    assert classify_attempt(unknown) == "infra:sandbox_lost"
    assert classify_attempt({"failure_cause": "insufficient_budget"}) == "infra:no_sandbox"
    assert classify_attempt({"failure_cause": "deadline_exceeded"}) == "infra:client_deadline"


def test_a_judge_failure_is_infra_even_with_a_fallback_reward() -> None:
    from rl360_ext.outcomes.infra import classify_attempt

    fallback = {"reward": 0.0, "reward_source": "verifier", "failure_cause": "judge_failure"}
    assert classify_attempt(fallback) == "infra:judge_failure"
