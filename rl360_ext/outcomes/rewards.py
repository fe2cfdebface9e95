"""What a verifier's reward file says: finite numbers within the server's range, or why not.

Owns the one rule for the bytes of `reward.json` and `reward.txt` (rl360's verifier grades with
it in place of Harbor's own parser, and the result adapter reads the file back with it). The
parser is total: for any bytes it returns a `RewardParse`, never raises. A file is
- empty (zero bytes or ASCII whitespace only): `reward_file_empty`;
- `reward.txt`: one ASCII decimal number (`[+-]digits[.digits][e[+-]digits]`, at most
  `MAX_NUMBER_CHARS` characters), read as `{"reward": value}`;
- `reward.json`: a JSON object (strict UTF-8 JSON, no duplicate keys, at most `MAX_REWARD_KEYS`
  keys of at most `MAX_KEY_CHARS` characters) whose every value is a JSON number literal of at
  most `MAX_NUMBER_CHARS` characters;
and every value must be finite and within `RewardRange`. Anything else (`true`, a bare number
where an object is expected, `null`, strings, nested values, unicode digits, `1_000`, `inf`,
`NaN`, `1e308` over the range, a 400-digit integer, deep nesting) is `reward_file_invalid`
with the reason. It does not read files (`rl360_ext.harbor.outcome` does, capped, never
through a link) and does not decide whether the reward counts (`rl360_ext.outcomes.verdict`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, NoReturn

from rl360_ext.errors import Rl360Error
from rl360_ext.outcomes.causes import Cause

REWARD_JSON = "reward.json"
REWARD_TXT = "reward.txt"
MAX_NUMBER_CHARS = 64
MAX_REWARD_KEYS = 64
MAX_KEY_CHARS = 128
_WHITESPACE = " \t\r\n\f\v"
_TEXT_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_REASON_QUOTE = 60  # characters of an offending value quoted in a reason


@dataclass(frozen=True)
class RewardRange:
    """The rewards a verifier may write: finite, `low <= value <= high`."""

    low: float = -1000.0
    """Smallest reward that counts."""
    high: float = 1000.0
    """Largest reward that counts."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low < self.high):
            raise ValueError(f"a reward range needs finite low < high, got [{self.low}, {self.high}]")


@dataclass(frozen=True)
class RewardParse:
    """Rewards, or the cause (`reward_file_empty` / `reward_file_invalid`) and the reason."""

    rewards: dict[str, float] | None = None
    cause: Cause | None = None
    reason: str | None = None


class _Invalid(Rl360Error):
    """Internal: the reason a file is not a reward file."""


def _quote(text: str) -> str:
    return repr(text if len(text) <= _REASON_QUOTE else text[:_REASON_QUOTE] + "...")


def _refuse(reason: str) -> NoReturn:
    raise _Invalid(reason)


def _number(literal: str, bounds: RewardRange) -> float:
    if len(literal) > MAX_NUMBER_CHARS:
        _refuse(f"a number of {len(literal)} characters (at most {MAX_NUMBER_CHARS})")
    value = float(literal)
    if not math.isfinite(value):
        _refuse(f"{_quote(literal)} is not a finite number")
    if not bounds.low <= value <= bounds.high:
        _refuse(f"{_quote(literal)} is outside the reward range [{bounds.low:g}, {bounds.high:g}]")
    return value


def _no_constant(name: str) -> NoReturn:
    _refuse(f"{name} is not a finite number")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        _refuse(f"a key appears twice: {_quote(next(k for k in keys if keys.count(k) > 1))}")
    return dict(pairs)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    kinds = {dict: "an object", list: "an array", str: "a string", float: "a number"}
    return kinds.get(type(value), type(value).__name__)


def _json_rewards(text: str, bounds: RewardRange) -> dict[str, float]:
    parsed = json.loads(
        text,
        parse_int=lambda literal: _number(literal, bounds),
        parse_float=lambda literal: _number(literal, bounds),
        parse_constant=_no_constant,
        object_pairs_hook=_object,
    )
    if not isinstance(parsed, dict):
        _refuse(f"a JSON object of rewards was expected, got {_kind(parsed)}")
    if not parsed:
        _refuse("an empty object, no rewards")
    if len(parsed) > MAX_REWARD_KEYS:
        _refuse(f"{len(parsed)} keys (at most {MAX_REWARD_KEYS})")
    for key, value in parsed.items():
        if len(key) > MAX_KEY_CHARS:
            _refuse(f"a key of {len(key)} characters (at most {MAX_KEY_CHARS})")
        if not isinstance(value, float):  # every number literal became a float; nothing else did
            _refuse(f"reward {_quote(key)} is {_kind(value)}, not a number")
    return parsed


def _text_reward(text: str, bounds: RewardRange) -> dict[str, float]:
    if not _TEXT_NUMBER.fullmatch(text):
        _refuse(f"one decimal number was expected, got {_quote(text)}")
    return {"reward": _number(text, bounds)}


def parse_reward_file(name: str, raw: bytes, bounds: RewardRange) -> RewardParse:
    """The rewards in a reward file's bytes (`name`: reward.json or reward.txt); never raises."""
    if not raw.strip(_WHITESPACE.encode()):
        return RewardParse(cause=Cause.REWARD_FILE_EMPTY, reason=f"{name} is empty")
    try:
        try:
            text = raw.decode("utf-8").strip(_WHITESPACE)
        except UnicodeDecodeError:
            _refuse("it is not UTF-8 text")
        if name == REWARD_JSON:
            rewards = _json_rewards(text, bounds)
        elif name == REWARD_TXT:
            rewards = _text_reward(text, bounds)
        else:
            _refuse(f"{name!r} is not a reward file name ({REWARD_JSON}, {REWARD_TXT})")
    except _Invalid as invalid:
        return RewardParse(cause=Cause.REWARD_FILE_INVALID, reason=f"{name}: {invalid}")
    except ValueError as exc:  # JSONDecodeError: not JSON at all
        return RewardParse(cause=Cause.REWARD_FILE_INVALID, reason=f"{name} is not valid JSON: {exc}")
    except RecursionError:
        return RewardParse(cause=Cause.REWARD_FILE_INVALID, reason=f"{name} is nested too deeply")
    return RewardParse(rewards=rewards)
