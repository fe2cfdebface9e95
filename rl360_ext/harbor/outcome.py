"""Harbor result adapter: the only place in rl360 that reads Harbor's result and failure information.

Owns reading what Harbor leaves behind after one trial (a `TrialResult` of Harbor 0.25 or 0.26,
an exception raised around `Trial.create`/`Trial.run`, and the trial's verifier directory) into
one `Outcome`: reward, rewards, reward_source, failure_cause, attempt_class, exception type and
message, phase timings and agent metrics. It does not run trials, and nothing else in rl360
reads `TrialResult.exception_info`, `ErrorPolicy` or the removed 0.25 `failure_cause`. It
decides nothing itself: it gathers the Harbor-free `rl360_ext.outcomes.verdict.TrialFacts` and
takes `judge`'s verdict, the one decision on whether a reward counts; the /run answer carries
that verdict (`attempt_class`) so clients read it instead of classifying again.

What it reads for the verdict, stricter than Harbor's policy, never looser:
- the rewards count only when THIS run's verifier wrote reward.txt/reward.json: the file exists
  in the trial's verifier directory after the run, parses by the one rule
  (`rl360_ext.outcomes.rewards`: finite numbers within the server's range) to exactly the rewards
  Harbor graded (with that same rule, in `rl360_ext.harbor.verifier`), and the verifier phase
  ran. Harbor deletes stale reward files before grading, so a file that is
  present and matches was written by this run's verifier;
- Harbor's error policy (`has_valid_reward`) for the recorded exception, and the test script's
  exit code rl360's verifier recorded (`rl360_ext.harbor.verifier`).
So: reward is a float exactly when reward_source is "verifier" or "floor"; then failure_cause is
null or a cause attributed to the policy. When reward is null, failure_cause says why. Every failed
attempt carries `attributed_to` and `evidence` (`rl360_ext.outcomes.attribution`): the phase the
recorded exception came from is read off the trial's timings here, the limits the sandbox's own
processes hit come from the environment (`limit_hits`), the known-good control from the runner.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rl360_ext.harbor.envs.nofollow import TooLarge, read_regular
from rl360_ext.outcomes.attribution import AttributionRule, LimitHit, Phase
from rl360_ext.outcomes.causes import Cause
from rl360_ext.outcomes.rewards import REWARD_JSON, REWARD_TXT, RewardParse, RewardRange, parse_reward_file
from rl360_ext.outcomes.verdict import TrialFacts, Verdict, judge

MESSAGE_LIMIT = 2000
REWARD_FILE_LIMIT = 1 << 20  # a reward file is a number or a flat dict; anything larger is not one
VERIFIER_EXIT_FILE = "rl360-verifier-exit.json"  # written by rl360_ext.harbor.verifier, read here
DEFAULT_RANGE = RewardRange()


@dataclass
class AgentMetrics:
    turns: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_tokens: int | None = None


@dataclass
class Outcome:
    """What one /run attempt produced, in rl360's terms."""

    reward: float | None = None
    rewards: dict[str, float] | None = None
    reward_source: str | None = None
    failure_cause: str | None = None
    attempt_class: str | None = None  # the verdict: "valid" or "infra:<cause>"
    attributed_to: str | None = None  # policy | infrastructure | task, for a failed attempt
    evidence: dict[str, str | None] | None = None  # `Evidence.as_json()`: phase, resource, signal, control
    exception_type: str | None = None
    exception_message: str | None = None
    phase_timings: dict[str, float | None] = field(default_factory=dict)
    timeline: dict[str, float | None] = field(default_factory=dict)
    agent_metrics: AgentMetrics = field(default_factory=AgentMetrics)
    trial_name: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def bounded(message: str | None, limit: int = MESSAGE_LIMIT) -> str | None:
    if message is None:
        return None
    return message if len(message) <= limit else message[: limit - 15] + " ...[truncated]"


def failure(cause: str, exc: BaseException | None = None, message: str | None = None) -> Outcome:
    """An outcome without a reward, for failures decided outside a Harbor trial result."""
    exception_type = type(exc).__name__ if exc is not None else None
    verdict = judge(TrialFacts(failure_cause=Cause(cause), exception_type=exception_type))
    return Outcome(
        failure_cause=_plain(verdict.failure_cause),
        attempt_class=verdict.attempt_class,
        **_attribution(verdict),
        exception_type=exception_type,
        exception_message=bounded(
            message if message is not None else (str(exc) if exc is not None else None)
        ),
    )


