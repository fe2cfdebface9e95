"""A merge (and its drift check, one render of the whole trajectory) does not stall the event loop
that serves every session of the server (the standalone server and each SessionPool actor)."""

from __future__ import annotations

import asyncio
import time

from .conftest import Step

SLOW_RENDER_S = 0.4


async def test_the_loop_keeps_serving_while_a_session_merges(make_core, monkeypatch) -> None:
    core, backend = make_core()
    sid = core.create().id
    backend.push(Step("abc<|im_end|>"))
    await core.chat(sid, {"messages": [{"role": "user", "content": "hi"}]})
    drift = core.tito.drift

    def slow_drift(*args, **kwargs):
        time.sleep(SLOW_RENDER_S)  # a long trajectory's render: CPU time the loop must not wait for
        return drift(*args, **kwargs)

    monkeypatch.setattr(core.tito, "drift", slow_drift)
    other = core.create().id
    backend.push(Step("de<|im_end|>"))
    started = time.monotonic()
    merging = asyncio.create_task(core.merged(sid))
    await asyncio.sleep(0)  # the merge is under way
    await core.chat(other, {"messages": [{"role": "user", "content": "hello"}]})
    turn_s = time.monotonic() - started
    sample = await merging
    assert turn_s < SLOW_RENDER_S / 2, f"another session's turn waited {turn_s:.3f} s for the merge"
    assert sample.metadata["template_drift"]["checked"] and len(core.get(other).turns) == 1
