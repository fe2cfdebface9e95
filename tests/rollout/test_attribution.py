"""Attribution by evidence (issue 34): the rules of docs/harbor.md's table, on the verdict alone.

Each row of the table is a case here; the properties check that whatever the verdict decides, the
/run answer it becomes reads back on the client as the same class, that a reward counts only with
its provenance, and that the vocabulary round-trips through JSON."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.outcomes.attribution import (
    ATTRIBUTED_TO,
    EVIDENCE,
    Attribution,
    AttributionRule,
    Control,
    Evidence,
    LimitHit,
    Phase,
    Resource,
)
from rl360_ext.outcomes.causes import Cause
from rl360_ext.outcomes.known_good import KnownGood, from_audit_evidence
from rl360_ext.outcomes.verdict import TrialFacts, Verdict, judge, needs_known_good, read_verdict

HEALTHY = KnownGood(True, Control.REGRADE, "graded the oracle's end state")
FAILING = KnownGood(False, Control.AUDIT, "timed out on the oracle's end state too")
UNKNOWN = KnownGood(None, Control.NONE, "no control finished")


def answer(verdict: Verdict) -> dict[str, Any]:
    """The /run answer's verdict fields, as `rl360_ext.harbor.outcome` writes them."""
    return {
        "attempt_class": verdict.attempt_class,
        "reward": verdict.reward,
        "rewards": verdict.rewards,
        "reward_source": verdict.reward_source,
        "failure_cause": None if verdict.failure_cause is None else verdict.failure_cause.value,
        "exception_type": None,
        ATTRIBUTED_TO: None if verdict.attributed_to is None else verdict.attributed_to.value,
        EVIDENCE: None if verdict.evidence is None else verdict.evidence.as_json(),
    }


def verifier_failure(exception: str | None = None, **facts: Any) -> TrialFacts:
    return TrialFacts(
        exception_type=exception, exception_phase=Phase.VERIFIER, verifier_started=True, **facts
    )


