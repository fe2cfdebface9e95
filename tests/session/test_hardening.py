"""The session server under bad input, protocol-breaking engines, retries, restarts and tokens."""

from __future__ import annotations

import ast
import asyncio
import json
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl360_ext.session import errors
from rl360_ext.session.app import create_app
from rl360_ext.session.core import SessionCore
from rl360_ext.session.identity import mint_session_id, minted_by
from rl360_ext.session.options import SessionServerConfig
from rl360_ext.session.schemas import ChatCompletionRequest
from rl360_ext.sglang.client import EngineError, EngineTimeoutError

from .conftest import Step

USER = {"role": "user", "content": "Run the tests and fix the bug."}


def _client(core: SessionCore, **app_options) -> httpx.AsyncClient:
    app = create_app(core, **app_options)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://session")


# ---- the error tree ---------------------------------------------------------------------------


def test_every_error_class_has_its_own_status_and_code() -> None:
    classes = [
        cls
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.SessionServerError)
    ]
    assert len({c.default_code for c in classes}) == len(classes)
    assert errors.RequestError("x").status == 400
    assert errors.SessionLostError("x").status == 410
    busy = errors.EngineHTTPError(429, "{}", "x")
    assert (busy.status, busy.code, busy.headers()) == (429, "engine_busy", {"Retry-After": "1"})
    body = errors.PayloadTooLargeError("body: too big", param="body").to_json()["error"]
    assert body == {"message": "body: too big", "type": "invalid_request_error", "param": "body",
                    "code": "request_too_large"}  # fmt: skip


@pytest.mark.parametrize("module", ["core.py", "app.py", "chat_api.py", "samples/miles_wire.py"])
def test_no_bare_status_codes(module: str) -> None:
    tree = ast.parse((Path(errors.__file__).parent / module).read_text())
    numbers = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and type(n.value) is int]
    assert [n for n in numbers if 400 <= n < 600] == []


# ---- routing keys -----------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["clé", "a\r\nX-Evil: 1", "a\x00b", "has space", "", "k" * 257, 7])
def test_a_routing_key_that_cannot_be_a_header_is_refused_at_create(make_core, key) -> None:
    core, _ = make_core()
    with pytest.raises(errors.RequestError) as err:
        core.create(routing_key=key)
    assert err.value.status == 400 and err.value.param == "routing_key"
    assert core.sessions == {}


async def test_a_non_ascii_routing_key_over_http_is_a_400_not_a_500(make_core) -> None:
    core, _ = make_core()
    async with _client(core) as http:
        response = await http.post("/sessions", json={"routing_key": "ключ"})
        assert response.status_code == 400 and response.json()["param"] == "routing_key"
        ok = await http.post("/sessions", json={"routing_key": "group-7/sample_3"})
        assert ok.status_code == 200 and ok.json()["routing_key"] == "group-7/sample_3"


# ---- engine output that breaks the protocol is never recorded ---------------------------------


async def test_token_ids_outside_the_vocabulary_fail_the_turn_as_an_engine_fault(make_core) -> None:
    core, backend = make_core()
    sid = core.create().id
    backend.push(Step(output_ids=[5, core.vocab_size + 10]), Step(output_ids=[-1]))
    for _ in range(2):
        with pytest.raises(errors.EngineProtocolError, match="outside the vocabulary") as err:
            await core.chat(sid, {"messages": [USER]})
        assert err.value.status == 502
    session = core.get(sid)
    assert session.turns == [] and [e["cause"] for e in session.turn_errors] == ["engine_protocol"] * 2


async def test_more_output_tokens_than_max_tokens_fail_the_turn(make_core) -> None:
    core, backend = make_core()
    sid = core.create().id
    backend.push(Step(output_ids=[5] * 20))
    with pytest.raises(errors.EngineProtocolError, match="20 output tokens for max_tokens=4"):
        await core.chat(sid, {"messages": [USER], "max_tokens": 4})
    assert core.get(sid).turns == []
    await core.chat(sid, {"messages": [USER], "max_tokens": 4})  # the default step is 3 tokens
    assert len(core.get(sid).turns) == 1


