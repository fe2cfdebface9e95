"""The verdict: a failure is infra unless a verifier wrote a finite reward for a policy outcome.

Each case goes the way an attempt does: the Harbor server's verdict on the reported fields
(`attempt_class_of`, the last step of `judge`), then the client reading it with what only the
client saw (`attempt_class`).
"""

from __future__ import annotations

import math
from dataclasses import asdict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl360_ext.outcomes.attribution import AttributionRule
from rl360_ext.outcomes.causes import INFRA_CAUSES, POLICY_OUTCOME_CAUSES, Cause
from rl360_ext.outcomes.harbor_exceptions import AGENT_TIMEOUT_ERROR as AGENT_TIMEOUT_EXCEPTION
from rl360_ext.outcomes.harbor_exceptions import HARBOR_EXCEPTIONS
from rl360_ext.outcomes.infra import mark_infra_sample
from rl360_ext.outcomes.provenance import ATTEMPT_CLASS, attempt_class, is_valid
from rl360_ext.outcomes.verdict import (
    POLICY_LIMIT_CAUSES,
    POLICY_OUTCOME_EXCEPTIONS,
    TrialFacts,
    attempt_class_of,
    judge,
)
from rl360_ext.outcomes.verdict import attempt_class as client_attempt_class

from .duck_samples import DuckSample


def verdict_then_read(result: object, *, agent_timeout_policy: str = "score", **events: object) -> str:
    """The server's verdict on `result` (its answer carries it), read by the client with its events."""
    answer = result
    if isinstance(result, dict):
        answer = {**result, ATTEMPT_CLASS: attempt_class_of(result)}
    return client_attempt_class(answer, agent_timeout_policy=agent_timeout_policy, **events)  # type: ignore[arg-type]


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
    assert verdict_then_read(result, **events) == expected


def test_agent_timeout_policy() -> None:
    timed_out = run(reward=0.0, exc=AGENT_TIMEOUT_EXCEPTION)
    assert verdict_then_read(timed_out) == "valid"
    assert verdict_then_read(timed_out, agent_timeout_policy="mask") == "infra:agent_timeout"
    assert verdict_then_read(run(reward=0.0, cause="agent_timeout")) == "valid"
    assert (
        verdict_then_read(run(source=None, reward=None, exc=AGENT_TIMEOUT_EXCEPTION)) == "infra:agent_timeout"
    )
    with pytest.raises(ValueError, match="agent_timeout_policy"):
        verdict_then_read(timed_out, agent_timeout_policy="ignore")


def test_bad_inputs_name_the_field() -> None:
    with pytest.raises(ValueError, match="recorded"):
        verdict_then_read(["reward", 1.0])
    with pytest.raises(ValueError, match="gateway_status"):
        verdict_then_read(run(), gateway_status="503")


def test_every_harbor_exception_without_a_valid_reward_is_infra() -> None:
    """Harbor's own policy table: whatever Harbor says carries no valid reward must be infra here."""
    error_policy = pytest.importorskip("harbor.models.trial.error_policy")
    for name, policy in error_policy.ERROR_POLICIES.items():
        cls = verdict_then_read(run(exc=name))
        if not policy.has_valid_reward:
            assert cls.startswith("infra:"), name
        else:
            assert cls == "valid", name
    assert error_policy.UNKNOWN_ERROR_POLICY.has_valid_reward  # Harbor keeps unknowns; we do not
    assert verdict_then_read(run(exc="BrandNewHarborError")) == "infra:harbor_internal_error"


