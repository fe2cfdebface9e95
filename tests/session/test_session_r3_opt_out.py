"""A session opted out of routing replay (an eval attempt): no routed experts asked, kept or merged."""

from __future__ import annotations

import pytest

from rl360_ext.session.errors import RequestError

from .conftest import Step

USER = {"role": "user", "content": "Run the tests and fix the bug."}


async def test_a_session_without_r3_asks_the_engine_for_no_routing_beside_one_with_it(make_core) -> None:
    core, backend = make_core()
    plain, replayed = core.create(r3=False).id, core.create().id
    backend.push(Step("a<|im_end|>"), Step("b<|im_end|>"))
    await core.chat(plain, {"messages": [USER]})
    await core.chat(replayed, {"messages": [USER]})
    assert [call["return_routed_experts"] for call in backend.calls] == [False, True]
    without, with_r3 = await core.merged(plain), await core.merged(replayed)
    assert without.routed_experts is None and with_r3.routed_experts is not None
    assert (without.metadata["session"]["r3"], with_r3.metadata["session"]["r3"]) == (False, True)


async def test_r3_on_a_server_without_it_or_not_a_bool_is_a_request_error(make_core) -> None:
    core, _ = make_core(r3=False)
    with pytest.raises(RequestError, match="without --r3") as err:
        core.create(r3=True)
    assert err.value.param == "r3"
    assert core.create(r3=False).r3 is False and core.create().r3 is False
    replay_core, _ = make_core()
    with pytest.raises(RequestError, match="r3: must be"):
        replay_core.create(r3="yes")  # type: ignore[arg-type]
