"""The demo quiz agent's answer rule (no Harbor, no model)."""

from __future__ import annotations

import json

import pytest

from rl360_ext.local.fixtures import quiz_agent as demo_agent
from rl360_ext.local.fixtures.quiz_agent import extract_answer


def _call(name: str, arguments: str) -> dict[str, object]:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("C", "C"),
        ("the answer is", "A"),  # first a-d character in either case: "the" has none, "answer" has a
        ("xyz b", "B"),
        ("</tool_call>xyz d", "D"),  # markup tags the model emits as text do not count
        ("<|im_end|>", None),
        ("", None),
        (None, None),
        ("1234 !? ~", None),
    ],
)
def test_first_a_to_d_character_outside_markup(content: str | None, expected: str | None) -> None:
    assert extract_answer(content) == expected


def test_a_parsable_answer_tool_call_wins_over_the_text() -> None:
    calls = [_call("answer", json.dumps({"letter": "d"}))]
    assert extract_answer("a", calls) == "D"


@pytest.mark.parametrize(
    "calls",
    [
        [_call("answer", "{not json")],
        [_call("answer", json.dumps({"letter": "E"}))],
        [_call("answer", json.dumps({"choice": "B"}))],
        [_call("bash", json.dumps({"letter": "B"}))],
        [_call("answer", json.dumps(["B"]))],
    ],
)
def test_unusable_tool_calls_fall_back_to_the_text(calls: list[dict[str, object]]) -> None:
    assert extract_answer("c", calls) == "C"


def test_the_harbor_agent_is_importable_by_the_path_the_demo_passes() -> None:
    pytest.importorskip("harbor")
    module, _, name = demo_agent.IMPORT_PATH.partition(":")
    assert module == demo_agent.__name__
    agent_class = getattr(demo_agent, name)
    assert agent_class.name() == "rl360-demo-quiz"
    from harbor.agents.base import BaseAgent

    assert issubclass(agent_class, BaseAgent)
