"""`rl360_ext.util.text`: finding what UTF-8 cannot encode, and answers that cannot fail to encode,
over hypothesis' full text strategy (lone surrogates included)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import find, given
from hypothesis import strategies as st
from pydantic import Field, ValidationError

from rl360_ext.util.text import TextModel, encodable, json_bytes, shown, unencodable

ANY_TEXT = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=20)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
    max_leaves=12,
)


def _round_trips(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def test_the_strategy_reaches_lone_surrogates() -> None:
    assert not encodable("\ud800") and not encodable("a\udcffb") and encodable("\U0001f600")
    assert not encodable(find(ANY_TEXT, lambda text: not encodable(text)))


@given(JSON_VALUES)
def test_unencodable_finds_exactly_what_utf8_cannot_carry(value: Any) -> None:
    where = unencodable(value, "body")
    assert (where is None) == _round_trips(value)
    if where is not None:
        assert where.startswith("body") and encodable(where)


@given(JSON_VALUES)
def test_json_bytes_never_raises_and_keeps_what_encodes(value: Any) -> None:
    encoded = json_bytes(value)
    decoded = json.loads(encoded)
    if _round_trips(value):
        assert decoded == orjson.loads(orjson.dumps(value))


@given(ANY_TEXT)
def test_shown_always_encodes_and_has_no_control_characters(text: str) -> None:
    echoed = shown(text)
    assert encodable(echoed)
    assert not any(ord(c) < 0x20 or ord(c) == 0x7F for c in echoed)


class Body(TextModel):
    name: str
    params: dict[str, Any] = Field(default_factory=dict)


@given(ANY_TEXT, JSON_VALUES)
def test_a_text_model_refuses_every_unencodable_string_naming_its_field(name: str, params: Any) -> None:
    try:
        body = Body(name=name, params=params if isinstance(params, dict) else {"p": params})
    except ValidationError as exc:
        error = exc.errors()[0]
        assert error["loc"][0] in ("name", "params")
        assert encodable(str(error["msg"]))
        return
    assert unencodable(body.model_dump()) is None


@pytest.mark.parametrize("bad", ["\ud800", {"k": ["\udcff"]}, {"\udfff": 1}])
def test_the_error_names_the_place_inside_the_field(bad: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        Body(name="x", params={"p": bad})
    assert "params.p" in caught.value.errors()[0]["msg"]
