"""The chat route's ASGI fast path answers exactly as FastAPI's route does, and only for that route."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from hypothesis import given
from hypothesis import strategies as st

from rl360_ext.session.app import ChatFastPath, chat_session_id, create_app
from rl360_ext.session.core import SessionCore

from .conftest import Step

USER = {"role": "user", "content": "Run the tests and fix the bug."}
CHAT_PATH = "/sessions/{session_id}/v1/chat/completions"


def _chat_route(app: FastAPI) -> APIRoute:
    (route,) = [r for r in app.routes if isinstance(r, APIRoute) and r.path == CHAT_PATH]
    return route


def _without_fast_path(app: FastAPI) -> FastAPI:
    app.user_middleware = [m for m in app.user_middleware if m.cls is not ChatFastPath]
    return app


segment = st.sampled_from(["", "sessions", "v1", "chat", "completions", "abc", "a.b-c", "%20", "x y"])


@given(st.lists(segment, min_size=0, max_size=7))
def test_the_fast_path_takes_exactly_the_paths_the_route_matches(parts: list[str]) -> None:
    path = "/" + "/".join(parts)
    match = _chat_route(create_app(_UNUSED_CORE)).path_regex.match(path)
    assert chat_session_id(path) == (match["session_id"] if match else None)


class _Unused:
    """A core the route-matching test never calls."""


_UNUSED_CORE: Any = _Unused()


async def _exchange(app: FastAPI, core: SessionCore, headers: dict[str, str] | None = None) -> list[Any]:
    sid = core.create().id
    url = f"/sessions/{sid}/v1/chat/completions"
    answers = []
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://session", headers=headers) as http:
        for request in (
            http.post(url, json={"messages": [USER], "max_tokens": 8}),
            http.post(url, content=b"{not json", headers={"content-type": "application/json"}),
            http.post(url, json={"messages": "nope"}),
            http.post("/sessions/nobody/v1/chat/completions", json={"messages": [USER]}),
            http.post(url, json={"messages": [USER], "stream": True}),
            http.get(url),
            http.post(url + "/", json={"messages": [USER]}),
        ):
            response = await request
            body: Any = response.text
            if response.headers.get("content-type") == "application/json":
                body = response.json()
                if isinstance(body, dict):
                    body.pop("id", None)
                    body.pop("created", None)
            elif response.headers.get("content-type", "").startswith("text/event-stream"):
                body = len(response.text.split("data: "))
            answers.append((response.status_code, response.headers.get("content-type"), body))
    return answers


@pytest.mark.parametrize("api_key", [None, "s3cret"])
async def test_every_answer_is_the_routes_answer(make_core, api_key: str | None) -> None:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    answers = []
    for strip in (False, True):
        core, backend = make_core()
        backend.push(Step(), Step())
        app = create_app(core, api_key=api_key)
        answers.append(await _exchange(_without_fast_path(app) if strip else app, core, headers))
    fast, routed = answers
    assert fast == routed
    assert [status for status, _, _ in fast] == [200, 400, 400, 404, 200, 405, 307]


async def test_the_bearer_token_still_guards_the_fast_path(make_core) -> None:
    core, backend = make_core()
    sid = core.create().id
    transport = httpx.ASGITransport(app=create_app(core, api_key="s3cret"))
    async with httpx.AsyncClient(transport=transport, base_url="http://session") as http:
        refused = await http.post(f"/sessions/{sid}/v1/chat/completions", json={"messages": [USER]})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
    assert backend.calls == []
