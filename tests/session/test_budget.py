"""A turn's work is bounded before it starts: new text past context x chars-per-token is refused
untokenized, naming the message; a prompt over the context is refused unsent; a large append is
planned on a worker thread, a small one on the event loop."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from rl360_ext.session import core as core_module
from rl360_ext.session.chat_api import parse_chat_request
from rl360_ext.session.config import SessionCoreConfig
from rl360_ext.session.errors import RequestError
from rl360_ext.session.options import SessionServerConfig
from rl360_ext.session.service import chars_per_token

SYSTEM = {"role": "system", "content": "s" * 10}


def _user(chars: int) -> dict[str, Any]:
    return {"role": "user", "content": "word " * (chars // 5)}


def test_new_text_past_the_budget_is_refused_naming_the_message() -> None:
    body = {"messages": [SYSTEM, _user(100), _user(100)]}
    assert parse_chat_request(body, max_chars=210).new_chars == 210
    with pytest.raises(RequestError) as caught:
        parse_chat_request(body, max_chars=209)
    assert caught.value.param == "messages[2]" and "before it is tokenized" in caught.value.message


def test_held_messages_are_not_counted_and_tools_count_on_a_first_prompt() -> None:
    held = [SYSTEM, _user(100)]
    body = {"messages": [*held, _user(50)]}
    assert parse_chat_request(body, held, max_chars=50).new_chars == 50
    tools = [{"type": "function", "function": {"name": "run", "description": "d" * 100}}]
    with pytest.raises(RequestError) as caught:
        parse_chat_request({"messages": [SYSTEM], "tools": tools}, max_chars=100)
    assert caught.value.param == "tools"


def test_the_default_bound_is_the_longest_token(renderer) -> None:
    tokenizer = renderer.tokenizer
    options = SessionServerConfig("http://engine", "dir")
    longest = max(len(token) for token in tokenizer.get_vocab())
    assert chars_per_token(tokenizer, options) == longest
    text = "the quick brown fox " * 200  # no token covers more characters than the longest
    assert len(renderer.encode(text)) >= len(text) / longest
    assert SessionCoreConfig(max_context_tokens=100, max_chars_per_token=7).max_text_chars == 700
    assert SessionCoreConfig(max_chars_per_token=7).max_text_chars is None


async def test_over_the_budget_or_the_context_nothing_reaches_the_engine(make_core) -> None:
    core, backend = make_core(r3=False, max_context_tokens=64, max_chars_per_token=4)
    session = core.create()
    with pytest.raises(RequestError) as caught:
        await core.chat(session.id, {"messages": [_user(300)]})  # 300 > 64 x 4 characters
    assert caught.value.param == "messages[0]"
    with pytest.raises(RequestError) as caught:
        await core.chat(session.id, {"messages": [_user(250)]})  # fits the budget, not the context
    assert caught.value.param == "messages" and "over the engine's context of 64" in caught.value.message
    assert backend.calls == []


async def test_a_large_append_is_planned_off_the_loop_and_a_small_one_on_it(make_core, monkeypatch) -> None:
    core, backend = make_core(r3=False)
    session = core.create()
    planned_on: list[int] = []
    plan = core._plan

    def recording(*args: Any) -> Any:
        planned_on.append(threading.get_ident())
        return plan(*args)

    monkeypatch.setattr(core, "_plan", recording)
    messages = [SYSTEM, _user(20)]
    for _ in range(3):  # a first prompt and a second turn (no longer than its anchor) go to a thread
        reply = await core.chat(session.id, {"messages": messages})
        messages = [*messages, reply.message(), _user(40)]
    assert len(planned_on) == 2 and threading.get_ident() not in planned_on  # the third: on the loop
    messages[-1] = _user(core_module.INLINE_CHARS + 5)
    await core.chat(session.id, {"messages": messages})
    assert len(planned_on) == 3 and planned_on[2] != threading.get_ident()
    assert len(backend.calls) == 4


@pytest.mark.parametrize("context", [900, 2000, 5000])
async def test_a_prompt_over_the_context_is_refused_before_its_ids_are_built(
    make_core, monkeypatch, context
) -> None:
    """Past the context, the encoder's budget refuses (its ids never become Python ints); within it
    the turn is planned as before. The refusal's count is a lower bound of the prompt's length."""
    core, backend = make_core(r3=False, max_context_tokens=context, max_chars_per_token=40)
    built: list[int] = []
    encode = core.tito.renderer._encode

    def counting(text: str, max_tokens: int | None = None) -> list[int]:
        ids = encode(text, max_tokens)
        built.append(len(ids))
        return ids

    monkeypatch.setattr(core.tito.renderer, "_encode", counting)
    first = [SYSTEM, _user(20)]
    outcomes = set()
    for chars in (core_module.INLINE_CHARS + 5, 8000, 30000, 100_000):
        session = core.create()
        reply = await core.chat(session.id, {"messages": first})
        messages = [*first, reply.message(), _user(chars)]
        whole = len(core.tito.renderer.prompt_ids(messages))
        built.clear()
        try:
            await core.chat(session.id, {"messages": messages})
        except RequestError as exc:
            if exc.param != "messages":  # past context x chars-per-token: nothing was even encoded
                assert "before it is tokenized" in exc.message and built == []
                continue
            assert f"over the engine's context of {context}" in exc.message
            assert whole > context and max(built, default=0) <= context + 1
            assert reply.prompt_tokens < int(exc.message.split("at least ")[1].split()[0]) <= whole
            outcomes.add("refused")
        else:
            assert whole <= context
            outcomes.add("planned")
    assert "refused" in outcomes
    built.clear()
    with pytest.raises(RequestError) as caught:
        await core.chat(core.create().id, {"messages": [SYSTEM, _user(context * 30)]})
    assert "at least" in caught.value.message and max(built, default=0) <= context + 1
    assert all(len(call["input_ids"]) <= context for call in backend.calls)
