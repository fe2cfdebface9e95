"""Ids a SessionPool picks (128 random bits, no process tag): the server it places one on refuses
an id already in use, so even a collision cannot merge two trajectories into one session."""

from __future__ import annotations

import pytest

from rl360_ext.session.errors import RequestError


def test_a_server_refuses_a_pool_id_already_in_use(make_core) -> None:
    core, _ = make_core()
    session_id = "0123456789abcdef0123456789abcdef"
    assert core.create({"task": "a"}, session_id=session_id).id == session_id
    with pytest.raises(RequestError, match="session_id: must be unused") as refused:
        core.create({"task": "b"}, session_id=session_id)
    assert refused.value.status == 400 and core.get(session_id).metadata == {"task": "a"}
