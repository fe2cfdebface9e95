"""Turns whose suffix renders after an anchor: planned on the event loop, same tokens as the full render."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from rl360_ext.session import core as session_core
from rl360_ext.session.core import SessionCore, SessionCoreConfig
from rl360_ext.session.tito import TitoRenderer
from rl360_ext.templates.render import ChatRenderer

from .conftest import ScriptedBackend, Step

SYSTEM = {"role": "system", "content": "You fix bugs."}
USER = {"role": "user", "content": "Run the tests."}


async def _conversation(
    renderer: ChatRenderer, monkeypatch: pytest.MonkeyPatch, turns: int
) -> tuple[Any, int]:
    """(merged sample, worker-thread plans) of a `turns`-turn conversation."""
    planned: list[object] = []

    class Counting(ThreadPoolExecutor):
        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            planned.append(fn)
            return super().submit(fn, *args, **kwargs)

    monkeypatch.setattr(session_core, "_BACKGROUND", Counting(max_workers=1))
    backend = ScriptedBackend(renderer)
    core = SessionCore(TitoRenderer(renderer), backend, SessionCoreConfig())
    backend.push(*(Step(f"reply {k}<|im_end|>") for k in range(turns)))
    sid = core.create().id
    messages = [SYSTEM, USER]
    for k in range(turns):
        reply = await core.chat(sid, {"messages": messages})
        messages = [*messages, reply.message(), {"role": "user", "content": f"again {k}"}]
    return await core.merged(sid), len(planned)


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
