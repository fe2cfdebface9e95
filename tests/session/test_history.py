"""History append check: what counts as the same message, and where a history departs."""

from __future__ import annotations

from rl360_ext.session.history import comparable, find_mismatch

USER = {"role": "user", "content": "fix it"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
ASSISTANT = {"role": "assistant", "content": None, "reasoning_content": "hmm", "tool_calls": [CALL]}


def test_an_append_is_not_a_mismatch() -> None:
    assert find_mismatch([USER, ASSISTANT], [USER, ASSISTANT, {"role": "tool", "content": "a"}]) is None


def test_clients_may_drop_reasoning_rewrite_ids_and_reformat_arguments() -> None:
    echoed = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "other", "function": {"name": "bash", "arguments": '{ "command":"ls" }'}}],
    }
    assert comparable(echoed) == comparable(ASSISTANT)
    parts = {"role": "user", "content": [{"type": "text", "text": "fix "}, {"type": "text", "text": "it"}]}
    assert comparable(parts) == comparable(USER)


def test_the_first_differing_message_is_named() -> None:
    edited = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{**CALL, "function": {"name": "cat", "arguments": "{}"}}],
    }
    mismatch = find_mismatch([USER, ASSISTANT], [USER, edited, {"role": "user", "content": "x"}])
    assert mismatch is not None and mismatch.index == 1
    assert "messages[1]" in mismatch.reason and "cat" in mismatch.reason


def test_retries_shortened_histories_and_changed_tools_are_mismatches() -> None:
    shortened = find_mismatch([USER, ASSISTANT], [USER])
    assert shortened is not None and shortened.index == 1 and "not an append" in shortened.reason
    repeated = find_mismatch([USER, ASSISTANT], [USER, ASSISTANT])
    assert repeated is not None and "no new message" in repeated.reason
    tools = find_mismatch([USER], [USER, USER], held_tools=[{"function": {"name": "a"}}], incoming_tools=None)
    assert tools is not None and tools.index is None