@pytest.mark.parametrize(
    ("engine_error", "expected", "status"),
    [
        (EngineError("HTTP 429", status=429), errors.EngineHTTPError, 429),
        (EngineError("HTTP 400", status=400), errors.EngineHTTPError, 400),
        (EngineError("HTTP 500", status=500), errors.EngineHTTPError, 500),
        (EngineTimeoutError("timed out"), errors.EngineTimeoutError, 504),
        (EngineError("ConnectError"), errors.EngineFaultError, 502),
    ],
)
async def test_engine_failures_map_to_their_class(make_core, engine_error, expected, status) -> None:
    core, backend = make_core()
    sid = core.create().id
    backend.push(Step(error=engine_error))
    with pytest.raises(expected) as err:
        await core.chat(sid, {"messages": [USER]})
    assert type(err.value) is expected and err.value.status == status
    assert core.get(sid).turn_errors == [{"turn": 0, "status": status, "cause": err.value.code}]


async def test_an_engine_429_reaches_the_agent_as_a_retryable_429(make_core) -> None:
    core, backend = make_core()
    sid = core.create().id
    body = '{"error": {"message": "overloaded", "code": 429}}'
    backend.push(Step(error=EngineError("HTTP 429", status=429, body=body)))
    async with _client(core) as http:
        url = f"/sessions/{sid}/v1/chat/completions"
        busy = await http.post(url, json={"messages": [USER]})
        assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
        assert busy.json() == {"error": {"message": "overloaded", "code": 429}}  # the engine's body
        assert core.get(sid).turn_errors[-1]["cause"] == "engine_busy"
        assert (await http.post(url, json={"messages": [USER]})).status_code == 200


# ---- retries: idempotent, never a fork ---------------------------------------------------------


async def test_a_retried_request_gets_the_recorded_turn(make_core) -> None:
    core, backend = make_core()
    sid = core.create().id
    body = {"messages": [USER], "temperature": 1.0}
    first = await core.chat(sid, body)
    again = await core.chat(sid, dict(body, stream=True))
    assert again is first and len(backend.calls) == 1
    session = core.get(sid)
    assert len(session.turns) == 1 and session.forks == []
    nxt = {"messages": [USER, first.message(), {"role": "user", "content": "more"}]}
    await core.chat(sid, nxt)
    assert len(core.get(sid).turns) == 2 and core.get(sid).forks == []
    sample = await core.merged(sid)
    assert sample.metadata["merge"]["segments"] == 1


async def test_a_retry_that_arrives_while_the_first_call_runs_waits_and_replays(make_core) -> None:
    core, backend = make_core()
    backend.delay_s = 0.1
    sid = core.create().id
    first, retry = await asyncio.gather(
        core.chat(sid, {"messages": [USER]}), core.chat(sid, {"messages": [USER]})
    )
    assert retry is first and len(backend.calls) == 1 and len(core.get(sid).turns) == 1


async def test_a_call_cancelled_mid_engine_leaves_the_session_its_retry_can_continue(make_core) -> None:
    core, backend = make_core()
    backend.delay_s = 0.2
    sid = core.create().id
    abandoned = asyncio.create_task(core.chat(sid, {"messages": [USER]}))
    await asyncio.sleep(0.05)
    abandoned.cancel()  # the client disconnected and the server cancelled the handler
    with pytest.raises(asyncio.CancelledError):
        await abandoned
    backend.delay_s = 0.0
    reply = await core.chat(sid, {"messages": [USER]})
    session = core.get(sid)
    assert len(session.turns) == 1 and session.forks == [] and not session.lock.locked()
    await core.chat(sid, {"messages": [USER, reply.message(), {"role": "user", "content": "go on"}]})
    assert len(core.get(sid).turns) == 2 and core.get(sid).forks == []


async def test_a_retry_delayed_past_later_turns_still_gets_its_turn(make_core) -> None:
    core, backend = make_core()
    sid = core.create().id
    first = await core.chat(sid, {"messages": [USER]})
    history = [USER, first.message(), {"role": "user", "content": "more"}]
    await core.chat(sid, {"messages": history})
    late = await core.chat(sid, {"messages": [USER]})  # a retry of turn 0 that arrives last
    assert late is first and len(backend.calls) == 2
    session = core.get(sid)
    assert len(session.turns) == 2 and session.forks == []