@pytest.mark.parametrize(
    ("facts", "klass", "who", "reward", "source"),
    [
        # outside the sandbox: infrastructure, whatever the rule
        (
            TrialFacts(failure_cause=Cause.DEADLINE_EXCEEDED),
            "infra:client_deadline",
            "infrastructure",
            None,
            None,
        ),
        (
            TrialFacts(exception_type="SandboxBuildFailedError", exception_phase=Phase.ENVIRONMENT_SETUP),
            "infra:no_sandbox",
            "infrastructure",
            None,
            None,
        ),
        (
            TrialFacts(exception_type="ApiInternalServerError", exception_phase=Phase.AGENT),
            "infra:no_engine_available",
            "infrastructure",
            None,
            None,
        ),
        (
            TrialFacts(rewards={"reward": 0.0}, test_exit_code=75, verifier_started=True),
            "infra:judge_failure",
            "infrastructure",
            None,
            None,
        ),
        # the agent phase: the policy's, graded
        (
            TrialFacts(
                rewards={"reward": 0.0},
                exception_type="NonZeroAgentExitCodeError",
                exception_phase=Phase.AGENT,
                verifier_started=True,
            ),
            "valid",
            "policy",
            0.0,
            "verifier",
        ),
        (
            TrialFacts(
                rewards={"reward": 1.0},
                exception_type="MemoryLimitExceededError",
                exception_phase=Phase.AGENT,
                verifier_started=True,
            ),
            "valid",
            "policy",
            1.0,
            "verifier",
        ),
        (
            TrialFacts(
                rewards={"reward": 0.0},
                exception_type="AgentTimeoutError",
                exception_phase=Phase.AGENT,
                verifier_started=True,
            ),
            "valid",
            "policy",
            0.0,
            "verifier",
        ),
        (
            TrialFacts(
                rewards={"reward": 1.0},
                verifier_started=True,
                limit_hits=(LimitHit(Phase.AGENT, Resource.DISK),),
            ),
            "valid",
            "policy",
            1.0,
            "verifier",
        ),
        # nothing failed: no attribution
        (TrialFacts(rewards={"reward": 1.0}, verifier_started=True), "valid", None, 1.0, "verifier"),
        # the verifier phase: the known-good state decides
        (verifier_failure("VerifierTimeoutError", known_good=HEALTHY), "valid", "policy", 0.0, "floor"),
        (
            verifier_failure("VerifierTimeoutError", known_good=FAILING),
            "infra:verifier_timeout",
            "task",
            None,
            None,
        ),
        (
            verifier_failure("VerifierTimeoutError", known_good=UNKNOWN),
            "infra:verifier_timeout",
            "infrastructure",
            None,
            None,
        ),
        (verifier_failure("VerifierTimeoutError"), "infra:verifier_timeout", "infrastructure", None, None),
        (verifier_failure("MemoryLimitExceededError", known_good=HEALTHY), "valid", "policy", 0.0, "floor"),
        (
            verifier_failure("RewardFileNotFoundError", test_exit_code=1, known_good=HEALTHY),
            "valid",
            "policy",
            0.0,
            "floor",
        ),
        (
            verifier_failure(
                "SandboxBuildFailedError",
                known_good=HEALTHY,
                limit_hits=(LimitHit(Phase.VERIFIER, Resource.PIDS),),
            ),
            "valid",
            "policy",
            0.0,
            "floor",
        ),
        # the sandbox lost in the verifier phase with no limit hit: not the policy's
        (
            verifier_failure("HealthcheckError", known_good=HEALTHY),
            "infra:sandbox_lost",
            "infrastructure",
            None,
            None,
        ),
        # an agent timeout, then a verifier that failed on what it left: the floor, evidence says so
        (
            TrialFacts(
                exception_type="AgentTimeoutError",
                exception_phase=Phase.AGENT,
                verifier_started=True,
                verifier_failure="VerifierTimeoutError",
                known_good=HEALTHY,
            ),
            "valid",
            "policy",
            0.0,
            "floor",
        ),
        # a tree the policy left past the host's caps: the policy's, by the rule alone
        (
            TrialFacts(
                exception_type="SandboxTreeError", exception_phase=Phase.VERIFIER, verifier_started=True
            ),
            "valid",
            "policy",
            0.0,
            "floor",
        ),
        # a test script killed by a signal (possibly by the code it ran): its reward file does not count
        (
            verifier_failure(rewards={"reward": 1.0}, test_exit_code=137, known_good=HEALTHY),
            "valid",
            "policy",
            0.0,
            "floor",
        ),
        (
            verifier_failure(rewards={"reward": 1.0}, test_exit_code=137, known_good=FAILING),
            "infra:verifier_crash",
            "task",
            None,
            None,
        ),
        # the task's own floor
        (
            verifier_failure("VerifierTimeoutError", known_good=HEALTHY, floor_reward=-1.0),
            "valid",
            "policy",
            -1.0,
            "floor",
        ),
    ],
)
def test_each_row_of_the_table(
    facts: TrialFacts, klass: str, who: str | None, reward: float | None, source: str | None
) -> None:
    verdict = judge(facts)
    assert (verdict.attempt_class, verdict.reward, verdict.reward_source) == (klass, reward, source)
    assert (verdict.attributed_to.value if verdict.attributed_to else None) == who
    assert (verdict.evidence is None) == (who is None)
    assert read_verdict(answer(verdict)) == klass  # the client keeps what the server decided


