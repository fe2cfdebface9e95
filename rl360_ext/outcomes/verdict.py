"""The verdict: does this attempt's reward count? Decided once, on the Harbor server; read on the client.

Owns `judge(TrialFacts) -> Verdict`, the one decision from what a Harbor trial left (the rewards
this run's verifier wrote, the exception type Harbor recorded, the test script's exit code, or a
failure decided outside the trial) to a reward or None, a failure cause, the reward's provenance
and the attempt class ("valid" or "infra:<cause>"). rl360's Harbor /run server
(`rl360_ext.harbor.outcome`) calls it and sends the verdict in its answer (`attempt_class`).

The client side (`rl360_ext.rollout`: the agent function, the generate hook, the reward hook)
never classifies a server's fields again. It reads the verdict with `attempt_class`, which adds
only what the client alone can see (`client_class`: its own deadline and connection, the session
it lost, the engine failures the session recorded) and the `--rl360-agent-timeout-policy`
("mask" makes a timed-out attempt infra even when a verifier graded it).

Rule: a reward counts only if this run's verifier wrote it. "valid" requires
`reward_source == "verifier"`, a finite numeric reward, no client-side failure and no failure
that is infrastructure. Every failure text or exception type not in the tables of
`rl360_ext.outcomes.causes` / `.harbor_exceptions` becomes infra ("infra:unclassified" or
"infra:harbor_internal_error"), never a reward of 0.

Attribution (`rl360_ext.outcomes.attribution`; the table is in docs/harbor.md): every failed
attempt says who it belongs to and the evidence. Under the `evidence` and `regrade` rules a limit
the sandbox's own processes hit in the agent phase, or the agent's timeout, is the policy's: the
verifier grades the end state (the server lets it run) and that grade counts. A verifier-phase
failure on the agent's end state (timeout, limit, crash, no reward) is the policy's, scored at the
task's floor (`reward_source == "floor"`), when the task's verifier is known healthy on its
known-good state (`KnownGood`: the audit's oracle runs, or a control regrade); the task's when the
known-good state reproduces it; without such evidence it stays infrastructure. Everything outside
the sandbox is infrastructure. The `list` rule is the cause list alone (kept for the A/B).

Agent timeout is a policy decision: "score" (default) keeps the verifier's reward when the
verifier ran after the timeout; "mask" turns every agent timeout into "infra:agent_timeout".
Masking looks cleaner but removes exactly the slow, failing attempts from the batch, so the
policy is never penalized for running out the clock; runs that masked timeouts have been
reported to see reward degrade until training collapsed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

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
    as_attribution,
)
from rl360_ext.outcomes.causes import (
    COARSE_CAUSES,
    FAILURE_TO_INFRA,
    INFRA_CAUSES,
    POLICY_CAUSES,
    POLICY_OUTCOME_CAUSES,
    Cause,
    as_cause,
    infra_class,
)
from rl360_ext.outcomes.harbor_exceptions import (
    AGENT_TIMEOUT_ERROR,
    HARBOR_EXCEPTIONS,
    cause_for_exception_type,
)
from rl360_ext.outcomes.known_good import VERIFIER_FAILURES, KnownGood
from rl360_ext.outcomes.provenance import (
    ATTEMPT_CLASS,
    FAILURE_CAUSE,
    FLOOR,
    INFRA_PREFIX,
    REWARD_SOURCE,
    UNCLASSIFIED,
    VALID,
    VERIFIER,
)

AGENT_TIMEOUT_POLICIES = ("score", "mask")
EXCEPTION_TYPE = "exception_type"  # /run answer key: the Harbor exception type name

# A verifier whose judge (an LLM grader or another grading service) failed says so by exiting
# with 75 (sysexits EX_TEMPFAIL). Whatever reward file it left does not count: the grade was not
# the judge's, it was a fallback.
JUDGE_FAILURE_EXIT_CODE = 75
# A test script that ended by a signal exits 128 + the signal: killed, possibly by the code it runs,
# which may have written the reward file itself while the script ran. No reward of it counts.
KILLED_EXIT_CODE = 128

POLICY_OUTCOME_EXCEPTIONS = frozenset(
    name for name, known in HARBOR_EXCEPTIONS.items() if known.failure_cause in POLICY_CAUSES
)
_POLICY = "policy"  # partial verdict: the policy's own outcome, a verifier reward counts
_TIMEOUT = "agent_timeout"  # partial verdict: the agent timed out, the timeout policy decides


# A limit hit or timeout in the agent phase: the policy's own doing; the verifier grades what it left.
POLICY_LIMIT_CAUSES = frozenset({Cause.MEMORY_LIMIT_EXCEEDED, Cause.AGENT_TIMEOUT})
# Failures of a verifier that ran on the agent's end state: whose they are, a known-good state says.
VERIFIER_PHASE_CAUSES = VERIFIER_FAILURES | {
    Cause.MEMORY_LIMIT_EXCEEDED,
    Cause.AGENT_TIMEOUT,
    Cause.NO_VERIFIER_REWARD,
}
# Sandbox failures scored at the floor for the policy: lost to a limit in the verifier phase (with a
# known-healthy verifier), or a tree the policy left that the host refused to walk.
FLOORED_SANDBOX_CAUSES = frozenset({Cause.SANDBOX_FAILED, Cause.SANDBOX_LOST, Cause.SANDBOX_TREE_REFUSED})
# The resource a cause names where no limit hit was recorded (the evidence's `resource`).
_CAUSE_RESOURCE = {
    Cause.VERIFIER_TIMEOUT: Resource.TIME,
    Cause.AGENT_TIMEOUT: Resource.TIME,
    Cause.MEMORY_LIMIT_EXCEEDED: Resource.MEMORY,
}


@dataclass(frozen=True)
class TrialFacts:
    """What a Harbor trial left, read by `rl360_ext.harbor.outcome` (Harbor-free)."""

    rewards: Mapping[str, float] | None = None
    """The rewards THIS run's verifier wrote (the file on disk matches what Harbor graded); None: none."""
    exception_type: str | None = None
    """The exception type name Harbor recorded (or the one raised around the trial)."""
    harbor_025_cause: str | None = None
    """Harbor 0.25's `TrialResult.failure_cause`, read for exception types rl360 does not know."""
    harbor_keeps_reward: bool = True
    """Harbor's error policy for the exception (`has_valid_reward`); rl360 is never looser."""
    test_exit_code: int | None = None
    """The exit code of the task's tests/test.sh, when rl360's verifier recorded it."""
    failure_cause: Cause | None = None
    """A failure decided outside a trial result (no budget, cancelled, past the deadline, ...)."""
    exception_phase: Phase | None = None
    """The phase the recorded exception was raised in, where the trial's timings say."""
    verifier_started: bool = False
    """The verifier phase began (on the agent's end state)."""
    verifier_failure: str | None = None
    """How the verifier phase itself failed (an exception type), where another exception hid it."""
    limit_hits: tuple[LimitHit, ...] = ()
    """The limits the sandbox's own processes hit, with their phases (the environment's record)."""
    known_good: KnownGood | None = None
    """The task's verifier on its known-good state: asked for only when a verdict needs it."""
    rule: AttributionRule = AttributionRule.EVIDENCE
    floor_reward: float = 0.0
    """The task's floor: what a failure attributed to the policy scores when nothing was graded."""


