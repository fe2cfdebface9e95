"""The conversation generator: deterministic per seed, covers what agents send; shrinking stays valid."""

from __future__ import annotations

from rl360_ext.templates.conversations import (
    Conversation,
    Turn,
    generate_conversations,
    is_valid,
    shrink_candidates,
)
from tests.templates.texts import has_special_token


def test_same_seed_same_conversations() -> None:
    assert generate_conversations(50, 3) == generate_conversations(50, 3)
    assert generate_conversations(50, 3) != generate_conversations(50, 4)


def test_covers_what_agents_send() -> None:
    conversations = generate_conversations(200, 0)
    messages = [m for c in conversations for m in c.messages()]
    generated = [t.assistant for c in conversations for t in c.turns]
    contents = [m.get("content") for m in messages]
    texts = [c for c in contents if isinstance(c, str)]
    assert any(c.prompt[0]["role"] == "system" for c in conversations)
    assert any(c.prompt[0]["role"] == "user" for c in conversations)
    assert any(c.tools for c in conversations) and any(not c.tools for c in conversations)
    assert any("reasoning_content" in m for m in generated) and any(
        "reasoning_content" not in m for m in generated
    )
    assert any(len(m.get("tool_calls") or []) > 1 for m in generated)
    assert any(m["role"] == "tool" for m in messages)
    assert any(
        isinstance(a["function"]["arguments"], dict) for m in generated for a in m.get("tool_calls") or []
    )
    assert "" in texts and None in contents and any(isinstance(c, list) for c in contents)
    assert any(t != t.strip() for t in texts if t.strip())  # leading / trailing whitespace
    assert any(any(ord(ch) > 0xFFFF for ch in t) for t in texts)  # astral-plane unicode (emoji)
    assert any(len(c.turns) >= 3 for c in conversations)
    assert any(not c.turns[-1].new_messages for c in conversations)  # ends with the generated turn
    assert all(is_valid(c) for c in conversations)
    assert not any(has_special_token(str(m)) for m in messages)


def test_shrink_candidates_are_smaller_and_valid() -> None:
    conversation = max(generate_conversations(60, 1), key=Conversation.size)
    candidates = list(shrink_candidates(conversation))
    assert candidates
    assert all(is_valid(c) for c in candidates)
    assert all(c.size() <= conversation.size() for c in candidates)
    assert sum(c.size() < conversation.size() for c in candidates) > len(candidates) // 2


def test_dropping_a_tool_call_drops_its_result() -> None:
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": "{}"}} for i in range(2)
    ]
    results = [{"role": "tool", "tool_call_id": f"c{i}", "content": "r"} for i in range(2)]
    conversation = Conversation(
        [{"role": "user", "content": "u"}],
        [Turn({"role": "assistant", "content": "", "tool_calls": calls}, results)],
        [{"type": "function", "function": {"name": "bash"}}],
    )
    fewer = [
        c for c in shrink_candidates(conversation) if len(c.turns[0].assistant.get("tool_calls", [])) == 1
    ]
    assert fewer
    for candidate in fewer:
        kept = candidate.turns[0].assistant["tool_calls"][0]["id"]
        assert [m["tool_call_id"] for m in candidate.turns[0].new_messages] == [kept]


def test_invalid_shapes() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    user = [{"role": "user", "content": "u"}]
    assert not is_valid(
        Conversation(user, [Turn({"role": "assistant", "content": "", "tool_calls": [call]})])
    )
    orphan = Turn(
        {"role": "assistant", "content": "a"}, [{"role": "tool", "tool_call_id": "c", "content": ""}]
    )
    assert not is_valid(Conversation(user, [orphan]))
    assert not is_valid(Conversation([], [Turn({"role": "assistant", "content": "a"})]))
