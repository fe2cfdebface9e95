"""`verifier_reward`, the `--custom-rm-path` hook for Miles' stock agentic generate, on duck-typed samples."""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.outcomes.provenance import ATTEMPT_CLASS, REWARD_SOURCE
from rl360_ext.outcomes.verdict import attempt_class_of
from rl360_ext.rollout.agent import failure_metadata
from rl360_ext.rollout.agent import result_metadata as read_answer
from rl360_ext.rollout.rewards import verifier_reward
from tests.rollout.duck_samples import DuckSample

ARGS = SimpleNamespace(reward_key=None)


def _stock_sample(agent_metadata: dict[str, Any] | None, **session: Any) -> DuckSample:
    """What Miles' stock generate leaves: dataset metadata, the agent's dict, the session's facts."""
    metadata: dict[str, Any] = {"task": "fix-mean", **(agent_metadata or {})}
    metadata["session"] = {"id": "s-1", **session}
    return DuckSample(
        group_index=0, index=0, loss_mask=[1, 1], rollout_log_probs=[-0.1, -0.2], metadata=metadata
    )


def _score(sample: DuckSample, args: Any = ARGS) -> Any:
    return asyncio.run(verifier_reward(args, sample))


def _assert_masked(sample: DuckSample, reward: Any, cause: str) -> None:
    assert reward is None and sample.reward is None
    assert sample.metadata[ATTEMPT_CLASS] == f"infra:{cause}"
    assert sample.loss_mask == [0] * sample.response_length and sample.remove_sample


def result_metadata(answer: dict[str, Any]) -> dict[str, Any]:
    """The agent's dict for a /run answer carrying the server's verdict on its fields."""
    return read_answer({**answer, ATTEMPT_CLASS: attempt_class_of(answer)})


def _run(**fields: Any) -> dict[str, Any]:
    return result_metadata({"reward": 1.0, "rewards": {"reward": 1.0}, "reward_source": "verifier", **fields})


def test_a_valid_attempt_gets_the_verifiers_reward() -> None:
    sample = _stock_sample(_run())
    assert _score(sample) == 1.0
    assert sample.metadata[ATTEMPT_CLASS] == "valid"
    assert sample.loss_mask == [1, 1] and not sample.remove_sample


def test_reward_key_returns_the_rewards_dict() -> None:
    sample = _stock_sample(_run())
    assert _score(sample, SimpleNamespace(reward_key="reward")) == {"reward": 1.0}


def test_a_missing_reward_key_is_infra_not_zero() -> None:
    sample = _stock_sample(_run())
    _assert_masked(sample, _score(sample, SimpleNamespace(reward_key="accuracy")), "reward_file_invalid")
    assert "accuracy" in sample.metadata["infra_detail"]


@pytest.mark.parametrize(
    ("agent_metadata", "cause"),
    [
        (result_metadata({"reward": None, "failure_cause": "verifier_crash"}), "verifier_crash"),
        (
            result_metadata({"reward": 1.0, "reward_source": "verifier", "failure_cause": "sandbox_lost"}),
            "sandbox_lost",
        ),
        (result_metadata({"reward": 1.0, "reward_source": "agent"}), "no_verifier_reward"),
        (result_metadata({"reward": math.nan, "reward_source": "verifier"}), "reward_file_invalid"),
        (failure_metadata("client_deadline", "no answer"), "client_deadline"),
        (failure_metadata("transport_error", "connection refused"), "transport_error"),
        (failure_metadata("harbor_internal_error", "boom"), "harbor_internal_error"),
        ({"reward": 1.0, "reward_source": "verifier", ATTEMPT_CLASS: "infra:bogus"}, "unclassified"),
    ],
)
def test_every_infra_shape_is_masked_with_no_reward(agent_metadata: dict[str, Any], cause: str) -> None:
    sample = _stock_sample(agent_metadata)
    _assert_masked(sample, _score(sample), cause)


def test_an_agent_function_that_raised_is_infra_aborted() -> None:
    sample = _stock_sample(None)
    _assert_masked(sample, _score(sample), "aborted")
    assert "agent function raised" in sample.metadata["infra_detail"]


def test_a_5xx_turn_on_the_session_overrides_a_graded_run() -> None:
    sample = _stock_sample(_run(), turn_errors=[{"status": 503, "message": "overloaded"}])
    _assert_masked(sample, _score(sample), "no_engine_available")


def test_a_recorded_valid_class_is_checked_again() -> None:
    sample = _stock_sample({ATTEMPT_CLASS: "valid", "reward": 0.0, REWARD_SOURCE: None})
    _assert_masked(sample, _score(sample), "no_verifier_reward")


def test_the_batched_form_scores_each_sample() -> None:
    valid, infra = _stock_sample(_run()), _stock_sample(None)
    assert asyncio.run(verifier_reward(ARGS, [valid, infra])) == [1.0, None]
    assert infra.remove_sample and not valid.remove_sample


def test_a_dict_reward_without_reward_key_is_a_clear_error() -> None:
    sample = _stock_sample({"reward": {"a": 1.0}, REWARD_SOURCE: "verifier", ATTEMPT_CLASS: "valid"})
    with pytest.raises(ValueError, match="--reward-key"):
        _score(sample)


_values = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
)  # fmt: skip
_metadata = st.fixed_dictionaries(
    {},
    optional={
        "reward": _values,
        REWARD_SOURCE: st.sampled_from(["verifier", "agent", None, ""]),
        "failure_cause": st.sampled_from(
            [None, "", "sandbox_lost", "agent_timeout", "bogus", "verifier_crash"]
        ),
        "exception_type": st.sampled_from([None, "", "AgentTimeoutError", "NoSuchError"]),
        ATTEMPT_CLASS: st.sampled_from(["valid", "infra:sandbox_lost", "infra:bogus", "garbage"]),
        "transport_error": st.sampled_from([None, "reset"]),
        "client_deadline": st.booleans(),
    },
)


@settings(max_examples=200, deadline=None)
@given(agent_metadata=_metadata, turn_status=st.sampled_from([None, 200, 429, 503]))
def test_no_metadata_shape_yields_a_reward_unless_a_verifier_wrote_it(
    agent_metadata: dict[str, Any], turn_status: int | None
) -> None:
    errors = [] if turn_status is None else [{"status": turn_status}]
    sample = _stock_sample(agent_metadata, turn_errors=errors)
    reward = _score(sample)
    if reward is None:
        assert sample.remove_sample and not any(sample.loss_mask)
        assert sample.metadata[ATTEMPT_CLASS].startswith("infra:")
        return
    recorded = agent_metadata.get(ATTEMPT_CLASS)
    assert agent_metadata.get(REWARD_SOURCE) == "verifier"
    assert not isinstance(reward, bool) and math.isfinite(reward) and reward == agent_metadata["reward"]
    assert not (isinstance(recorded, str) and recorded.startswith("infra:"))
    assert agent_metadata.get("failure_cause") in (None, "", "agent_timeout")
    assert not agent_metadata.get("transport_error") and not agent_metadata.get("client_deadline")
    assert turn_status is None or turn_status < 500
    assert sample.metadata[ATTEMPT_CLASS] == "valid" and not sample.remove_sample
