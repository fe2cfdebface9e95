"""`POST /run` and `POST /flush` under hypothesis' full text (lone surrogates included): a string
UTF-8 cannot encode is a 422 naming its field, never a 500 (the red team's `"\\ud800"` task name
was: the 422 echoed it and the encoder raised); names hold no control characters; a body that is
not UTF-8 is a 400; every answer encodes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl360_ext.harbor.app import SafeJSONResponse
from rl360_ext.util.text import unencodable

from .test_harbor_app import client, make_runner

ANY_TEXT = st.text(alphabet=st.characters(codec=None, exclude_categories=()), min_size=1, max_size=10)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
    max_leaves=8,
)
STRINGS = ("task", "base_url", "model", "session_id", "session_server_instance_id", "agent")
RUN_BODIES = st.fixed_dictionaries(
    {"task": ANY_TEXT, "deadline_s": st.just(0.001)},  # a deadline no attempt fits: nothing starts
    optional={
        **{name: ANY_TEXT for name in STRINGS[1:]},
        "sampling_params": st.dictionaries(ANY_TEXT, VALUES, max_size=3),
        "agent_kwargs": st.dictionaries(ANY_TEXT, VALUES, max_size=3),
    },
)


async def _post(runner: Any, path: str, content: bytes) -> tuple[int, Any]:
    async with client(runner) as http:
        response = await http.post(path, content=content, headers={"content-type": "application/json"})
    return response.status_code, response.json()


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return make_runner(tmp_path_factory.mktemp("text"))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=RUN_BODIES)
def test_no_string_in_a_run_body_makes_a_5xx(runner: Any, body: dict[str, Any]) -> None:
    status, answer = asyncio.run(_post(runner, "/run", json.dumps(body).encode()))
    assert status < 500, (body, answer)
    where = unencodable(body)
    if where is not None:
        assert status == 422, (body, answer)
        assert answer["detail"][0]["loc"][:2] == ["body", where.split(".")[0].split("[")[0]]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(instance=ANY_TEXT)
def test_no_string_in_a_flush_body_makes_a_5xx(runner: Any, instance: str) -> None:
    body = json.dumps({"session_server_instance_id": instance}).encode()
    status, answer = asyncio.run(_post(runner, "/flush", body))
    assert status == (422 if unencodable(instance) is not None else 200), answer


@pytest.mark.parametrize("field", ["base_url", "model", "agent", "session_id", "session_server_instance_id"])
def test_control_characters_in_names_are_422_naming_the_field(runner: Any, field: str) -> None:
    body = json.dumps({"task": "fix-mean", "deadline_s": 0.001, field: "a\u0000b"}).encode()
    status, answer = asyncio.run(_post(runner, "/run", body))
    assert status == 422 and answer["detail"][0]["loc"] == ["body", field], answer


def test_a_body_that_is_not_utf8_is_400_naming_the_body(runner: Any) -> None:
    status, answer = asyncio.run(_post(runner, "/run", b'{"task": "\xff", "deadline_s": 1}'))
    assert status == 400 and answer["detail"][0]["loc"] == ["body", "body"], answer


@given(value=VALUES)
def test_an_answer_holding_any_text_encodes(value: Any) -> None:
    rendered = SafeJSONResponse({"v": value}).body
    assert json.loads(rendered) is not None