def test_the_evidence_names_the_phase_the_resource_and_the_control() -> None:
    oom = judge(verifier_failure("MemoryLimitExceededError", known_good=HEALTHY))
    assert oom.evidence == Evidence(
        Phase.VERIFIER,
        Control.REGRADE,
        Resource.MEMORY,
        "memory_limit_exceeded",
        "graded the oracle's end state",
    )
    forked = judge(
        verifier_failure(
            "VerifierTimeoutError", known_good=HEALTHY, limit_hits=(LimitHit(Phase.VERIFIER, Resource.PIDS),)
        )
    )
    assert forked.evidence is not None and forked.evidence.resource == Resource.PIDS
    disk = judge(
        TrialFacts(
            rewards={"reward": 1.0},
            verifier_started=True,
            limit_hits=(LimitHit(Phase.AGENT, Resource.INODES, "tmpfs full"),),
        )
    )
    assert disk.evidence == Evidence(Phase.AGENT, Control.RULE, Resource.INODES, None, "tmpfs full")


def test_the_list_rule_is_the_cause_list_alone() -> None:
    listed = AttributionRule.LIST
    timeout = judge(
        TrialFacts(
            rewards={"reward": 0.0},
            exception_type="AgentTimeoutError",
            exception_phase=Phase.AGENT,
            rule=listed,
        )
    )
    assert (timeout.attempt_class, timeout.attributed_to) == (
        "infra:agent_timeout",
        Attribution.INFRASTRUCTURE,
    )
    oom = judge(
        TrialFacts(
            rewards={"reward": 1.0},
            exception_type="MemoryLimitExceededError",
            exception_phase=Phase.AGENT,
            verifier_started=True,
            rule=listed,
        )
    )
    assert oom.attempt_class == "infra:sandbox_lost"
    hang = verifier_failure("VerifierTimeoutError", known_good=HEALTHY, rule=listed)
    assert judge(hang).attempt_class == "infra:verifier_timeout"
    assert not needs_known_good(hang)


def test_only_a_verifier_phase_failure_asks_for_the_known_good_state() -> None:
    assert needs_known_good(verifier_failure("VerifierTimeoutError"))
    assert needs_known_good(verifier_failure("RewardFileNotFoundError"))
    assert not needs_known_good(TrialFacts(rewards={"reward": 0.0}, verifier_started=True))
    assert not needs_known_good(TrialFacts(exception_type="SandboxBuildFailedError"))
    assert not needs_known_good(TrialFacts(failure_cause=Cause.CANCELLED, verifier_started=True))
    assert not needs_known_good(verifier_failure(test_exit_code=75))  # the judge: outside the sandbox


def test_a_client_does_not_take_a_floor_without_the_policy_and_its_evidence() -> None:
    floor = answer(judge(verifier_failure("VerifierTimeoutError", known_good=HEALTHY)))
    assert read_verdict(floor) == "valid"
    assert read_verdict({**floor, ATTRIBUTED_TO: "infrastructure"}) == "infra:no_verifier_reward"
    assert read_verdict({**floor, EVIDENCE: None}) == "infra:no_verifier_reward"
    assert read_verdict({**floor, EVIDENCE: {"phase": "moon"}}) == "infra:no_verifier_reward"
    assert read_verdict({**floor, "failure_cause": "no_engine_available"}) == "infra:no_verifier_reward"
    assert read_verdict(floor, agent_timeout_policy="mask") == "valid"
    timed_out = answer(
        judge(
            TrialFacts(
                rewards={"reward": 0.0}, exception_type="AgentTimeoutError", exception_phase=Phase.AGENT
            )
        )
    )
    assert read_verdict(timed_out, agent_timeout_policy="mask") == "infra:agent_timeout"


causes = st.sampled_from([None, *Cause])
phases = st.sampled_from(list(Phase))
hits = st.lists(st.builds(LimitHit, phases, st.sampled_from(list(Resource)), st.text(max_size=5)), max_size=2)
known = st.one_of(
    st.none(), st.builds(KnownGood, st.sampled_from([True, False, None]), st.sampled_from(list(Control)))
)
exceptions = st.sampled_from(
    [
        None,
        "VerifierTimeoutError",
        "MemoryLimitExceededError",
        "AgentTimeoutError",
        "RewardFileNotFoundError",
        "NonZeroAgentExitCodeError",
        "SandboxTreeError",
        "HealthcheckError",
        "KeyError",
    ]
)