@dataclass(frozen=True)
class Verdict:
    """The decision on one attempt, as the /run server reports it."""

    attempt_class: str
    """ "valid" or "infra:<cause>"."""
    failure_cause: Cause | None = None
    reward: float | None = None
    """The scalar reward; not None exactly when `reward_source` is "verifier" or "floor"."""
    rewards: dict[str, float] | None = None
    reward_source: str | None = None
    """Reward provenance: "verifier" (this run's verifier wrote it), "floor" (the task's floor for a
    failure attributed to the policy) or None."""
    detail: str | None = None
    """Why, when the verdict knows better than the exception message."""
    attributed_to: Attribution | None = None
    """Who a failed attempt belongs to (None: nothing failed)."""
    evidence: Evidence | None = None


def judge(facts: TrialFacts) -> Verdict:
    """The verdict on one attempt from what its Harbor trial left (see the module docstring)."""
    listed = _listed(facts)
    if facts.rule == AttributionRule.LIST:
        return _attributed(listed, _listed_attribution(listed), _rule_evidence(facts, listed))
    return _by_evidence(facts, listed)


def needs_known_good(facts: TrialFacts) -> bool:
    """Whether the verdict on `facts` turns on the task's verifier on its known-good state: a
    verifier-phase failure on the agent's end state, under a rule that asks (not `list`)."""
    return facts.rule != AttributionRule.LIST and _verifier_phase_failure(facts, _listed(facts))


