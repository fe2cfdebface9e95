"""The one reward-file rule: finite numbers within the server's range, else reward_file_invalid with
the reason, never an exception; the verifier grades with it and the result adapter reads with it."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from harbor.environments.base import ExecResult
from harbor.models.task.config import TaskOS
from harbor.verifier.verifier import RewardFileEmptyError, VerifierOutputParseError
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.harbor import outcome
from rl360_ext.harbor.verifier import ExitRecordingVerifier
from rl360_ext.outcomes.causes import Cause
from rl360_ext.outcomes.rewards import (
    REWARD_JSON,
    REWARD_TXT,
    RewardRange,
    parse_reward_file,
)

BOUNDS = RewardRange(-10.0, 10.0)
INVALID = Cause.REWARD_FILE_INVALID


@pytest.mark.parametrize(
    ("name", "raw", "why"),
    [
        (REWARD_TXT, b"true", "one decimal number"),
        (REWARD_TXT, "\u0661".encode(), "one decimal number"),  # ARABIC-INDIC DIGIT ONE: float() reads it
        (REWARD_TXT, "\uff11".encode(), "one decimal number"),  # FULLWIDTH DIGIT ONE
        (REWARD_TXT, b"1_000", "one decimal number"),
        (REWARD_TXT, b"inf", "one decimal number"),
        (REWARD_TXT, b"NaN", "one decimal number"),
        (REWARD_TXT, b"0x1", "one decimal number"),
        (REWARD_TXT, b"1 2", "one decimal number"),
        (REWARD_TXT, b"1e308", "outside the reward range"),
        (REWARD_TXT, b"-1e300", "outside the reward range"),
        (REWARD_TXT, b"1e400", "not a finite number"),
        (REWARD_TXT, b"9" * 400, "characters"),
        (REWARD_TXT, b"\xff\xfe1", "not UTF-8"),
        (REWARD_JSON, b"true", "JSON object"),
        (REWARD_JSON, b"1", "JSON object"),
        (REWARD_JSON, b"[1]", "JSON object"),
        (REWARD_JSON, b"null", "JSON object"),
        (REWARD_JSON, b'"1"', "JSON object"),
        (REWARD_JSON, b"{}", "empty object"),
        (REWARD_JSON, b'{"reward": true}', "a boolean"),
        (REWARD_JSON, b'{"reward": false}', "a boolean"),
        (REWARD_JSON, b'{"reward": null}', "null"),
        (REWARD_JSON, b'{"reward": "1"}', "a string"),
        (REWARD_JSON, b'{"reward": [1]}', "an array"),
        (REWARD_JSON, b'{"reward": {"a": 1}}', "an object"),
        (REWARD_JSON, b'{"reward": NaN}', "NaN"),
        (REWARD_JSON, b'{"reward": Infinity}', "Infinity"),
        (REWARD_JSON, b'{"reward": -Infinity}', "Infinity"),
        (REWARD_JSON, b'{"reward": 1e308}', "outside the reward range"),
        (REWARD_JSON, b'{"reward": -1e300}', "outside the reward range"),
        (REWARD_JSON, b'{"reward": 1e999}', "not a finite number"),
        (REWARD_JSON, b'{"reward": ' + b"9" * 400 + b"}", "characters"),
        (REWARD_JSON, b'{"reward": ' + b"9" * 5000 + b"}", "characters"),  # past int()'s digit limit
        (REWARD_JSON, b'{"reward": 1_000}', "not valid JSON"),
        (REWARD_JSON, '{"reward": \u0661}'.encode(), "not valid JSON"),
        (REWARD_JSON, b'{"reward": 1, "reward": 0}', "twice"),
        (REWARD_JSON, b"[" * 200_000, "nested too deeply"),
        (REWARD_JSON, b'{"reward": 1} {"reward": 0}', "not valid JSON"),
        (REWARD_JSON, json.dumps({f"k{i}": 0 for i in range(100)}).encode(), "keys"),
    ],
)
def test_what_is_not_a_finite_in_range_number_is_reward_file_invalid(name: str, raw: bytes, why: str) -> None:
    parsed = parse_reward_file(name, raw, BOUNDS)
    assert (parsed.rewards, parsed.cause) == (None, INVALID), parsed
    assert why in (parsed.reason or ""), parsed.reason


@pytest.mark.parametrize(
    ("name", "raw", "rewards"),
    [
        (REWARD_TXT, b"1\n", {"reward": 1.0}),
        (REWARD_TXT, b" -0.25 ", {"reward": -0.25}),
        (REWARD_TXT, b"1e1", {"reward": 10.0}),
        (REWARD_TXT, b".5", {"reward": 0.5}),
        (REWARD_JSON, b'{"reward": 1, "tests_passed": 3}', {"reward": 1.0, "tests_passed": 3.0}),
        (REWARD_JSON, b'{"reward": -10}', {"reward": -10.0}),
    ],
)
def test_finite_numbers_within_the_range_are_rewards(
    name: str, raw: bytes, rewards: dict[str, float]
) -> None:
    assert parse_reward_file(name, raw, BOUNDS).rewards == rewards


@pytest.mark.parametrize("raw", [b"", b"  \n\t"])
def test_an_empty_file_is_reward_file_empty(raw: bytes) -> None:
    for name in (REWARD_TXT, REWARD_JSON):
        assert parse_reward_file(name, raw, BOUNDS).cause == Cause.REWARD_FILE_EMPTY


def test_a_range_needs_finite_ordered_bounds() -> None:
    for low, high in [(1.0, 0.0), (0.0, 0.0), (-math.inf, 1.0), (0.0, math.nan)]:
        with pytest.raises(ValueError, match="finite low < high"):
            RewardRange(low, high)


def _check(parsed: object, bounds: RewardRange) -> None:
    rewards, cause, reason = parsed.rewards, parsed.cause, parsed.reason  # type: ignore[attr-defined]
    if rewards is not None:
        assert cause is None and rewards
        for key, value in rewards.items():
            assert isinstance(key, str) and type(value) is float and math.isfinite(value)
            assert bounds.low <= value <= bounds.high
    else:
        assert cause in (Cause.REWARD_FILE_INVALID, Cause.REWARD_FILE_EMPTY) and reason


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=5)
    | st.integers(min_value=10**30, max_value=10**500),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=6,
)


def _as_json(value: object) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from([REWARD_TXT, REWARD_JSON]),
    raw=st.binary(max_size=80)
    | st.text(max_size=40).map(str.encode)
    | _json_values.map(_as_json)
    | st.dictionaries(st.text(max_size=6), _json_values, max_size=4).map(_as_json)
    | st.from_regex(r"\A\s*[+-]?[0-9\u0660-\u0669_.eE]{0,80}\s*\Z").map(str.encode),
    low=st.floats(-1e6, 0, allow_nan=False),
    width=st.floats(1e-3, 1e6, allow_nan=False),
)
def test_any_file_is_a_valid_in_range_reward_or_a_refusal_never_an_exception(
    name: str, raw: bytes, low: float, width: float
) -> None:
    bounds = RewardRange(low, low + width)
    _check(parse_reward_file(name, raw, bounds), bounds)


def test_the_adapter_reads_a_large_or_linked_file_as_invalid_not_an_error(tmp_path: Path) -> None:
    (tmp_path / REWARD_TXT).write_bytes(b"1" * (outcome.REWARD_FILE_LIMIT + 1))
    too_large = outcome.read_reward(tmp_path / REWARD_TXT, BOUNDS)
    assert too_large is not None and too_large.cause == INVALID and "larger than" in (too_large.reason or "")
    (tmp_path / "host.txt").write_text("1")
    os.symlink(tmp_path / "host.txt", tmp_path / REWARD_JSON)
    linked = outcome.read_reward(tmp_path / REWARD_JSON, BOUNDS)
    assert linked is not None and linked.cause == INVALID and "not a regular file" in (linked.reason or "")
    assert outcome.read_reward(tmp_path / "absent.json", BOUNDS) is None


def _verifier(verifier_dir: Path, bounds: RewardRange) -> ExitRecordingVerifier:
    """The verifier's parsing methods alone (no task, no sandbox)."""
    verifier = ExitRecordingVerifier.__new__(ExitRecordingVerifier)
    verifier.reward_range = bounds
    verifier.trial_paths = SimpleNamespace(  # type: ignore[assignment]
        reward_json_path=verifier_dir / REWARD_JSON,
        reward_text_path=verifier_dir / REWARD_TXT,
        verifier_dir=verifier_dir,
    )
    return verifier


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b'{"reward": ' + b"9" * 400 + b"}", VerifierOutputParseError),
        (b'{"reward": true}', VerifierOutputParseError),
        (b"7", VerifierOutputParseError),
        (b"", RewardFileEmptyError),
    ],
)
def test_the_verifier_grades_by_the_same_rule_with_harbor_s_exceptions(
    tmp_path: Path, raw: bytes, error: type[Exception]
) -> None:
    (tmp_path / REWARD_JSON).write_bytes(raw)
    with pytest.raises(error):
        _verifier(tmp_path, BOUNDS)._parse_reward_json()


