"""A session lost in a server restart reaches the generate hook as infra, never as a reward."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from rl360_ext.outcomes.causes import Cause
from rl360_ext.rollout import generate
from rl360_ext.session.options import SessionServerConfig
from rl360_ext.session.pool import SessionPool, SessionServerActor


class _RestartedPool:
    """The pool side of one actor whose server process is new (the session was made by the old one)."""

    def __init__(self, actor: SessionServerActor) -> None:
        self.actor = actor

    async def acollect(self, session_ids: list[str]) -> list[Any]:
        encoded = await self.actor.collect(list(session_ids))
        return SessionPool._decode(session_ids, {0: list(session_ids)}, [encoded])


async def test_a_session_lost_in_a_restart_is_an_infra_attempt_even_with_a_verifier_reward(make_core) -> None:
    before, _ = make_core()
    after, _ = make_core()
    session_id = before.create().id
    actor = SessionServerActor(SessionServerConfig(backend_url="u", tokenizer_dir="t"), None, 0)
    actor.core = after
    handle = SimpleNamespace(pool=_RestartedPool(actor))
    merged, problem = await generate._collect(handle, session_id)  # type: ignore[arg-type]
    assert merged is None and "SessionLostError" in problem and "restarted" in problem
    graded = {"reward": 0.0, "reward_source": "verifier", "failure_cause": None, "attempt_class": "valid"}
    attempt = generate.classify(graded, Cause.SESSION_VANISHED if problem else None, "score")
    assert attempt == "infra:session_vanished"
