"""Text a server can carry: what UTF-8 cannot encode, found before it is used, and answers that
cannot fail to encode.

Owns the one rule every rl360 server applies to request strings: a string must round-trip through
UTF-8 (Python's JSON parser accepts `"\\ud800"`, a lone surrogate, which no UTF-8 encoder takes),
and a string meant as a path or a name holds no control character (NUL included).
- `unencodable(value)`: where in a JSON-like value the first string UTF-8 cannot encode is (a dict
  key or value, at any depth), else None;
- `TextModel`: a pydantic base whose every field refuses such a string, naming the field (and the
  place inside it);
- `shown(text)`: a string safe to echo in an error message (lone surrogates and controls escaped);
- `json_bytes(value)`: orjson's encoding, which cannot raise for a string: one it cannot encode is
  written with its unencodable code points escaped.
It does not own any server's error shape or status codes.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from pydantic import BaseModel, ValidationInfo, field_validator

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
SHOWN_MAX = 80  # characters of a bad value an error message echoes


def encodable(text: str) -> bool:
    """`text` encodes to UTF-8 (it holds no lone surrogate)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def unencodable(value: Any, where: str = "") -> str | None:
    """The path (`where`, then `.key` / `[i]`) of the first string in `value` UTF-8 cannot encode."""
    if isinstance(value, str):
        return None if encodable(value) else where
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and not encodable(key):
                return f"{where}.{shown(key)}" if where else shown(key)
            found = unencodable(item, f"{where}.{key}" if where else str(key))
            if found is not None:
                return found
        return None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = unencodable(item, f"{where}[{index}]")
            if found is not None:
                return found
    return None


def has_control(text: str) -> bool:
    """`text` holds a control character (NUL, CR, LF, DEL, ...): not a path or a name."""
    return _CONTROL.search(text) is not None


def shown(text: str, limit: int = SHOWN_MAX) -> str:
    """`text` as an error message may echo it: at most `limit` characters, lone surrogates and
    control characters written as escapes, so the message itself always encodes."""
    cut = text[:limit]
    escaped = cut.encode("utf-8", "backslashreplace").decode("utf-8")
    escaped = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", escaped)
    return escaped + ("..." if len(text) > limit else "")


def _escaped(value: Any) -> Any:
    if isinstance(value, str):
        return value if encodable(value) else value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_escaped(k) if isinstance(k, str) else k: _escaped(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_escaped(v) for v in value]
    return value


def json_bytes(value: Any, option: int = 0) -> bytes:
    """`orjson.dumps(value, option=option)`; a string UTF-8 cannot encode is written escaped
    (`\\ud800` as the six characters), so an answer's encoding never fails for its text."""
    try:
        return orjson.dumps(value, option=option)
    except orjson.JSONEncodeError:
        return orjson.dumps(_escaped(value), option=option)


def refuse_unencodable(value: Any, field: str) -> Any:
    """`value` unchanged, or ValueError naming where in `field` a string UTF-8 cannot encode is."""
    where = unencodable(value, field)
    if where is not None:
        raise ValueError(f"{where}: holds a lone surrogate (a code point in U+D800-U+DFFF), not UTF-8 text")
    return value


class TextModel(BaseModel):
    """A request body whose every field, at any depth, holds only text UTF-8 can encode."""

    @field_validator("*", mode="before")
    @classmethod
    def _utf8_only(cls, value: Any, info: ValidationInfo) -> Any:
        return refuse_unencodable(value, info.field_name or "body")
