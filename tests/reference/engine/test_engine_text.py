"""Every body schema of the tiny engine under hypothesis' full text (lone surrogates included): a
string UTF-8 cannot encode is a 400 naming its field, never a 500; a `text` too long for the
context is refused before it is tokenized; a path holds no control character."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl360_ext.reference.engine.engine import EngineConfig, TinyEngine
from rl360_ext.reference.engine.server import BODY_MODELS, create_app
from rl360_ext.util.text import unencodable

ANY_TEXT = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=10)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(0, 8) | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
    max_leaves=8,
)
# the routes that change the engine's state are answered before they act on a refused body
ROUTES = sorted(BODY_MODELS)
JSON = {"content-type": "application/json"}


def _bodies(path: str) -> st.SearchStrategy[dict[str, Any]]:
    fields = list(BODY_MODELS[path].model_fields)
    return st.dictionaries(st.sampled_from(fields) | ANY_TEXT, VALUES, max_size=4)


@pytest.fixture(scope="module")
def http() -> Iterator[TestClient]:
    engine = TinyEngine(EngineConfig(seed=0, context_length=64))
    with TestClient(create_app(engine)) as client:
        yield client


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_string_in_any_body_makes_a_5xx(http: TestClient, data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(ROUTES))
    body = data.draw(_bodies(path))
    response = http.post(path, content=json.dumps(body), headers=JSON)  # surrogates as JSON escapes
    http.post("/continue_generation", json={})
    http.post("/rl360/faults", json={})
    assert response.status_code < 500, (path, body, response.text)
    answer = response.json()
    if unencodable(body) is not None:
        assert response.status_code == 400, (path, body, response.text)
        assert answer["error"]["param"], answer


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/generate", {"text": "\ud800", "sampling_params": {"max_new_tokens": 1}}, "text"),
        ("/generate", {"input_ids": [1, 2], "rid": "\udcff"}, "rid"),
        ("/generate", {"input_ids": [1], "sampling_params": {"stop": ["\ud800"]}}, "sampling_params"),
        ("/update_weights_from_disk", {"model_path": "/tmp/a\u0000b"}, "model_path"),
        ("/update_weights_from_disk", {"model_path": "/tmp/\ud800"}, "model_path"),
    ],
)
def test_the_red_teams_strings_are_400_naming_the_field(
    http: TestClient, path: str, body: dict[str, Any], field: str
) -> None:
    response = http.post(path, content=json.dumps(body), headers=JSON)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == field


def test_a_text_too_long_for_the_context_is_refused_untokenized(http: TestClient) -> None:
    engine = TinyEngine(EngineConfig(seed=0, context_length=64))
    assert engine.max_text_chars == 64 * max(len(token) for token in engine.tokenizer.get_vocab())
    too_long = http.post("/generate", json={"text": "a" * (engine.max_text_chars + 1)})
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "text"
    assert "more tokens than the context holds" in too_long.json()["error"]["message"]
    long_enough = http.post("/generate", json={"text": "ab " * 600})  # tokenized on a worker thread
    assert long_enough.status_code == 400, long_enough.text
    assert "context length is 64" in long_enough.json()["error"]["message"]
