"""Harbor result adapter: the only place in rl360 that reads Harbor's result and failure information.

Owns the mapping from what Harbor leaves behind after one trial (a `TrialResult` of Harbor 0.25
or 0.26, an exception raised around `Trial.create`/`Trial.run`, and the trial's verifier
directory) to one `Outcome`: reward, rewards, reward_source, failure_cause, exception type and
message, phase timings and agent metrics. It does not run trials, and nothing else in rl360
reads `TrialResult.exception_info`, `ErrorPolicy` or the removed 0.25 `failure_cause`. The
failure causes and the table from Harbor exception types to them live in the Harbor-free
`rl360_ext.outcomes.harbor_exceptions`, which the infra classifier reads too.

The reward rule is stricter than Harbor's policy, never looser:
- reward_source is "verifier" only when THIS run's verifier wrote reward.txt/reward.json: the
  file exists in the trial's verifier directory after the run, parses to exactly the rewards
  Harbor graded, and the verifier phase ran. Harbor deletes stale reward files before grading,
  so a file that is present and matches was written by this run's verifier.
- An exception keeps a verifier reward only when its cause is a policy failure (the model ran
  out of context, refused, its command exited non-zero) and Harbor's policy agrees. Every other
  exception, including one Harbor does not know (Harbor's default for unknown types is
  has_valid_reward=True), leaves the reward null.
- So: reward is a float exactly when reward_source == "verifier"; then failure_cause is null or
  a policy cause. When reward is null, failure_cause says why.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rl360_ext.harbor.envs.nofollow import read_regular
from rl360_ext.outcomes.harbor_exceptions import (
    JUDGE_FAILURE,
    JUDGE_FAILURE_EXIT_CODE,
    POLICY_CAUSES,
    REWARD_FILE_MISSING,
    REWARD_KEY_MISSING,
    VERIFIER_CRASH,
    cause_for_exception_type,
)

MESSAGE_LIMIT = 2000
REWARD_FILE_LIMIT = 1 << 20  # a reward file is a number or a flat dict; anything larger is not one
VERIFIER_EXIT_FILE = "rl360-verifier-exit.json"  # written by rl360_ext.harbor.verifier, read here


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
    return Outcome(
        failure_cause=cause,
        exception_type=type(exc).__name__ if exc is not None else None,
        exception_message=bounded(
            message if message is not None else (str(exc) if exc is not None else None)
        ),
    )


def _read_reward_file(path: Path) -> bytes | None:
    """A reward file's bytes: a regular file, never through a link, at most REWARD_FILE_LIMIT."""
    try:
        return read_regular(path, REWARD_FILE_LIMIT)
    except FileNotFoundError:
        return None


def read_verifier_rewards(verifier_dir: Path) -> dict[str, float] | None:
    """The rewards in reward.json (preferred, as Harbor does) or reward.txt, or None if absent,
    unparsable, a link, not a regular file or larger than REWARD_FILE_LIMIT."""
    try:
        if (raw := _read_reward_file(verifier_dir / "reward.json")) is not None:
            parsed = json.loads(raw)
            values = parsed if isinstance(parsed, dict) else None
        elif (raw := _read_reward_file(verifier_dir / "reward.txt")) is not None:
            values = {"reward": float(raw)}
        else:
            return None
    except (OSError, ValueError):
        return None
    if not values:
        return None
    rewards: dict[str, float] = {}
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return None
        rewards[str(key)] = float(value)
    return rewards


def recorded_test_exit_code(trial_dir: Path) -> int | None:
    """The exit code of the task's tests/test.sh as recorded by rl360's verifier, if it ran."""
    try:
        return int(json.loads((trial_dir / VERIFIER_EXIT_FILE).read_text())["test_exit_code"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def scalar_reward(rewards: Mapping[str, float]) -> float | None:
    """The "reward" key, or the only value of a one-key dict; None when ambiguous."""
    if "reward" in rewards:
        return float(rewards["reward"])
    if len(rewards) == 1:
        return float(next(iter(rewards.values())))
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


def verified_rewards(result: Any, trial_dir: Path) -> dict[str, float] | None:
    """The rewards this run's verifier wrote, or None: the verifier phase ran, Harbor graded, and the
    reward file in the trial's verifier directory parses to exactly what Harbor graded."""
    graded = getattr(getattr(result, "verifier_result", None), "rewards", None)
    if getattr(result, "verifier", None) is None or not graded:
        return None
    on_disk = read_verifier_rewards(trial_dir / "verifier")
    if on_disk is None or on_disk != {str(k): float(v) for k, v in graded.items()}:
        return None
    return on_disk


def classify(result: Any, trial_dir: Path) -> Outcome:
    """The outcome of a finished Harbor trial, from its result and its trial directory."""
    outcome = Outcome(
        phase_timings=phase_timings(result),
        timeline={"sandbox_started_at": sandbox_started_at(result)},
        agent_metrics=agent_metrics(result),
        trial_name=getattr(result, "trial_name", None),
    )
    rewards = verified_rewards(result, trial_dir)
    exception_info = getattr(result, "exception_info", None)
    if recorded_test_exit_code(trial_dir) == JUDGE_FAILURE_EXIT_CODE:
        outcome.failure_cause = JUDGE_FAILURE
        outcome.exception_type = getattr(exception_info, "exception_type", None)
        outcome.exception_message = (
            f"the verifier's judge failed (tests/test.sh exited {JUDGE_FAILURE_EXIT_CODE}); "
            "any reward it wrote is a fallback and does not count"
        )
        return outcome
    if exception_info is not None:
        outcome.exception_type = exception_info.exception_type
        outcome.exception_message = bounded(exception_info.exception_message)
        outcome.failure_cause = cause_for_exception_type(
            exception_info.exception_type, getattr(result, "failure_cause", None)
        )
        if outcome.failure_cause == REWARD_FILE_MISSING and (recorded_test_exit_code(trial_dir) or 0) != 0:
            outcome.failure_cause = VERIFIER_CRASH
        if outcome.failure_cause not in POLICY_CAUSES or not _policy_keeps_reward(exception_info):
            return outcome
    if rewards is None:
        outcome.failure_cause = outcome.failure_cause or REWARD_FILE_MISSING
        return outcome
    reward = scalar_reward(rewards)
    if reward is None:
        outcome.failure_cause = REWARD_KEY_MISSING
        outcome.exception_message = f"the verifier wrote rewards without a 'reward' key: {sorted(rewards)}"
        return outcome
    outcome.reward, outcome.rewards, outcome.reward_source = reward, rewards, "verifier"
    return outcome
