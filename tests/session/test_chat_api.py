"""Chat-completions validation (errors name the field) and reply shapes (no routing data)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.session.chat_api import Reply, RequestError, parse_chat_request
from rl360_ext.templates.parse import ParsedAssistant

USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "body"),
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        (
            {"messages": [USER, {"role": "assistant", "tool_calls": [{"function": {}}]}]},
            "tool_calls[0].function.name",
        ),
        ({"messages": [USER], "n": 2}, "n"),
        ({"messages": [USER], "temperature": 3}, "temperature"),
        ({"messages": [USER], "top_p": 0}, "top_p"),
        ({"messages": [USER], "max_tokens": 0}, "max_tokens"),
        ({"messages": [USER], "stop": [1]}, "stop"),
        ({"messages": [USER], "stream": "yes"}, "stream"),
        ({"messages": [USER], "tools": [{"type": "function"}]}, "tools[0].function.name"),
        ({"messages": [USER], "tool_choice": "always"}, "tool_choice"),
        ({"messages": [USER], "logit_bias": {"x": 1}}, "logit_bias"),
        ({"messages": [USER], "logit_bias": {"2": 101}}, "logit_bias"),
    ],
)
def test_bad_requests_are_400_naming_the_field(body, field) -> None:
    with pytest.raises(RequestError) as err:
        parse_chat_request(body)
    assert err.value.status == 400 and field in err.value.message


def test_sampling_parameters_map_to_sglang_names() -> None:
    request = parse_chat_request(
        {
            "messages": [USER],
            "max_completion_tokens": 9,
            "temperature": 0,
            "top_p": 0.9,
            "seed": 4,
            "stop": "X",
            "logit_bias": {"2": 5},
        }
    )
    assert request.sampling_params() == {
        "max_new_tokens": 9,
        "temperature": 0.0,
        "top_p": 0.9,
        "sampling_seed": 4,
        "stop": ["X"],
        "logit_bias": {"2": 5.0},
    }
    assert parse_chat_request({"messages": [USER], "n": 1}).sampling_params() == {}


def test_replies_carry_tool_calls_reasoning_usage_and_no_routing() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    reply = Reply("c1", "m", ParsedAssistant("", "because", [call]), "stop", 10, 3, 4)
    completion = reply.completion()
    choice = completion["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant",
        "content": None,
        "reasoning_content": "because",
        "tool_calls": [call],
    }
    assert completion["usage"]["total_tokens"] == 13
    assert completion["usage"]["prompt_tokens_details"]["cached_tokens"] == 4
    chunk = reply.chunk()
    assert (
        chunk["object"] == "chat.completion.chunk"
        and chunk["choices"][0]["delta"]["tool_calls"][0]["index"] == 0
    )
    assert "routed_experts" not in str(completion) and "routed_experts" not in str(chunk)
    assert Reply("c2", "m", ParsedAssistant("cut"), "length", 1, 1, 0).openai_finish_reason == "length"


# Messages valid and invalid in every way `_check_messages` checks.
_CONTENTS = st.sampled_from(["hi", "", None, 3, [{"type": "text", "text": "x"}], [{"text": "x"}], [1]])
_CALLS = st.sampled_from(
    [None, [], "x", [{"function": {"name": "f", "arguments": "{}"}}], [{"function": {"name": 1}}], [3]]
)
_MESSAGES = st.one_of(
    st.builds(
        lambda role, content: {"role": role, "content": content},
        st.sampled_from(["system", "user", "tool", "wizard"]),
        _CONTENTS,
    ),
    st.builds(
        lambda content, calls: {"role": "assistant", "content": content, "tool_calls": calls},
        _CONTENTS,
        _CALLS,
    ),
    st.just("not a message"),
)
_VALID = st.one_of(
    st.builds(
        lambda role, text: {"role": role, "content": text},
        st.sampled_from(["system", "user", "tool"]),
        st.text(max_size=3),
    ),
    st.builds(lambda text: {"role": "assistant", "content": text}, st.text(max_size=3)),
)


def _outcome(body: Any, held: Any = ()) -> Any:
    try:
        return parse_chat_request(body, held)
    except RequestError as exc:
        return (exc.param, str(exc))


@settings(max_examples=300, deadline=None)
@given(held=st.lists(_VALID, max_size=6), tail=st.lists(_MESSAGES, max_size=4), edits=st.data())
def test_skipping_held_messages_answers_as_checking_them_all(held, tail, edits) -> None:
    """A request validated against the session's held (valid) messages gets the answer, and the
    first error, of checking every message: echoed, changed or invalid ones at any index."""
    messages: list[Any] = [*held, *tail]
    for i in edits.draw(st.lists(st.integers(0, max(len(messages) - 1, 0)), max_size=3)):
        if messages:
            messages[i] = edits.draw(_MESSAGES)  # an old message changed (valid or not)
    body = {"messages": messages}
    assert _outcome(body, held) == _outcome(body)