def _listed(facts: TrialFacts) -> Verdict:
    """The verdict by the cause list (rl360 before attribution: the `list` rule), except that under
    the other rules a limit or timeout the policy hit in the agent phase keeps the grade after it."""
    exception = facts.exception_type
    if facts.failure_cause is not None:
        return _without_reward(facts.failure_cause, exception)
    if facts.test_exit_code is not None and facts.test_exit_code >= KILLED_EXIT_CODE:
        detail = (
            f"tests/test.sh was killed by signal {facts.test_exit_code - KILLED_EXIT_CODE}: a reward "
            "file written while it ran may be the code under test's, not the verifier's"
        )
        return _without_reward(Cause.VERIFIER_CRASH, exception, detail)
    if facts.test_exit_code == JUDGE_FAILURE_EXIT_CODE:
        detail = (
            f"the verifier's judge failed (tests/test.sh exited {JUDGE_FAILURE_EXIT_CODE}); "
            "any reward it wrote is a fallback and does not count"
        )
        return _without_reward(Cause.JUDGE_FAILURE, exception, detail)
    cause: Cause | None = None
    if exception is not None:
        cause = cause_for_exception_type(exception, facts.harbor_025_cause)
        if cause == Cause.REWARD_FILE_MISSING and (facts.test_exit_code or 0) != 0:
            cause = Cause.VERIFIER_CRASH
        if facts.rule != AttributionRule.LIST and _agent_policy_limit(facts, cause):
            if facts.rewards is None:
                return _without_reward(cause, exception)
            return _rewarded(facts.rewards, cause, exception, Attribution.POLICY)
        if cause not in POLICY_CAUSES or not facts.harbor_keeps_reward:
            return _without_reward(cause, exception)
    if facts.rewards is None:
        return _without_reward(cause or Cause.REWARD_FILE_MISSING, exception)
    return _rewarded(facts.rewards, cause, exception)


def _rewarded(
    rewards_written: Mapping[str, float],
    cause: Cause | None,
    exception: str | None,
    attributed_to: Attribution | None = None,
    source: str = VERIFIER,
) -> Verdict:
    rewards = {str(k): float(v) for k, v in rewards_written.items()}
    reward = scalar_reward(rewards)
    if reward is None:
        detail = f"the verifier wrote rewards without a 'reward' key: {sorted(rewards)}"
        return _without_reward(Cause.REWARD_KEY_MISSING, exception, detail)
    fields = {
        "reward": reward,
        REWARD_SOURCE: source,
        FAILURE_CAUSE: cause,
        EXCEPTION_TYPE: exception,
        ATTRIBUTED_TO: attributed_to,
    }
    return Verdict(attempt_class_of(fields), cause, reward, rewards, source)


def _without_reward(cause: Cause, exception: str | None, detail: str | None = None) -> Verdict:
    fields = {FAILURE_CAUSE: cause, EXCEPTION_TYPE: exception}
    return Verdict(attempt_class_of(fields), cause, detail=detail)


# ---- attribution (the rules of docs/harbor.md's table) ---------------------------------------------


def _agent_policy_limit(facts: TrialFacts, cause: Cause | None) -> bool:
    """The recorded failure is a limit or the timeout the policy hit in the agent phase."""
    in_agent = facts.exception_phase == Phase.AGENT or (
        facts.exception_phase is None and not facts.verifier_started
    )
    return in_agent and cause in POLICY_LIMIT_CAUSES


def _hit(facts: TrialFacts, phase: Phase) -> LimitHit | None:
    return next((hit for hit in facts.limit_hits if hit.phase == phase), None)


def _verifier_phase_failure(facts: TrialFacts, listed: Verdict) -> bool:
    """The verifier ran on the agent's end state and gave no reward, for a reason inside the
    sandbox (not the judge, the host, Harbor or the client)."""
    if facts.failure_cause is not None or not facts.verifier_started or listed.reward is not None:
        return False
    cause = listed.failure_cause
    lost_to_a_limit = cause in (Cause.SANDBOX_FAILED, Cause.SANDBOX_LOST) and _hit(facts, Phase.VERIFIER)
    return cause in VERIFIER_PHASE_CAUSES or bool(lost_to_a_limit)


def _phase(facts: TrialFacts) -> Phase:
    if facts.failure_cause is not None:
        return Phase.HOST
    if facts.exception_phase is not None:
        return facts.exception_phase
    return Phase.VERIFIER if facts.verifier_started else Phase.AGENT