def _attribution(verdict: Verdict) -> dict[str, Any]:
    return {
        "attributed_to": None if verdict.attributed_to is None else verdict.attributed_to.value,
        "evidence": None if verdict.evidence is None else verdict.evidence.as_json(),
    }


def _plain(cause: Cause | None) -> str | None:
    """A cause as the plain string the /run answer carries."""
    return None if cause is None else cause.value


def read_reward(path: Path, bounds: RewardRange) -> RewardParse | None:
    """One reward file by the one rule (`rl360_ext.outcomes.rewards`), read as a regular file,
    never through a link, at most REWARD_FILE_LIMIT bytes; None when there is no such file."""
    try:
        raw = read_regular(path, REWARD_FILE_LIMIT)
    except FileNotFoundError:
        return None
    except TooLarge:
        reason = f"{path.name} is larger than {REWARD_FILE_LIMIT} bytes"
        return RewardParse(cause=Cause.REWARD_FILE_INVALID, reason=reason)
    except OSError as exc:  # a link, a directory, a FIFO: nothing was followed or read
        return RewardParse(
            cause=Cause.REWARD_FILE_INVALID, reason=f"{path.name} is not a regular file ({exc})"
        )
    return parse_reward_file(path.name, raw, bounds)


def read_verifier_rewards(verifier_dir: Path, bounds: RewardRange = DEFAULT_RANGE) -> dict[str, float] | None:
    """The rewards in reward.json (preferred, as Harbor does) or reward.txt, or None if absent or
    not rewards by the one rule."""
    for name in (REWARD_JSON, REWARD_TXT):
        parsed = read_reward(verifier_dir / name, bounds)
        if parsed is not None:
            return parsed.rewards
    return None


