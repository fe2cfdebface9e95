"""The Harbor result adapter: reward provenance and failure causes from real Harbor result models."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from harbor.models.agent.context import AgentContext
from harbor.models.task.id import LocalTaskId
from harbor.models.trial.config import TaskConfig, TrialConfig
from harbor.models.trial.error_policy import ERROR_POLICIES
from harbor.models.trial.result import AgentInfo, ExceptionInfo, TimingInfo, TrialResult
from harbor.models.verifier.result import VerifierResult
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.harbor import outcome
from rl360_ext.outcomes import harbor_exceptions
from rl360_ext.outcomes.attribution import AttributionRule
from rl360_ext.outcomes.causes import POLICY_CAUSES, Cause

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def timing(start: float, seconds: float) -> TimingInfo:
    return TimingInfo(
        started_at=T0 + timedelta(seconds=start), finished_at=T0 + timedelta(seconds=start + seconds)
    )


def make_result(
    trial_dir: Path,
    *,
    graded: dict[str, float] | None = None,
    written: str | None = None,
    written_name: str = "reward.txt",
    exception: str | None = None,
    verifier_ran: bool = True,
    raised_at: float = 0.0,
) -> TrialResult:
    (trial_dir / "verifier").mkdir(parents=True, exist_ok=True)
    if written is not None:
        (trial_dir / "verifier" / written_name).write_text(written)
    return TrialResult(
        task_name="t",
        trial_name="t__abc",
        trial_uri=trial_dir.as_uri(),
        task_id=LocalTaskId(path=trial_dir),
        task_checksum="0",
        config=TrialConfig(task=TaskConfig(path=trial_dir)),
        agent_info=AgentInfo(name="oracle", version="1"),
        agent_result=AgentContext(n_input_tokens=120, n_output_tokens=30, metadata={"n_episodes": 4}),
        verifier_result=VerifierResult(rewards=graded) if graded is not None else None,
        exception_info=ExceptionInfo(
            exception_type=exception, exception_message="boom", exception_traceback="",
            occurred_at=T0 + timedelta(seconds=raised_at),
        )
        if exception
        else None,
        environment_setup=timing(0, 1.5),
        agent_setup=timing(1.5, 0.5),
        agent_execution=timing(2, 10),
        verifier=timing(12, 2) if verifier_ran else None,
    )


def test_a_reward_the_verifier_wrote_counts(tmp_path: Path) -> None:
    result = outcome.classify(make_result(tmp_path, graded={"reward": 1.0}, written="1\n"), tmp_path)
    assert (result.reward, result.reward_source, result.failure_cause) == (1.0, "verifier", None)
    assert result.rewards == {"reward": 1.0} and result.attempt_class == "valid"
    assert result.phase_timings == {
        "environment_setup": 1.5,
        "agent_setup": 0.5,
        "agent": 10.0,
        "verifier": 2.0,
    }
    assert (result.agent_metrics.turns, result.agent_metrics.input_tokens) == (4, 120)
    assert result.timeline["sandbox_started_at"] == T0.timestamp()


def test_a_graded_reward_without_the_file_on_disk_does_not_count(tmp_path: Path) -> None:
    result = outcome.classify(make_result(tmp_path, graded={"reward": 1.0}), tmp_path)
    assert (result.reward, result.reward_source, result.failure_cause) == (None, None, "reward_file_missing")
    assert result.attempt_class == "infra:reward_file_missing"


def test_a_file_that_disagrees_with_what_harbor_graded_does_not_count(tmp_path: Path) -> None:
    result = outcome.classify(make_result(tmp_path, graded={"reward": 0.0}, written="1"), tmp_path)
    assert result.reward is None and result.reward_source is None


def test_a_reward_file_left_by_the_agent_without_a_verifier_run_does_not_count(tmp_path: Path) -> None:
    result = outcome.classify(
        make_result(tmp_path, graded={"reward": 1.0}, written="1", verifier_ran=False), tmp_path
    )
    assert result.reward is None and result.failure_cause == "reward_file_missing"


def test_an_unknown_exception_keeps_no_reward_although_harbor_would(tmp_path: Path) -> None:
    harbor_result = make_result(tmp_path, graded={"reward": 1.0}, written="1", exception="KeyError")
    assert harbor_result.reward_valid  # Harbor's default policy for unknown types keeps the reward
    result = outcome.classify(harbor_result, tmp_path)
    assert (result.reward, result.reward_source, result.failure_cause) == (None, None, "unclassified")
    assert result.attempt_class == "infra:unclassified"
    assert (result.exception_type, result.exception_message) == ("KeyError", "boom")


def test_a_policy_failure_keeps_the_verifier_reward(tmp_path: Path) -> None:
    harbor_result = make_result(
        tmp_path, graded={"reward": 0.0}, written="0", exception="ContextLengthExceededError"
    )
    result = outcome.classify(harbor_result, tmp_path)
    assert (result.reward, result.reward_source, result.failure_cause) == (
        0.0,
        "verifier",
        "context_length_exceeded",
    )
    assert result.attempt_class == "valid"


def test_an_agent_timeout_keeps_the_grade_the_verifier_gave_after_it(tmp_path: Path) -> None:
    harbor_result = make_result(
        tmp_path, graded={"reward": 1.0}, written="1", exception="AgentTimeoutError", raised_at=11.0
    )
    result = outcome.classify(harbor_result, tmp_path)
    assert (result.reward, result.failure_cause, result.attempt_class) == (1.0, "agent_timeout", "valid")
    assert result.attributed_to == "policy"
    listed = outcome.trial_facts(harbor_result, tmp_path, rule=AttributionRule.LIST)
    result = outcome.classify(harbor_result, tmp_path, facts=listed)
    assert (result.reward, result.failure_cause, result.attempt_class) == (
        None,
        "agent_timeout",
        "infra:agent_timeout",
    )
    assert result.attributed_to == "infrastructure"


@pytest.mark.parametrize(
    ("exit_code", "cause"), [(3, "verifier_crash"), (0, "reward_file_missing"), (None, "reward_file_missing")]
)
def test_a_missing_reward_is_a_crash_when_the_test_script_failed(
    tmp_path: Path, exit_code: int | None, cause: str
) -> None:
    if exit_code is not None:
        (tmp_path / outcome.VERIFIER_EXIT_FILE).write_text(json.dumps({"test_exit_code": exit_code}))
    result = outcome.classify(make_result(tmp_path, exception="RewardFileNotFoundError"), tmp_path)
    assert (result.reward, result.failure_cause) == (None, cause)


def test_rewards_without_a_reward_key_are_ambiguous(tmp_path: Path) -> None:
    graded = {"tests": 1.0, "style": 0.5}
    harbor_result = make_result(
        tmp_path, graded=graded, written=json.dumps(graded), written_name="reward.json"
    )
    result = outcome.classify(harbor_result, tmp_path)
    assert (result.reward, result.rewards, result.failure_cause) == (None, None, "reward_key_missing")
    assert "tests" in (result.exception_message or "")


def test_a_single_named_reward_is_the_reward(tmp_path: Path) -> None:
    harbor_result = make_result(
        tmp_path, graded={"pass": 1}, written='{"pass": 1}', written_name="reward.json"
    )
    assert outcome.classify(harbor_result, tmp_path).reward == 1.0


def test_harbor_025_failure_cause_is_used_for_unknown_exception_types(tmp_path: Path) -> None:
    legacy = SimpleNamespace(
        exception_info=SimpleNamespace(exception_type="SomethingNew", exception_message="x"),
        failure_cause="agent_exhausted_budget",
        verifier_result=None,
        verifier=None,
    )
    result = outcome.classify(legacy, tmp_path)
    assert (result.reward, result.failure_cause) == (None, "agent_timeout")


def test_every_exception_harbor_classifies_has_a_cause() -> None:
    for name, policy in ERROR_POLICIES.items():
        cause = harbor_exceptions.cause_for_exception_type(name)
        assert cause != Cause.UNCLASSIFIED, name
        if cause in POLICY_CAUSES:
            assert policy.has_valid_reward, name


def test_failure_messages_are_bounded() -> None:
    result = outcome.failure("sandbox_failed", RuntimeError("x" * 10_000))
    assert (result.exception_type, result.attempt_class) == ("RuntimeError", "infra:sandbox_lost")
    assert len(result.exception_message or "") <= outcome.MESSAGE_LIMIT


@pytest.mark.parametrize("text", ["nan", "inf", "", "one"])
def test_unparsable_reward_text_is_not_a_reward(tmp_path: Path, text: str) -> None:
    (tmp_path / "reward.txt").write_text(text)
    assert outcome.read_verifier_rewards(tmp_path) is None


@pytest.mark.parametrize("payload", ['{"reward": true}', '{"reward": "1"}', "[1]", "{}", '{"reward": NaN}'])
def test_malformed_reward_json_is_not_a_reward(tmp_path: Path, payload: str) -> None:
    (tmp_path / "reward.json").write_text(payload)
    assert outcome.read_verifier_rewards(tmp_path) is None


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=8),
        st.floats(-1000, 1000, width=32) | st.integers(-1000, 1000),  # the default reward range
        min_size=1,
        max_size=4,
    )
)
def test_reward_json_round_trips(tmp_path_factory: pytest.TempPathFactory, rewards: dict[str, float]) -> None:
    directory = tmp_path_factory.mktemp("rewards")
    (directory / "reward.json").write_text(json.dumps(rewards))
    assert outcome.read_verifier_rewards(directory) == {k: float(v) for k, v in rewards.items()}


@settings(max_examples=40, deadline=None)
@given(
    st.text(min_size=1, max_size=30).filter(
        lambda name: harbor_exceptions.cause_for_exception_type(name) not in POLICY_CAUSES
    )
)
def test_no_exception_outside_the_policy_causes_keeps_a_reward(
    tmp_path_factory: pytest.TempPathFactory, name: str
) -> None:
    trial_dir = tmp_path_factory.mktemp("trial")
    result = outcome.classify(
        make_result(trial_dir, graded={"reward": 1.0}, written="1", exception=name), trial_dir
    )
    assert result.reward is None and result.reward_source is None and result.failure_cause is not None
    assert result.attempt_class is not None and result.attempt_class.startswith("infra:")


@pytest.mark.parametrize("exception", [None, "RewardFileNotFoundError"])
def test_a_judge_failure_keeps_no_reward_even_with_a_fallback_reward_file(
    tmp_path: Path, exception: str | None
) -> None:
    (tmp_path / outcome.VERIFIER_EXIT_FILE).write_text(json.dumps({"test_exit_code": 75}))
    harbor_result = make_result(tmp_path, graded={"reward": 0.0}, written="0", exception=exception)
    result = outcome.classify(harbor_result, tmp_path)
    assert (result.reward, result.rewards, result.reward_source) == (None, None, None)
    assert (result.failure_cause, result.attempt_class) == ("judge_failure", "infra:judge_failure")
    assert "judge failed" in (result.exception_message or "")


@pytest.mark.parametrize("graded", [{"reward": int("9" * 400)}, {"reward": True}, {"reward": 1e308}])
def test_rewards_harbor_graded_outside_the_rule_are_no_reward_never_an_error(
    tmp_path: Path, graded: dict[str, float]
) -> None:
    harbor_result = make_result(
        tmp_path, graded=graded, written=json.dumps(graded), written_name="reward.json"
    )
    result = outcome.classify(harbor_result, tmp_path)
    assert (result.reward, result.reward_source) == (None, None)
    assert result.attempt_class is not None and result.attempt_class.startswith("infra:")
    assert result.failure_cause != "harbor_internal_error"