@settings(max_examples=400)
@given(
    rewards=st.one_of(st.none(), st.just({"reward": 0.5}), st.just({"a": 1.0, "b": 0.0})),
    exception=exceptions,
    phase=st.one_of(st.none(), phases),
    started=st.booleans(),
    limit_hits=hits,
    known_good=known,
    rule=st.sampled_from(list(AttributionRule)),
    outside=st.sampled_from([None, Cause.CANCELLED, Cause.DEADLINE_EXCEEDED]),
    exit_code=st.sampled_from([None, 0, 1, 75]),
)
def test_every_verdict_reads_back_as_itself_and_scores_only_with_provenance(
    rewards: dict[str, float] | None,
    exception: str | None,
    phase: Phase | None,
    started: bool,
    limit_hits: list[LimitHit],
    known_good: KnownGood | None,
    rule: AttributionRule,
    outside: Cause | None,
    exit_code: int | None,
) -> None:
    facts = TrialFacts(
        rewards=rewards,
        exception_type=exception,
        exception_phase=phase,
        verifier_started=started,
        limit_hits=tuple(limit_hits),
        known_good=known_good,
        rule=rule,
        failure_cause=outside,
        test_exit_code=exit_code,
    )
    verdict = judge(facts)
    assert read_verdict(answer(verdict)) == verdict.attempt_class
    assert (verdict.reward is not None) == (verdict.attempt_class == "valid")
    assert (verdict.reward is not None) == (verdict.reward_source in ("verifier", "floor"))
    if verdict.reward_source == "floor":  # the floor only for the policy: by a control, or its own tree
        refused = verdict.failure_cause == Cause.SANDBOX_TREE_REFUSED
        assert verdict.attributed_to == Attribution.POLICY and verdict.evidence is not None
        assert refused or (known_good is not None and known_good.healthy)
        assert rule != AttributionRule.LIST
    if verdict.reward_source == "verifier":
        assert rewards is not None and verdict.reward == 0.5
    if outside is not None:
        assert verdict.attributed_to == Attribution.INFRASTRUCTURE
    if verdict.attempt_class != "valid":
        assert verdict.attributed_to in (Attribution.INFRASTRUCTURE, Attribution.TASK)
    if verdict.attributed_to == Attribution.TASK:
        assert known_good is not None and known_good.healthy is False


@given(
    hit=st.builds(LimitHit, phases, st.sampled_from(list(Resource)), st.text()),
    evidence=st.builds(
        Evidence,
        phases,
        st.sampled_from(list(Control)),
        st.one_of(st.none(), st.sampled_from(list(Resource))),
        st.one_of(st.none(), st.text()),
        st.one_of(st.none(), st.text()),
    ),
)
def test_the_vocabulary_round_trips_through_json(hit: LimitHit, evidence: Evidence) -> None:
    assert LimitHit.from_json(hit.as_json()) == hit
    assert Evidence.from_json(evidence.as_json()) == evidence


def test_a_record_outside_the_vocabulary_names_its_field() -> None:
    with pytest.raises(ValueError, match="resource must be one of"):
        LimitHit.from_json({"phase": "agent", "resource": "moon"})
    with pytest.raises(ValueError, match="control must be one of"):
        Evidence.from_json({"phase": "agent", "control": None})


def test_the_audits_record_says_whether_the_verifier_is_healthy() -> None:
    def record(**verifier: Any) -> dict[str, Any]:
        return {"digest": "d", "oracle": {"verifier": verifier}}

    assert from_audit_evidence(record(graded=3, failed=0, max_verifier_s=0.4)).healthy is True
    assert from_audit_evidence(record(graded=2, failed=1, causes=["verifier_timeout"])).healthy is False
    assert from_audit_evidence(record(graded=0, failed=0)).healthy is None
    assert from_audit_evidence({"digest": "d"}) == KnownGood(
        None, Control.AUDIT, "the audit's result holds no record of the verifier on the oracle"
    )