def test_the_verifier_and_the_adapter_agree_on_what_counts(tmp_path: Path) -> None:
    (tmp_path / REWARD_JSON).write_text('{"reward": 5}')
    narrow = RewardRange(0.0, 1.0)
    with pytest.raises(VerifierOutputParseError, match="outside the reward range"):
        _verifier(tmp_path, narrow)._parse_reward_json()
    assert outcome.read_verifier_rewards(tmp_path, narrow) is None
    assert _verifier(tmp_path, BOUNDS)._parse_reward_json() == {"reward": 5.0}
    assert outcome.read_verifier_rewards(tmp_path, BOUNDS) == {"reward": 5.0}


class _Sandbox:
    """An environment with or without host-side `remove_files`, recording what it is asked."""

    os = TaskOS.LINUX

    def __init__(self, host_removal: bool) -> None:
        self.commands: list[str] = []
        self.removed: list[list[str]] = []
        if host_removal:
            self.remove_files = self._remove

    async def _remove(self, paths: list[str]) -> None:
        self.removed.append(paths)

    async def exec(self, command: str, **_: object) -> ExecResult:
        self.commands.append(command)
        return ExecResult(stdout="", stderr="", return_code=0)

    def is_path_mounted(self, *_: object) -> bool:
        return False


@pytest.mark.parametrize("host_removal", [True, False], ids=["host", "command"])
async def test_stale_reward_files_are_removed_on_the_host_where_the_sandbox_can(
    tmp_path: Path, host_removal: bool
) -> None:
    verifier = _verifier(tmp_path, BOUNDS)
    sandbox = _Sandbox(host_removal)
    verifier.environment = sandbox  # type: ignore[assignment]
    (tmp_path / REWARD_TXT).write_text("1")
    (tmp_path / REWARD_JSON).write_text('{"reward": 1}')
    await verifier._remove_reward_files()
    assert not (tmp_path / REWARD_TXT).exists() and not (tmp_path / REWARD_JSON).exists()
    if host_removal:
        assert sandbox.commands == []
        assert sandbox.removed == [["/logs/verifier/reward.txt", "/logs/verifier/reward.json"]]
    else:
        assert sandbox.removed == [] and sandbox.commands == [
            "rm -f -- /logs/verifier/reward.txt /logs/verifier/reward.json"
        ]
