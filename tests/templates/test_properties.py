"""Property tests: conversations drawn by hypothesis through the same generator."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rl360_ext.templates.check import (
    AFTER_END,
    REASONING_DROPPED,
    TOOL_CALL_RESERIALIZED,
    check_conversation,
)
from rl360_ext.templates.conversations import Chooser, build_conversation
from rl360_ext.templates.render import ChatRenderer
from rl360_ext.templates.select import fixed_template
from tests.templates.texts import has_special_token

SAFE_TEXT = st.text(max_size=16).filter(lambda t: not has_special_token(t))


class DataChooser(Chooser):
    """The generator's choices drawn by hypothesis (so failures shrink), texts beyond the pools."""

    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def chance(self, p: float) -> bool:
        return self.data.draw(st.booleans())

    def integer(self, low: int, high: int) -> int:
        return self.data.draw(st.integers(low, high))

    def pick(self, options: Sequence[Any]) -> Any:
        return self.data.draw(st.sampled_from(list(options)))

    def text(self, pool: Sequence[str]) -> str:
        return self.data.draw(st.sampled_from(list(pool)) | SAFE_TEXT)


def kinds(renderer: ChatRenderer, conversation) -> set[str]:
    return {m.kind for m in check_conversation(renderer, conversation, "<|im_end|>").mismatches}


@pytest.mark.parametrize("template", ["reference", "qwen3"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_fixed_templates_hold_on_any_conversation(tokenizer, template, data) -> None:
    renderer = ChatRenderer(tokenizer, fixed_template(template))
    conversation = build_conversation(DataChooser(data))
    assert kinds(renderer, conversation) == set()


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_newline_after_end_fails_at_every_split(tokenizer, fixture_template, data) -> None:
    renderer = ChatRenderer(tokenizer, fixture_template("newline_after_end"))
    conversation = build_conversation(DataChooser(data))
    assume(any(turn.new_messages for turn in conversation.turns))
    assert kinds(renderer, conversation) == {AFTER_END}


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_reserialized_arguments_fail_whenever_a_tool_is_called(tokenizer, fixture_template, data) -> None:
    renderer = ChatRenderer(tokenizer, fixture_template("reserializes_arguments"))
    conversation = build_conversation(DataChooser(data))
    assume(any(turn.assistant.get("tool_calls") for turn in conversation.turns))
    assert kinds(renderer, conversation) == {TOOL_CALL_RESERIALIZED}


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_dropped_reasoning_fails_when_a_user_follows_reasoning(tokenizer, fixture_template, data) -> None:
    renderer = ChatRenderer(tokenizer, fixture_template("drops_reasoning"))
    conversation = build_conversation(DataChooser(data))
    turns = conversation.turns
    assume(
        any(
            "reasoning_content" in turn.assistant
            and any(m["role"] == "user" for later in turns[i:] for m in later.new_messages)
            for i, turn in enumerate(turns)
        )
    )
    assert kinds(renderer, conversation) == {REASONING_DROPPED}


@pytest.mark.parametrize(
    ("family", "template"),
    [("deepseek-r1", "deepseek"), ("glm-4.6", "glm4"), ("gpt-oss", "harmony"), ("llama3.1", "llama3")],
)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_fixed_family_templates_hold_on_any_conversation(family, template, data) -> None:
    """The session parses what each family emits (GLM XML, harmony, Llama 3 JSON, DeepSeek calls)
    into fields its fixed template renders back byte for byte, on arbitrary text."""
    from tests.templates.real import real_tokenizer

    renderer = ChatRenderer(real_tokenizer(family), fixed_template(template))
    conversation = build_conversation(DataChooser(data))
    mismatches = check_conversation(renderer, conversation).mismatches
    assert [(m.kind, m.evidence) for m in mismatches] == []
