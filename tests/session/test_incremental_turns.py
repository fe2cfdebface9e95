"""Turns whose suffix renders after an anchor: planned on the event loop, same tokens as the full render."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rl360_ext.session.core import ServerConfig, SessionCore
from rl360_ext.session.tito import TitoRenderer
from rl360_ext.templates.render import ChatRenderer

from .conftest import ScriptedBackend, Step

SYSTEM = {"role": "system", "content": "You fix bugs."}
USER = {"role": "user", "content": "Run the tests."}


async def _conversation(
    renderer: ChatRenderer, monkeypatch: pytest.MonkeyPatch, turns: int
) -> tuple[Any, int]:
    """(merged sample, worker-thread plans) of a `turns`-turn conversation."""
    threaded = 0
    to_thread = asyncio.to_thread

    async def counting(func: Any, /, *args: Any, **kwargs: Any) -> Any:
        nonlocal threaded
        threaded += 1
        return await to_thread(func, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counting)
    backend = ScriptedBackend(renderer)
    core = SessionCore(TitoRenderer(renderer), backend, ServerConfig())
    backend.push(*(Step(f"reply {k}<|im_end|>") for k in range(turns)))
    sid = core.create().id
    messages = [SYSTEM, USER]
    for k in range(turns):
        reply = await core.chat(sid, {"messages": messages})
        messages = [*messages, reply.message(), {"role": "user", "content": f"again {k}"}]
    planned_on_threads = threaded  # the merge below runs on one too
    return await core.merged(sid), planned_on_threads


async def test_appends_are_planned_in_place_with_the_full_renders_tokens(renderer, monkeypatch) -> None:
    incremental = ChatRenderer(renderer.tokenizer)
    assert incremental.incremental
    sample, threaded = await _conversation(incremental, monkeypatch, 6)
    # the first prompt and the second turn (history no longer than its anchor) go to a thread
    assert threaded == 2
    full = ChatRenderer(renderer.tokenizer, incremental=False)
    reference, every_turn = await _conversation(full, monkeypatch, 6)
    assert every_turn == 6
    assert sample.tokens.tolist() == reference.tokens.tolist()
    assert sample.loss_mask.tolist() == reference.loss_mask.tolist()
    assert not sample.metadata["template_drift"]["mismatch"]


async def test_a_history_mismatch_is_still_planned_on_a_thread_and_forks(make_core) -> None:
    core, backend = make_core(r3=False)
    backend.push(Step("a<|im_end|>"), Step("b<|im_end|>"), Step("c<|im_end|>"))
    sid = core.create().id
    first = await core.chat(sid, {"messages": [SYSTEM, USER]})
    second = [SYSTEM, USER, first.message(), {"role": "user", "content": "x"}]
    reply = await core.chat(sid, {"messages": second})
    edited = [SYSTEM, {"role": "user", "content": "edited"}, first.message(), reply.message(), USER]
    await core.chat(sid, {"messages": edited})
    assert [f["message_index"] for f in core.get(sid).forks] == [1]