def _rule_evidence(facts: TrialFacts, verdict: Verdict, phase: Phase | None = None) -> Evidence | None:
    """Evidence for a verdict the rule alone decides; None for an attempt where nothing failed."""
    phase = phase or _phase(facts)
    hit = _hit(facts, phase)
    if verdict.failure_cause is None and hit is None:
        return None
    cause = verdict.failure_cause
    return Evidence(
        phase=phase,
        control=Control.RULE,
        resource=hit.resource if hit is not None else _CAUSE_RESOURCE.get(cause) if cause else None,
        signal=(cause.value if cause is not None else None) or facts.exception_type,
        detail=hit.detail if hit is not None and hit.detail else None,
    )


def _listed_attribution(verdict: Verdict) -> Attribution | None:
    if verdict.attempt_class != VALID:
        return Attribution.INFRASTRUCTURE
    return Attribution.POLICY if verdict.failure_cause is not None else None


def _attributed(verdict: Verdict, who: Attribution | None, evidence: Evidence | None) -> Verdict:
    if who is None:
        return verdict
    return Verdict(
        verdict.attempt_class,
        verdict.failure_cause,
        verdict.reward,
        verdict.rewards,
        verdict.reward_source,
        verdict.detail,
        who,
        evidence,
    )


def _by_evidence(facts: TrialFacts, listed: Verdict) -> Verdict:
    """The `evidence` and `regrade` rules (docs/harbor.md): see the module docstring."""
    if listed.attempt_class == VALID:
        agent_hit = _hit(facts, Phase.AGENT)
        policy = listed.failure_cause is not None or agent_hit is not None
        phase = facts.exception_phase or (Phase.AGENT if agent_hit is not None else None)
        evidence = _rule_evidence(facts, listed, phase)
        return _attributed(listed, Attribution.POLICY if policy else None, evidence)
    if listed.failure_cause == Cause.SANDBOX_TREE_REFUSED:  # what the policy left, refused by the host
        floor = _rewarded({"reward": facts.floor_reward}, listed.failure_cause, facts.exception_type,
                          Attribution.POLICY, FLOOR)  # fmt: skip
        return _attributed(floor, Attribution.POLICY, _rule_evidence(facts, listed))
    if not _verifier_phase_failure(facts, listed):
        return _attributed(listed, Attribution.INFRASTRUCTURE, _rule_evidence(facts, listed))
    hit = _hit(facts, Phase.VERIFIER)
    cause = listed.failure_cause
    signal = facts.verifier_failure or (cause.value if cause is not None else facts.exception_type)
    resource = hit.resource if hit is not None else _CAUSE_RESOURCE.get(as_cause(signal) or cause)
    known = facts.known_good or KnownGood(None, Control.NONE, "no control on the known-good state was run")
    evidence = Evidence(Phase.VERIFIER, known.control, resource, signal, known.detail or None)
    if known.healthy is None:
        return _attributed(listed, Attribution.INFRASTRUCTURE, evidence)
    if not known.healthy:
        return _attributed(listed, Attribution.TASK, evidence)
    floor = _rewarded({"reward": facts.floor_reward}, cause, facts.exception_type, Attribution.POLICY, FLOOR)
    return _attributed(floor, Attribution.POLICY, evidence)


def scalar_reward(rewards: Mapping[str, float]) -> float | None:
    """The "reward" key, or the only value of a one-key dict; None when ambiguous."""
    if "reward" in rewards:
        return float(rewards["reward"])
    if len(rewards) == 1:
        return float(next(iter(rewards.values())))
    return None


def is_verifier_reward(reward: Any) -> bool:
    """A reward a verifier can have written: a finite number, or a non-empty flat dict of them."""
    if isinstance(reward, Mapping):
        return bool(reward) and all(_finite_number(v) for v in reward.values())
    return _finite_number(reward)


def _finite_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return False
    return math.isfinite(float(value))


# ---- the class rule on reported fields (the last step of `judge`) ---------------------------------


def _cause_verdict(failure_cause: Any) -> str | None:
    if failure_cause is None or failure_cause == "":
        return None
    cause = as_cause(failure_cause)
    if cause is None:
        return UNCLASSIFIED
    if cause in POLICY_OUTCOME_CAUSES:
        return _POLICY
    if cause == Cause.AGENT_TIMEOUT:
        return _TIMEOUT
    if cause in INFRA_CAUSES:
        return infra_class(cause)
    if cause in FAILURE_TO_INFRA:
        return infra_class(FAILURE_TO_INFRA[cause])
    return UNCLASSIFIED