async def test_a_changed_request_is_not_a_replay(make_core) -> None:
    core, backend = make_core()
    sid = core.create().id
    await core.chat(sid, {"messages": [USER], "temperature": 0.5})
    await core.chat(sid, {"messages": [USER], "temperature": 0.7})  # same history, another request
    assert len(backend.calls) == 2 and len(core.get(sid).forks) == 1


# ---- a restarted server: session_lost ----------------------------------------------------------


def test_a_session_of_an_earlier_server_process_is_lost_not_unknown(make_core) -> None:
    before, _ = make_core()
    after, _ = make_core()  # a new process: a new instance id
    sid = before.create().id
    assert before.get(sid).id == sid and minted_by(sid) == before.instance_tag
    with pytest.raises(errors.SessionLostError, match="restarted") as err:
        after.get(sid)
    assert err.value.status == 410 and err.value.code == "session_lost"
    with pytest.raises(errors.SessionNotFoundError):
        after.get("0123456789abcdef0123456789abcdef")  # 32 hex digits whose check does not hold
    with pytest.raises(errors.SessionNotFoundError):
        after.get(mint_session_id(after.instance_tag))  # this process's form, never made


@given(tag=st.text("0123456789abcdef", min_size=8, max_size=8), position=st.integers(8, 27))
def test_a_mistyped_minted_id_is_rarely_taken_for_a_lost_one(tag: str, position: int) -> None:
    sid = mint_session_id(tag)
    assert len(sid) == 32 and minted_by(sid) == tag
    typo = sid[:position] + ("0" if sid[position] != "0" else "1") + sid[position + 1 :]
    # a 16-bit check: a single-digit typo passes it with probability 2**-16; hypothesis's ~100
    # examples would flag a check that does not depend on every digit
    assert minted_by(typo) is None


async def test_session_lost_over_http_is_410(make_core) -> None:
    before, _ = make_core()
    after, _ = make_core()
    sid = before.create().id
    async with _client(after) as http:
        response = await http.post(f"/sessions/{sid}/v1/chat/completions", json={"messages": [USER]})
    assert response.status_code == 410 and response.json()["error"]["code"] == "session_lost"


# ---- request size, bearer token, schemas -------------------------------------------------------


async def test_a_body_over_the_limit_is_413_naming_the_limit(make_core) -> None:
    core, backend = make_core()
    sid = core.create().id
    big = {"messages": [{"role": "user", "content": "x" * 5000}]}
    async with _client(core, max_request_bytes=4096) as http:
        url = f"/sessions/{sid}/v1/chat/completions"
        declared = await http.post(url, json=big)

        async def chunks():
            for _ in range(5):
                yield b" " * 1000  # no Content-Length: the streamed size is counted

        streamed = await http.post(url, content=chunks(), headers={"content-type": "application/json"})
        small = await http.post(url, json={"messages": [USER]})
    for response in (declared, streamed):
        assert response.status_code == 413
        assert "4096 bytes" in response.json()["error"]["message"]
    assert small.status_code == 200 and len(backend.calls) == 1


async def test_the_bearer_token_guards_every_route_but_health_and_metrics(make_core) -> None:
    core, _ = make_core()
    async with _client(core, api_key="s3cret") as http:
        assert (await http.get("/health")).status_code == 200
        assert (await http.get("/metrics")).status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
            refused = await http.post("/sessions", json={}, headers=headers)
            assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
            assert refused.json()["error"]["code"] == "unauthorized"
        ok = await http.post("/sessions", json={}, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200


def test_the_token_can_come_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("from-file\n")
    options = SessionServerConfig(backend_url="u", tokenizer_dir="t", api_key="flag", api_key_file=str(path))
    assert options.bearer_token() == "from-file" and "flag" not in repr(options)
    assert SessionServerConfig(backend_url="u", tokenizer_dir="t").bearer_token() is None


async def test_every_body_route_has_a_schema_in_openapi(make_core) -> None:
    core, _ = make_core()
    async with _client(core) as http:
        spec = (await http.get("/openapi.json")).json()
    schemas = spec["components"]["schemas"]
    posts = {path: ops["post"] for path, ops in spec["paths"].items() if "post" in ops}
    assert set(posts) == {
        "/sessions",
        "/sessions/{session_id}/v1/chat/completions",
        "/sessions/{session_id}/samples",
    }
    for operation in posts.values():
        ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref.removeprefix("#/components/schemas/") in schemas
    refs = {v for v in _walk(schemas) if isinstance(v, str) and v.startswith("#/")}
    assert all(r.removeprefix("#/components/schemas/") in schemas for r in refs)
    chat = schemas["ChatCompletionRequest"]
    assert chat["required"] == ["messages"] and "ChatMessage" in json.dumps(chat)


def _walk(node):
    if isinstance(node, dict):
        for value in node.values():
            yield value
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


# ---- arbitrary bodies never make a 5xx ---------------------------------------------------------

# hypothesis' full text: every code point, lone surrogates included (JSON carries them as escapes)
ANY_TEXT = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=12)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
    max_leaves=12,
)
FIELDS = (*ChatCompletionRequest.model_fields, "stream_options")
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "robot"])},
    optional={"content": JSON | ANY_TEXT, "tool_calls": JSON, "name": JSON},
)
CHAT_BODY = st.fixed_dictionaries(
    {"messages": st.lists(MESSAGE, max_size=4) | JSON},
    optional={name: JSON for name in FIELDS if name != "messages"},
)