def recorded_test_exit_code(trial_dir: Path) -> int | None:
    """The exit code of the task's tests/test.sh as recorded by rl360's verifier, if it ran."""
    try:
        return int(json.loads((trial_dir / VERIFIER_EXIT_FILE).read_text())["test_exit_code"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _seconds(timing: Any) -> float | None:
    started = getattr(timing, "started_at", None)
    finished = getattr(timing, "finished_at", None)
    if not isinstance(started, datetime) or not isinstance(finished, datetime):
        return None
    return max(0.0, (finished - started).total_seconds())


def phase_timings(result: Any) -> dict[str, float | None]:
    return {
        "environment_setup": _seconds(getattr(result, "environment_setup", None)),
        "agent_setup": _seconds(getattr(result, "agent_setup", None)),
        "agent": _seconds(getattr(result, "agent_execution", None)),
        "verifier": _seconds(getattr(result, "verifier", None)),
    }


def sandbox_started_at(result: Any) -> float | None:
    """Unix time at which Harbor began starting the sandbox (environment setup)."""
    started = getattr(getattr(result, "environment_setup", None), "started_at", None)
    return started.timestamp() if isinstance(started, datetime) else None


def agent_metrics(result: Any) -> AgentMetrics:
    context = getattr(result, "agent_result", None)
    if context is None:
        return AgentMetrics()
    metadata = getattr(context, "metadata", None) or {}
    turns = metadata.get("turns", metadata.get("n_episodes"))
    return AgentMetrics(
        turns=int(turns) if isinstance(turns, int | float) else None,
        input_tokens=getattr(context, "n_input_tokens", None),
        output_tokens=getattr(context, "n_output_tokens", None),
        cache_tokens=getattr(context, "n_cache_tokens", None),
    )


def _policy_keeps_reward(exception_info: Any) -> bool:
    policy = getattr(exception_info, "policy", None)
    return bool(getattr(policy, "has_valid_reward", True))


def verified_rewards(
    result: Any, trial_dir: Path, bounds: RewardRange = DEFAULT_RANGE
) -> dict[str, float] | None:
    """The rewards this run's verifier wrote, or None: the verifier phase ran, Harbor graded, and the
    reward file in the trial's verifier directory parses to exactly what Harbor graded."""
    graded = getattr(getattr(result, "verifier_result", None), "rewards", None)
    if getattr(result, "verifier", None) is None or not graded:
        return None
    on_disk = read_verifier_rewards(trial_dir / "verifier", bounds)
    if on_disk is None or not _same_rewards(on_disk, graded):
        return None
    return on_disk


def _same_rewards(on_disk: dict[str, float], graded: Any) -> bool:
    """Harbor graded exactly the rewards on disk (a value float() cannot take is no match)."""
    try:
        return on_disk == {str(k): float(v) for k, v in graded.items()}
    except (OverflowError, TypeError, ValueError, AttributeError):
        return False


def exception_phase(result: Any) -> Phase | None:
    """The phase the recorded exception was raised in, from when it occurred against the trial's
    phase timings; None where the result does not say."""
    occurred = getattr(getattr(result, "exception_info", None), "occurred_at", None)
    if not isinstance(occurred, datetime):
        return None
    for phase, timing in (
        (Phase.VERIFIER, getattr(result, "verifier", None)),
        (Phase.AGENT, getattr(result, "agent_execution", None)),
        (Phase.AGENT, getattr(result, "agent_setup", None)),
    ):
        started = getattr(timing, "started_at", None)
        if isinstance(started, datetime) and occurred >= started:
            return phase
    return Phase.ENVIRONMENT_SETUP


def limit_hits(trial: Any) -> tuple[LimitHit, ...]:
    """The limits the trial's sandbox saw its own processes hit (an environment that keeps no such
    record, as Harbor's own do not, reports none)."""
    report = getattr(getattr(trial, "agent_environment", None), "limit_hits", None)
    return tuple(report()) if callable(report) else ()


def recorded_verifier_failure(trial_dir: Path) -> str | None:
    """How the verifier phase failed (an exception type), as rl360's verifier recorded it."""
    try:
        failure = json.loads((trial_dir / VERIFIER_EXIT_FILE).read_text()).get("failure")
    except (OSError, ValueError, AttributeError):
        return None
    return failure if isinstance(failure, str) else None


def trial_facts(
    result: Any,
    trial_dir: Path,
    bounds: RewardRange = DEFAULT_RANGE,
    *,
    limit_hits: Sequence[LimitHit] = (),
    rule: AttributionRule = AttributionRule.EVIDENCE,
    floor_reward: float = 0.0,
) -> TrialFacts:
    """What the verdict needs from a finished trial, read off Harbor's result and the trial directory
    (`limit_hits`: the environment's record of the limits its processes hit)."""
    exception_info = getattr(result, "exception_info", None)
    return TrialFacts(
        rewards=verified_rewards(result, trial_dir, bounds),
        exception_type=getattr(exception_info, "exception_type", None),
        harbor_025_cause=getattr(result, "failure_cause", None),
        harbor_keeps_reward=exception_info is None or _policy_keeps_reward(exception_info),
        test_exit_code=recorded_test_exit_code(trial_dir),
        exception_phase=exception_phase(result) if exception_info is not None else None,
        verifier_started=getattr(result, "verifier", None) is not None,
        verifier_failure=recorded_verifier_failure(trial_dir),
        limit_hits=tuple(limit_hits),
        rule=rule,
        floor_reward=floor_reward,
    )


def classify(
    result: Any, trial_dir: Path, bounds: RewardRange = DEFAULT_RANGE, facts: TrialFacts | None = None
) -> Outcome:
    """The outcome of a finished Harbor trial, from its result and its trial directory (rewards
    outside `bounds` are no rewards), or from `facts` already read off them."""
    exception_info = getattr(result, "exception_info", None)
    verdict: Verdict = judge(facts if facts is not None else trial_facts(result, trial_dir, bounds))
    return Outcome(
        reward=verdict.reward,
        rewards=verdict.rewards,
        reward_source=verdict.reward_source,
        failure_cause=_plain(verdict.failure_cause),
        attempt_class=verdict.attempt_class,
        **_attribution(verdict),
        exception_type=getattr(exception_info, "exception_type", None),
        exception_message=verdict.detail or bounded(getattr(exception_info, "exception_message", None)),
        phase_timings=phase_timings(result),
        timeline={"sandbox_started_at": sandbox_started_at(result)},
        agent_metrics=agent_metrics(result),
        trial_name=getattr(result, "trial_name", None),
    )
