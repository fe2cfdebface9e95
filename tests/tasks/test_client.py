"""The audit's /run client: an answer, a refusal about the task (lint), or no answer (infra)."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from rl360_ext.tasks import client as client_module
from rl360_ext.tasks.audit import RunFailed, TaskRejected
from rl360_ext.tasks.client import HarborClient


def harbor(
    monkeypatch: pytest.MonkeyPatch, handler: Callable[[httpx.Request], httpx.Response]
) -> HarborClient:
    real = httpx.AsyncClient
    monkeypatch.setattr(
        client_module.httpx, "AsyncClient", lambda **kw: real(transport=httpx.MockTransport(handler), **kw)
    )
    return HarborClient("http://harbor:8765/", token="secret")


async def test_an_answer_is_returned_with_the_request_it_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"attempt_class": "valid", "reward": 1.0})

    run = harbor(monkeypatch, handler)
    answer = await run("quiz-01", "rl360-canary-reward-file", {"reward": 1.0}, 90.0)
    assert answer == {"attempt_class": "valid", "reward": 1.0}
    body = json.loads(seen[0].content)
    assert body == {
        "task": "quiz-01",
        "agent": "rl360-canary-reward-file",
        "deadline_s": 90.0,
        "agent_kwargs": {"reward": 1.0},
    }
    assert seen[0].headers["authorization"] == "Bearer secret"
    await run("quiz-01", "oracle", {}, 90.0)
    assert "agent_kwargs" not in json.loads(seen[-1].content)


async def test_a_refused_task_is_task_rejected_with_the_servers_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    detail = {
        "detail": [{"loc": ["body", "task"], "msg": "cannot load: timeout_sec", "type": "task_invalid"}]
    }
    run = harbor(monkeypatch, lambda request: httpx.Response(422, json=detail))
    with pytest.raises(TaskRejected) as refused:
        await run("bad", "nop", {}, 90.0)
    assert (refused.value.status, refused.value.kind, refused.value.message) == (
        422,
        "task_invalid",
        "cannot load: timeout_sec",
    )


@pytest.mark.parametrize(
    "respond",
    [
        lambda request: httpx.Response(500, text="boom"),
        lambda request: httpx.Response(200, text="not json"),
        lambda request: httpx.Response(401, json={"detail": "unauthorized"}),
    ],
)
async def test_no_usable_answer_is_run_failed(
    monkeypatch: pytest.MonkeyPatch, respond: Callable[[httpx.Request], httpx.Response]
) -> None:
    with pytest.raises(RunFailed):
        await harbor(monkeypatch, respond)("t", "nop", {}, 90.0)


async def test_a_connection_failure_is_run_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    run = harbor(monkeypatch, refuse)
    with pytest.raises(RunFailed, match="ConnectError"):
        await run("t", "nop", {}, 90.0)
    with pytest.raises(RunFailed, match="/health"):
        await run.agents()


async def test_the_agents_are_the_servers_list(monkeypatch: pytest.MonkeyPatch) -> None:
    run = harbor(monkeypatch, lambda request: httpx.Response(200, json={"agents": ["nop", "oracle"]}))
    assert await run.agents() == ["nop", "oracle"]
