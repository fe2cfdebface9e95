"""Rendering facts and parsing: generated text parses into fields that re-render byte for byte."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.templates.parse import parse_assistant
from rl360_ext.templates.render import ChatRenderer, TemplateNotAppendOnlyError
from rl360_ext.templates.select import fixed_template
from tests.templates.texts import has_special_token

USER = [{"role": "user", "content": "fix the bug"}]
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
QWEN3_OUTPUT = (
    '<think>\nThe test fails.\n</think>\n\nRunning it.\n<tool_call>\n{"name": "bash", "arguments": '
    '{"command": "pytest -q"}}\n</tool_call>\n<tool_call>\n{"name": "bash", "arguments": {"command":"ls"}}\n'
    "</tool_call>"
)


def generated_text(renderer: ChatRenderer, message: dict) -> str:
    """What the model emits for `message`: its render after the generation prompt, end token removed."""
    prompt = renderer.render_text(USER, TOOLS, add_generation_prompt=True)
    full = renderer.render_text([*USER, message], TOOLS)
    assert full.startswith(prompt) and full.endswith("<|im_end|>")
    return full[len(prompt) : -len("<|im_end|>")]


def test_tool_call_separator_is_read_off_the_template(tokenizer) -> None:
    assert ChatRenderer(tokenizer).tool_call_separator == ""
    assert ChatRenderer(tokenizer, fixed_template("qwen3")).tool_call_separator == "\n"


def test_assistant_closing(tokenizer, fixture_template) -> None:
    assert ChatRenderer(tokenizer).assistant_closing() == "<|im_end|>"
    assert (
        ChatRenderer(tokenizer, fixture_template("newline_after_end")).assistant_closing() == "<|im_end|>\n"
    )
    assert ChatRenderer(tokenizer, fixture_template("qwen25_like")).assistant_closing() == "<|im_end|>\n"


def test_template_kwargs_reach_the_template(tokenizer) -> None:
    renderer = ChatRenderer(tokenizer, fixed_template("qwen3"), {"enable_thinking": False})
    assert renderer.render_text(USER, add_generation_prompt=True).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_named_templates_resolve_to_the_default(tokenizer) -> None:
    class Named:
        def __init__(self) -> None:
            self.chat_template = {"default": "{{ messages[0].content }}", "tool_use": "unused"}

        def __getattr__(self, name):
            return getattr(tokenizer, name)

    assert ChatRenderer(Named()).chat_template == "{{ messages[0].content }}"


def test_no_template_is_an_error(tokenizer) -> None:
    class Bare:
        chat_template = None

    with pytest.raises(ValueError, match="no chat_template"):
        ChatRenderer(Bare())


def test_suffix_refused_when_history_render_changes(tokenizer, fixture_template) -> None:
    renderer = ChatRenderer(tokenizer, fixture_template("drops_reasoning"))
    history = [*USER, {"role": "assistant", "content": "ok", "reasoning_content": "think"}]
    with pytest.raises(TemplateNotAppendOnlyError, match="not append-only"):
        renderer.suffix_ids(history, [{"role": "user", "content": "next"}])


def test_real_qwen3_output_round_trips_through_the_fixed_template(tokenizer) -> None:
    renderer = ChatRenderer(tokenizer, fixed_template("qwen3"))
    parsed = renderer.parse_assistant(QWEN3_OUTPUT)
    assert parsed.reasoning == "\nThe test fails.\n"
    assert parsed.content == "\n\nRunning it."
    assert [c["function"]["arguments"] for c in parsed.tool_calls] == [
        '{"command": "pytest -q"}',
        '{"command":"ls"}',
    ]
    assert generated_text(renderer, parsed.to_message()) == QWEN3_OUTPUT


def test_empty_content_tool_call_after_reasoning_round_trips(tokenizer) -> None:
    renderer = ChatRenderer(tokenizer, fixed_template("qwen3"))
    text = '<think>\nok\n</think>\n\n<tool_call>\n{"name": "bash", "arguments": {}}\n</tool_call>'
    assert generated_text(renderer, renderer.parse_assistant(text).to_message()) == text


def test_invalid_tool_call_stays_in_content() -> None:
    parsed = parse_assistant('before<tool_call>{"name": "bash", "arguments": {oops}</tool_call>after')
    assert parsed.tool_calls == []
    assert parsed.content == 'before<tool_call>{"name": "bash", "arguments": {oops}</tool_call>after'


def test_to_message_matches_openai_shapes() -> None:
    parsed = parse_assistant('<tool_call>{"name": "f", "arguments": {}}</tool_call>')
    message = parsed.to_message()
    assert message["content"] is None and message["tool_calls"][0]["function"] == {
        "name": "f",
        "arguments": "{}",
    }
    assert "reasoning_content" not in message
    assert parse_assistant("<think>r</think>hi").to_message() == {
        "role": "assistant",
        "content": "hi",
        "reasoning_content": "r",
    }


SAFE_TEXT = st.text(max_size=24).filter(lambda t: not has_special_token(t))
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
ARGUMENTS = st.builds(
    lambda value, compact, ascii_only: json.dumps(
        value, separators=(",", ":") if compact else None, ensure_ascii=ascii_only
    ),
    st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=3),
    st.booleans(),
    st.booleans(),
)
CALL = st.builds(
    lambda name, arguments: {
        "id": "c",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    },
    st.sampled_from(["bash", "read_file", "x-y_z"]),
    ARGUMENTS,
)
ASSISTANT = st.builds(
    lambda content, reasoning, calls: {
        "role": "assistant",
        "content": content,
        **({"reasoning_content": reasoning} if reasoning is not None else {}),
        **({"tool_calls": calls} if calls else {}),
    },
    SAFE_TEXT,
    st.none() | SAFE_TEXT,
    st.lists(CALL, max_size=3),
)


@pytest.mark.parametrize("template", ["reference", "qwen3"])
@settings(max_examples=80, deadline=None)
@given(message=ASSISTANT)
def test_parse_then_render_reproduces_generated_text(tokenizer, template, message) -> None:
    renderer = ChatRenderer(tokenizer, fixed_template(template))
    text = generated_text(renderer, message)
    parsed = renderer.parse_assistant(text)
    assert [c["function"]["name"] for c in parsed.tool_calls] == [
        c["function"]["name"] for c in message.get("tool_calls", [])
    ]
    assert generated_text(renderer, parsed.to_message()) == text


def test_family_tool_call_formats_parse_into_openai_fields() -> None:
    from rl360_ext.templates.parse import parse_assistant

    glm = parse_assistant(
        "\n<think>plan</think>\nok\n<tool_call>bash\n<arg_key>command</arg_key>\n"
        "<arg_value>ls -la</arg_value>\n"
        "<arg_key>n</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
        "\n",
        "glm-xml",
        "\n<think>",
        separator_always=True,
    )
    assert (glm.reasoning, glm.content) == ("plan", "\nok")
    assert glm.tool_calls[0]["function"] == {"name": "bash", "arguments": '{"command": "ls -la", "n": 2}'}
    harmony = parse_assistant(
        "<|channel|>analysis<|message|>think<|end|><|start|>assistant to=functions.bash"
        '<|channel|>commentary json<|message|>{"command": "ls"}',
        tool_format="harmony",
    )
    assert harmony.reasoning == "think" and harmony.content == ""
    assert harmony.tool_calls[0]["function"] == {"name": "bash", "arguments": '{"command": "ls"}'}
    llama = parse_assistant('{"name": "bash", "parameters": {"command": "ls"}}', tool_format="llama3-json")
    assert llama.tool_calls[0]["function"]["arguments"] == '{"command": "ls"}'
    assert parse_assistant("just text", tool_format="llama3-json").content == "just text"
    deepseek = parse_assistant(
        "reasoning</think>hi<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>bash<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        tool_format="deepseek",
    )
    assert (deepseek.reasoning, deepseek.content) == ("reasoning", "hi")
    assert deepseek.tool_calls[0]["function"] == {"name": "bash", "arguments": "{}"}


def test_qwen3_think_layout_is_not_content() -> None:
    """Qwen3's `</think>\\n\\n` is layout: an empty block before a tool call leaves the content empty."""
    from rl360_ext.templates.parse import parse_assistant

    parsed = parse_assistant(
        '<think>\n\n</think>\n\n<tool_call>\n{"name": "bash", "arguments": {}}\n</tool_call>',
        "\n",
        think_close="</think>\n\n",
    )
    assert (parsed.reasoning, parsed.content, len(parsed.tool_calls)) == ("\n\n", "", 1)


def test_think_end_inside_tool_arguments_is_argument_text(tokenizer) -> None:
    renderer = ChatRenderer(tokenizer, fixed_template("qwen3"))
    text = '<tool_call>\n{"name": "bash", "arguments": {"": "</think>"}}\n</tool_call>'
    parsed = renderer.parse_assistant(text)
    assert parsed.reasoning is None
    assert [c["function"]["arguments"] for c in parsed.tool_calls] == ['{"": "</think>"}']
    assert generated_text(renderer, parsed.to_message()) == text