def test_every_harbor_exception_row_is_known_to_the_classifier() -> None:
    """The /run server's failure causes and the classifier's finer causes come from one table."""
    for name, known in HARBOR_EXCEPTIONS.items():
        assert verdict_then_read(run(cause=known.failure_cause)) != "infra:unclassified", name
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
    cls = verdict_then_read(
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
    never_started = {"failure_cause": "sandbox_failed", "exception_type": "SandboxBuildFailedError"}
    assert verdict_then_read(never_started) == "infra:no_sandbox"
    unknown = {"failure_cause": "sandbox_failed", "exception_type": "SomethingNew"}
    assert verdict_then_read(unknown) == "infra:sandbox_lost"
    assert verdict_then_read({"failure_cause": "insufficient_budget"}) == "infra:no_sandbox"
    assert verdict_then_read({"failure_cause": "deadline_exceeded"}) == "infra:client_deadline"


def test_a_judge_failure_is_infra_even_with_a_fallback_reward() -> None:
    fallback = {"reward": 0.0, "reward_source": "verifier", "failure_cause": "judge_failure"}
    assert verdict_then_read(fallback) == "infra:judge_failure"


def test_the_client_reads_the_servers_verdict_and_never_classifies_again() -> None:
    graded = run()
    assert (
        client_attempt_class({**graded, ATTEMPT_CLASS: "infra:verifier_timeout"}) == "infra:verifier_timeout"
    )
    assert client_attempt_class(graded) == "infra:unclassified"  # no verdict: no reward
    assert client_attempt_class({**graded, ATTEMPT_CLASS: "infra:gremlins"}) == "infra:unclassified"
    assert client_attempt_class({**run(cause="sandbox_lost"), ATTEMPT_CLASS: "valid"}) == "infra:unclassified"
    assert client_attempt_class({**run(source=None), ATTEMPT_CLASS: "valid"}) == "infra:no_verifier_reward"
    assert (
        client_attempt_class({**run(reward=math.inf), ATTEMPT_CLASS: "valid"}) == "infra:reward_file_invalid"
    )


@pytest.mark.parametrize(
    ("facts", "expected", "cause"),
    [
        (TrialFacts(rewards={"reward": 0.5}), "valid", None),
        (TrialFacts(), "infra:reward_file_missing", Cause.REWARD_FILE_MISSING),
        (TrialFacts(rewards={"a": 1.0, "b": 0.0}), "infra:reward_file_invalid", Cause.REWARD_KEY_MISSING),
        (TrialFacts(rewards={"reward": 0.0}, test_exit_code=75), "infra:judge_failure", Cause.JUDGE_FAILURE),
        (
            TrialFacts(exception_type="RewardFileNotFoundError", test_exit_code=2),
            "infra:verifier_crash",
            Cause.VERIFIER_CRASH,
        ),
        (
            TrialFacts(rewards={"reward": 0.0}, exception_type="NonZeroAgentExitCodeError"),
            "valid",
            Cause.AGENT_NONZERO_EXIT,
        ),
        (  # graded after the timeout: the verifier's grade counts (issue 34)
            TrialFacts(rewards={"reward": 0.0}, exception_type=AGENT_TIMEOUT_EXCEPTION),
            "valid",
            Cause.AGENT_TIMEOUT,
        ),
        (  # the cause list alone (`--attribution list`): a timed-out attempt is not graded
            TrialFacts(
                rewards={"reward": 0.0}, exception_type=AGENT_TIMEOUT_EXCEPTION, rule=AttributionRule.LIST
            ),
            "infra:agent_timeout",
            Cause.AGENT_TIMEOUT,
        ),
        (
            TrialFacts(failure_cause=Cause.INSUFFICIENT_CAPACITY, exception_type="AdmissionRefused"),
            "infra:no_sandbox",
            Cause.INSUFFICIENT_CAPACITY,
        ),
        (TrialFacts(failure_cause=Cause.DEADLINE_EXCEEDED), "infra:client_deadline", Cause.DEADLINE_EXCEEDED),
    ],
)
def test_judge_gives_one_verdict_per_trial(facts: TrialFacts, expected: str, cause: Cause | None) -> None:
    verdict = judge(facts)
    assert (verdict.attempt_class, verdict.failure_cause) == (expected, cause)
    assert (verdict.reward is not None) == (verdict.reward_source == "verifier")
    assert verdict.attempt_class != "valid" or verdict.reward is not None


@settings(max_examples=200, deadline=None)
@given(
    rewards=st.one_of(
        st.none(), st.dictionaries(st.sampled_from(["reward", "x"]), st.floats(-1, 1), min_size=1, max_size=2)
    ),
    exception=st.one_of(st.none(), st.sampled_from(sorted(HARBOR_EXCEPTIONS)), st.text(max_size=8)),
    keeps=st.booleans(),
    exit_code=st.one_of(st.none(), st.integers(0, 80)),
    outside=st.one_of(st.none(), st.sampled_from(list(Cause))),
)
def test_a_verdict_counts_a_reward_only_when_the_verifier_wrote_it(
    rewards: dict | None, exception: str | None, keeps: bool, exit_code: int | None, outside: Cause | None
) -> None:
    verdict = judge(TrialFacts(rewards, exception, None, keeps, exit_code, outside))
    assert verdict.attempt_class == "valid" or verdict.attempt_class.removeprefix("infra:") in INFRA_CAUSES
    scored = verdict.reward_source in ("verifier", "floor")
    assert (verdict.reward is not None) == scored == (verdict.rewards is not None)
    if verdict.reward_source == "floor":  # no known-good evidence here: only a tree the host refused
        assert verdict.failure_cause == Cause.SANDBOX_TREE_REFUSED and verdict.attributed_to == "policy"
    elif verdict.reward is not None:
        assert rewards is not None and outside is None and exit_code != 75 and (exit_code or 0) < 128
        policy_limit = verdict.attributed_to == "policy" and verdict.failure_cause in POLICY_LIMIT_CAUSES
        assert verdict.failure_cause is None or verdict.failure_cause in POLICY_OUTCOME_CAUSES or policy_limit
    if verdict.attempt_class == "valid":
        assert verdict.reward is not None and client_attempt_class(asdict(verdict)) == "valid"
