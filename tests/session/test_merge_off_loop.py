"""A merge (and its drift check, one render of the whole trajectory) does not stall the event loop
that serves every session of the server (the standalone server and each SessionPool actor)."""

from __future__ import annotations

import asyncio
import threading

from .conftest import Step

HELD_S = 5.0  # how long the merge's render waits for the other session's turn before giving up


async def test_the_loop_keeps_serving_while_a_session_merges(make_core, monkeypatch) -> None:
    core, backend = make_core()
    sid = core.create().id
    backend.push(Step("abc<|im_end|>"))
    await core.chat(sid, {"messages": [{"role": "user", "content": "hi"}]})
    drift = core.tito.drift
    released = threading.Event()
    waited: dict[str, bool] = {}

    def held_drift(*args, **kwargs):
        # A long trajectory's render, held until another session's turn is done: on the event loop it
        # would hold that turn back, and the wait would time out.
        waited["released"] = released.wait(HELD_S)
        return drift(*args, **kwargs)

    monkeypatch.setattr(core.tito, "drift", held_drift)
    other = core.create().id
    backend.push(Step("de<|im_end|>"))
    merging = asyncio.create_task(core.merged(sid))
    await asyncio.sleep(0)  # the merge is under way
    await core.chat(other, {"messages": [{"role": "user", "content": "hello"}]})
    released.set()
    sample = await merging
    assert waited == {"released": True}, "another session's turn waited for the merge"
    assert sample.metadata["template_drift"]["checked"] and len(core.get(other).turns) == 1