@pytest.fixture(scope="module")
def fuzz_http(renderer):
    from starlette.testclient import TestClient

    from rl360_ext.session.core import SessionCoreConfig
    from rl360_ext.session.tito import TitoRenderer

    from .conftest import ScriptedBackend

    core = SessionCore(
        TitoRenderer(renderer), ScriptedBackend(renderer), SessionCoreConfig(max_sessions=100_000)
    )
    return core, TestClient(create_app(core))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=CHAT_BODY | JSON, create=JSON, samples=JSON)
def test_no_body_makes_a_5xx(fuzz_http, body, create, samples) -> None:
    core, http = fuzz_http
    sid = core.create().id
    for path, payload in (
        (f"/sessions/{sid}/v1/chat/completions", body),
        ("/sessions", create),
        (f"/sessions/{sid}/samples", samples),
        (f"/sessions/{sid}/v1/chat/completions", body),  # the same body again: a replay or a fork
    ):
        response = http.post(path, content=json.dumps(payload))
        assert response.status_code < 500, (path, payload, response.text)
    core.delete(sid)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(session_id=ANY_TEXT.filter(bool))
def test_no_session_id_makes_a_5xx(fuzz_http, session_id) -> None:
    """Any code point in a session id, a lone surrogate as the bytes it would be (not UTF-8)."""
    _, http = fuzz_http
    raw = quote(session_id.encode("utf-8", "surrogatepass"), safe="")
    for method in ("GET", "DELETE"):
        response = http.request(method, f"/sessions/{raw}")
        assert response.status_code in (404, 410), response.text
        response.json()
    response = http.post(f"/sessions/{raw}/v1/chat/completions", content=json.dumps({"messages": [USER]}))
    assert response.status_code in (404, 410), response.text


@pytest.mark.parametrize("metadata", [{"k": "\ud800"}, {"\udcff": 1}, {"k": [{"x": "a\udfffb"}]}])
def test_metadata_utf8_cannot_encode_is_refused_naming_it(make_core, metadata) -> None:
    """The Python API (the pool's actors) takes metadata unparsed: refused at create, not at merge."""
    core, _ = make_core(r3=False)
    with pytest.raises(errors.RequestError) as caught:
        core.create(metadata)
    assert caught.value.param == "metadata" and caught.value.message.startswith("metadata")
    json.dumps(caught.value.to_json(), ensure_ascii=False).encode()


@given(value=JSON)
def test_an_error_or_answer_holding_any_text_always_encodes(value) -> None:
    from rl360_ext.session.app import error_response, json_response

    assert json.loads(json_response({"v": value}).body) is not None
    message = value if isinstance(value, str) else repr(value)  # a raw lone surrogate too
    assert error_response(errors.RequestError(message, param="x")).status_code == 400


def test_the_loop_lag_histogram_is_served(fuzz_http) -> None:
    from starlette.testclient import TestClient

    core, _ = fuzz_http
    with TestClient(create_app(core)) as http:  # the app's lifespan runs: the watcher is started
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            text = http.get("/metrics").text
            counts = [
                line for line in text.splitlines() if line.startswith("rl360_session_loop_lag_seconds_count")
            ]
            if counts and float(counts[0].split()[-1]) > 0:
                break
            time.sleep(0.02)
    assert counts and float(counts[0].split()[-1]) > 0, text
