"""Churn SPEC parsing (`--engine-churn`): what it accepts, and errors that name the flag and entry."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl360_ext.local.demo.plan import DemoConfig
from rl360_ext.weights.churn import HANG, KILL, ChurnEvent, parse_churn


def test_parses_the_issue_example_in_step_order() -> None:
    assert parse_churn("hang:2, kill:1,KILL:3") == (
        ChurnEvent(KILL, 1),
        ChurnEvent(HANG, 2),
        ChurnEvent(KILL, 3),
    )
    assert parse_churn("") == parse_churn(None) == parse_churn("  ") == ()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("kill", r"'kill' is not kill:STEP or hang:STEP"),
        ("stop:1", r"'stop:1' is not kill:STEP or hang:STEP"),
        ("kill:-1", r"STEP must be a non-negative integer, got '-1'"),
        ("kill:x", r"STEP must be a non-negative integer"),
        ("kill:1,,hang:2", r"empty entry"),
        ("kill:1,hang:1", r"step 1 already has kill:1"),
        ("kill:5", r"STEP must be below --steps \(3\), got 5"),
    ],
)
def test_errors_name_the_flag_and_the_entry(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=r"--engine-churn: .*" + message):
        parse_churn(spec, steps=3)


def test_demo_config_rejects_a_bad_spec_naming_the_flag() -> None:
    with pytest.raises(ValueError, match="--engine-churn"):
        DemoConfig(steps=2, engine_churn="kill:2")
    with pytest.raises(ValueError, match="confirm_timeout_s"):
        DemoConfig(confirm_timeout_s=0.5)
    config = DemoConfig(steps=4, engine_churn="kill:1,hang:2,kill:3")
    assert [str(e) for e in config.churn_events] == ["kill:1", "hang:2", "kill:3"]


@given(st.dictionaries(st.integers(0, 50), st.sampled_from([KILL, HANG]), max_size=8))
def test_events_written_as_a_spec_parse_back(events: dict[int, str]) -> None:
    planned = tuple(ChurnEvent(kind, step) for step, kind in sorted(events.items()))
    assert parse_churn(",".join(str(event) for event in planned), steps=51) == planned
