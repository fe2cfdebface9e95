"""The incremental suffix: new messages rendered after a short anchor equal the full-render suffix.

`ChatRenderer.suffix_text` renders only the new messages (after `ChatRenderer.anchor`) for templates
the probe accepts, and the whole history twice for the rest. These tests hold it to the full render
(`full_suffix_text`) wherever that is defined, on every template the project ships or checks, on
conversations drawn by hypothesis; check which templates the probe refuses; and prove the cost:
the messages rendered per suffix do not grow with the history.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.reference.engine.tokenizer import load_tiny_tokenizer
from rl360_ext.templates.conversations import build_conversation
from rl360_ext.templates.render import (
    ANCHOR_USER,
    ChatRenderer,
    TemplateNotAppendOnlyError,
    probe_splits,
)
from tests.templates.real import FAMILIES, real_tokenizer
from tests.templates.test_properties import DataChooser
from tests.templates.test_real_templates import KWARGS

DATA = Path(__file__).parents[2] / "rl360_ext" / "templates" / "data"
FIXTURES = Path(__file__).parent / "fixtures"
SHIPPED = sorted(p.stem for p in DATA.glob("*.jinja"))
TEST_TEMPLATES = sorted(p.stem for p in FIXTURES.glob("*.jinja"))
TEMPLATES = (
    [f"data:{n}" for n in SHIPPED]
    + [f"fixture:{n}" for n in TEST_TEMPLATES]
    + [f"real:{n}" for n in sorted(FAMILIES)]
)
# What the probe decides (see docs/templates.md): True renders suffixes incrementally.
INCREMENTAL = {
    **{f"data:{n}": True for n in SHIPPED},
    "fixture:drops_reasoning": False,  # not append-only: keeps the full render, so the session forks
    "fixture:loop_last_open_turn": True,
    "fixture:newline_after_end": True,
    "fixture:numbered_users": False,  # numbers each user message: the anchor changes the number
    "fixture:qwen25_like": True,
    "fixture:qwen3_like": False,
    "fixture:reserializes_arguments": True,
    "real:deepseek-r1": False,  # `<｜tool▁outputs▁begin｜>` only before the conversation's first tool output
    "real:deepseek-v3.1": True,
    "real:gemma-4": False,
    "real:glm-4.6": False,
    "real:gpt-oss": False,
    "real:kimi-k2": True,
    "real:llama3.1": True,
    "real:mistral-nemo": False,
    "real:qwen2.5": True,
    "real:qwen3": False,
    "real:qwen3-miles-fixed": False,
}


@cache
def renderer_for(name: str) -> ChatRenderer:
    kind, _, stem = name.partition(":")
    if kind == "real":
        return ChatRenderer(real_tokenizer(stem), template_kwargs=KWARGS.get(stem))
    folder = DATA if kind == "data" else FIXTURES
    return ChatRenderer(load_tiny_tokenizer(), (folder / f"{stem}.jinja").read_text())


def test_every_template_has_a_decision() -> None:
    assert sorted(INCREMENTAL) == sorted(TEMPLATES)


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_probe_decides_which_templates_render_incrementally(name: str) -> None:
    assert renderer_for(name).incremental is INCREMENTAL[name]


@pytest.mark.parametrize("name", TEMPLATES)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_suffix_equals_the_full_render_suffix_wherever_that_is_defined(name: str, data) -> None:
    renderer = renderer_for(name)
    conversation = build_conversation(DataChooser(data))
    for history, new_messages, tools in probe_splits([conversation]):
        try:
            expected = renderer.full_suffix_text(history, new_messages, tools)
        except TemplateNotAppendOnlyError:
            with pytest.raises(TemplateNotAppendOnlyError):
                renderer.suffix_text(history, new_messages, tools)
            continue
        except Exception:  # the template refuses this conversation: the server answers 400
            continue
        assert renderer.suffix_text(history, new_messages, tools) == expected
        assert renderer.suffix_ids(history, new_messages, tools) == renderer.encode(expected)


@pytest.mark.parametrize("name", [n for n in TEMPLATES if INCREMENTAL[n]])
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_the_anchor_alone_gives_the_full_suffix_on_accepted_templates(name: str, data) -> None:
    """No fallback hides a difference: where an anchor renders, it is the suffix."""
    renderer = renderer_for(name)
    for history, new_messages, tools in probe_splits([build_conversation(DataChooser(data))]):
        try:
            expected = renderer.full_suffix_text(history, new_messages, tools)
        except Exception:
            continue
        anchored = renderer.anchored_suffix_text(history, new_messages, tools)
        assert anchored is None or anchored == expected


def test_a_prefix_dependent_template_pinned_incremental_mis_renders() -> None:
    """Why the probe exists: the anchor numbers the new user message 2, the history says 3."""
    template = (FIXTURES / "numbered_users.jinja").read_text()
    pinned = ChatRenderer(load_tiny_tokenizer(), template, incremental=True)
    history = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
    ]
    new = [{"role": "user", "content": "e"}]
    assert "[3] e" in pinned.full_suffix_text(history, new)
    assert "[2] e" in pinned.suffix_text(history, new)
    assert "[3] e" in ChatRenderer(load_tiny_tokenizer(), template).suffix_text(history, new)


class CountingTokenizer:
    """The tiny tokenizer, recording how many messages each render was given."""

    def __init__(self) -> None:
        self.inner = load_tiny_tokenizer()
        self.rendered: list[int] = []
        self.chat_template = self.inner.chat_template

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        self.rendered.append(len(messages))
        return self.inner.apply_chat_template(messages, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("turns", [2, 20, 200])
def test_a_suffix_renders_the_anchor_and_the_new_messages_only(turns: int) -> None:
    tokenizer = CountingTokenizer()
    renderer = ChatRenderer(tokenizer, (DATA / "reference.jinja").read_text())
    assert renderer.incremental
    history: list[dict[str, Any]] = [{"role": "system", "content": "s"}]
    for k in range(turns):
        history += [{"role": "user", "content": f"u{k}"}, {"role": "assistant", "content": f"a{k}"}]
    new = [{"role": "user", "content": "next"}]
    tokenizer.rendered.clear()
    text = renderer.suffix_text(history, new)
    assert text == renderer.full_suffix_text(history, new)
    assert tokenizer.rendered[:2] == [3, 4]  # [system, ANCHOR_USER, last assistant] (+ the new one)


def test_anchor_shape() -> None:
    system = {"role": "system", "content": "s"}
    user = {"role": "user", "content": "u"}
    reply = {"role": "assistant", "content": "a"}
    history = [system, user, reply, user, reply]
    assert ChatRenderer.anchor(history) == [system, ANCHOR_USER, reply]
    assert ChatRenderer.anchor(history[1:]) == [ANCHOR_USER, reply]
    assert ChatRenderer.anchor([system, user, reply]) is None  # no shorter than its anchor
    assert ChatRenderer.anchor([*history, user]) is None  # does not end with an assistant message


def test_a_turn_whose_anchor_does_not_render_falls_back_to_the_full_render() -> None:
    """A template that refuses the anchor (here: a fixed first user message) renders it all."""
    template = (
        "{%- for m in messages -%}{%- if m.role == 'user' and m.content == 'rl360 anchor' -%}"
        "{{ raise_exception('no anchors') }}{%- endif -%}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "<|im_end|>{%- endfor -%}{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
    )
    pinned = ChatRenderer(load_tiny_tokenizer(), template, incremental=True)
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}] * 2
    new = [{"role": "user", "content": "c"}]
    assert pinned.anchored_suffix_text(history, new) is None
    assert pinned.suffix_text(history, new) == pinned.full_suffix_text(history, new)