def _exception_verdict(exception_type: Any) -> str | None:
    if exception_type is None or exception_type == "":
        return None
    known = HARBOR_EXCEPTIONS.get(exception_type) if isinstance(exception_type, str) else None
    if known is None:
        return infra_class(Cause.HARBOR_INTERNAL_ERROR)
    if known.infra_cause is not None:
        return infra_class(known.infra_cause)
    return _cause_verdict(known.failure_cause)


def attempt_class_of(fields: Mapping[str, Any], agent_timeout_policy: str = "score") -> str:
    """The class of reported fields (`reward`, `reward_source`, `failure_cause`, `exception_type`,
    `attributed_to`).

    `judge` ends with it. Harbor's coarse causes (sandbox_failed, ...) yield to a specific
    exception: a sandbox that never started (SandboxBuildFailedError) is no_sandbox, not
    sandbox_lost. An infra reading of either field wins, unless the failure is attributed to the
    policy and scored (a verifier's grade or the task's floor); then the timeout policy; then the
    reward must carry that provenance and be a verifier reward.
    """
    _check_policy(agent_timeout_policy)
    failure_cause = fields.get(FAILURE_CAUSE)
    cause_verdict = _cause_verdict(failure_cause)
    exception_verdict = _exception_verdict(fields.get(EXCEPTION_TYPE))
    specific = exception_verdict not in (None, _POLICY, _TIMEOUT, infra_class(Cause.HARBOR_INTERNAL_ERROR))
    coarse = as_cause(failure_cause) in COARSE_CAUSES
    verdicts = (
        [exception_verdict, cause_verdict] if coarse and specific else [cause_verdict, exception_verdict]
    )
    source = fields.get(REWARD_SOURCE)
    scored_policy = _policy_scored(fields)
    infra = [v for v in verdicts if v is not None and v.startswith(INFRA_PREFIX)]
    if infra and not scored_policy:
        return infra[0]
    timed_out = _TIMEOUT in verdicts or (scored_policy and fields.get(EXCEPTION_TYPE) == AGENT_TIMEOUT_ERROR)
    if timed_out and agent_timeout_policy == "mask":
        return infra_class(Cause.AGENT_TIMEOUT)
    if source != VERIFIER and not scored_policy:
        return infra_class(Cause.AGENT_TIMEOUT) if timed_out else infra_class(Cause.NO_VERIFIER_REWARD)
    if not is_verifier_reward(fields.get("reward")):
        return infra_class(Cause.REWARD_FILE_INVALID)
    return VALID


def _policy_scored(fields: Mapping[str, Any]) -> bool:
    """A failure attributed to the policy and scored: the verifier's grade after a policy outcome
    or a limit the policy hit, or the task's floor after a verifier-phase failure."""
    if as_attribution(fields.get(ATTRIBUTED_TO)) != Attribution.POLICY:
        return False
    reported = fields.get(FAILURE_CAUSE)
    cause = as_cause(reported)
    if fields.get(REWARD_SOURCE) == VERIFIER:
        return reported in (None, "") or cause in POLICY_OUTCOME_CAUSES | POLICY_LIMIT_CAUSES
    if fields.get(REWARD_SOURCE) == FLOOR:
        return cause in VERIFIER_PHASE_CAUSES | FLOORED_SANDBOX_CAUSES
    return False


def _check_policy(agent_timeout_policy: str) -> None:
    if agent_timeout_policy not in AGENT_TIMEOUT_POLICIES:
        raise ValueError(
            f"agent_timeout_policy must be one of {AGENT_TIMEOUT_POLICIES}, got {agent_timeout_policy!r}"
        )


# ---- the client side: read the verdict, add what only the client sees ---------------------------


def client_class(
    *,
    transport_error: Any = None,
    client_deadline: bool = False,
    session_error: str | None = None,
    gateway_status: int | None = None,
) -> str | None:
    """The infra class of what only the client saw, or None when it saw nothing wrong.

    In this order: `client_deadline` (the client gave up), `session_error` (a cause name from the
    session side, e.g. "session_vanished"), `gateway_status` (worst HTTP status the gateway gave
    the agent: 5xx/429 -> no_engine_available, other 4xx -> model_request_rejected),
    `transport_error` (anything truthy).
    """
    if client_deadline:
        return infra_class(Cause.CLIENT_DEADLINE)
    if session_error:
        return infra_class(session_error) if session_error in INFRA_CAUSES else UNCLASSIFIED
    if gateway_status is not None:
        if not isinstance(gateway_status, int) or isinstance(gateway_status, bool):
            raise ValueError(f"gateway_status must be an int HTTP status, got {gateway_status!r}")
        if gateway_status >= 500 or gateway_status == 429:
            return infra_class(Cause.NO_ENGINE_AVAILABLE)
        if gateway_status >= 400:
            return infra_class(Cause.MODEL_REQUEST_REJECTED)
    if transport_error is not None and transport_error is not False:
        return infra_class(Cause.TRANSPORT_ERROR)
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


def read_verdict(recorded: Mapping[str, Any], agent_timeout_policy: str = "score") -> str:
    """The class a server's verdict (`recorded["attempt_class"]`) stands for on this client.

    An infra class stands (an unknown cause is "infra:unclassified"). "valid" stands only when the
    record agrees with it: verifier provenance, or the floor for a failure attributed to the policy
    with its evidence (else no_verifier_reward), a verifier reward (else reward_file_invalid), no
    failure or exception but a policy outcome, the agent timeout or one the policy was attributed
    (else unclassified); "mask" turns a timed-out valid attempt into infra:agent_timeout. Anything
    else, including no verdict at all, is "infra:unclassified".
    """
    _check_policy(agent_timeout_policy)
    recorded_class = recorded.get(ATTEMPT_CLASS)
    if not isinstance(recorded_class, str) or recorded_class == UNCLASSIFIED:
        return UNCLASSIFIED
    if recorded_class.startswith(INFRA_PREFIX):
        return recorded_class if recorded_class.removeprefix(INFRA_PREFIX) in INFRA_CAUSES else UNCLASSIFIED
    if recorded_class != VALID:
        return UNCLASSIFIED
    scored_policy = _policy_scored(recorded) and _evidence_of(recorded) is not None
    if recorded.get(REWARD_SOURCE) != VERIFIER and not scored_policy:
        return infra_class(Cause.NO_VERIFIER_REWARD)
    if not is_verifier_reward(recorded.get("reward")):
        return infra_class(Cause.REWARD_FILE_INVALID)
    cause_verdict = _cause_verdict(recorded.get(FAILURE_CAUSE))
    exception = recorded.get(EXCEPTION_TYPE)
    timeout_exception = exception == AGENT_TIMEOUT_ERROR
    known_exception = exception in (None, "") or exception in POLICY_OUTCOME_EXCEPTIONS or timeout_exception
    if not scored_policy and (cause_verdict not in (None, _POLICY, _TIMEOUT) or not known_exception):
        return UNCLASSIFIED
    if scored_policy and not (known_exception or exception in HARBOR_EXCEPTIONS):
        return UNCLASSIFIED
    if agent_timeout_policy == "mask" and (cause_verdict == _TIMEOUT or timeout_exception):
        return infra_class(Cause.AGENT_TIMEOUT)
    return VALID


def _evidence_of(recorded: Mapping[str, Any]) -> Evidence | None:
    evidence = recorded.get(EVIDENCE)
    if not isinstance(evidence, Mapping):
        return None
    try:
        return Evidence.from_json(evidence)
    except ValueError:
        return None


def attempt_class(
    recorded: Mapping[str, Any] | None,
    *,
    transport_error: Any = None,
    client_deadline: bool = False,
    session_error: str | None = None,
    gateway_status: int | None = None,
    agent_timeout_policy: str = "score",
) -> str:
    """The client's class of one attempt: what only it saw (`client_class`) wins over the server's
    verdict (`read_verdict` of `recorded`, the /run answer or the metadata it became); no
    answer and no client-side event is "infra:unclassified"."""
    _check_policy(agent_timeout_policy)
    seen = client_class(
        transport_error=transport_error,
        client_deadline=client_deadline,
        session_error=session_error,
        gateway_status=gateway_status,
    )
    if seen is not None:
        return seen
    if recorded is None:
        return UNCLASSIFIED
    if not isinstance(recorded, Mapping):
        raise ValueError(f"recorded must be a dict (the /run answer) or None, got {type(recorded).__name__}")
    return read_verdict(recorded, agent_timeout_policy)
