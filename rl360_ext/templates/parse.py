"""Parsing of generated assistant text into OpenAI message fields for the Qwen/Hermes family.

Owns the inverse of the template's assistant render: `<think>…</think>` becomes
`reasoning_content`, each `<tool_call>{"name": …, "arguments": …}</tool_call>` becomes a tool call
whose `arguments` string is the exact JSON text the model emitted (never re-serialized, so the
agent echoes back the same bytes and the template re-renders them verbatim). Text is not stripped.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from rl360_ext.engine.tokenizer import THINK_END, THINK_START, TOOL_CALL_END, TOOL_CALL_START

_TOOL_CALL = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)" + re.escape(TOOL_CALL_END), re.DOTALL)
_NAME_THEN_ARGS = re.compile(r'^\{"name": "((?:[^"\\]|\\.)*)", "arguments": (.*)\}$', re.DOTALL)


@dataclass
class ParsedAssistant:
    content: str
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


def _parse_tool_call(body: str) -> dict[str, Any] | None:
    match = _NAME_THEN_ARGS.match(body.strip())
    if match is None:
        return None
    name, arguments = match.group(1), match.group(2)
    try:
        json.loads(arguments)
        name = json.loads(f'"{name}"')
    except ValueError:
        return None
    return {
        "id": f"call_{secrets.token_hex(8)}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def parse_assistant(text: str) -> ParsedAssistant:
    """Split generated text (end-of-turn token already removed) into content, reasoning, tool calls.

    A `<tool_call>` block that is not valid JSON of the expected shape stays in `content`
    untouched, so nothing the model produced is lost.
    """
    reasoning = None
    if text.startswith(THINK_START) and THINK_END in text:
        end = text.index(THINK_END)
        reasoning = text[len(THINK_START) : end]
        text = text[end + len(THINK_END) :]
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    cursor = 0
    for match in _TOOL_CALL.finditer(text):
        call = _parse_tool_call(match.group(1))
        if call is None:
            continue
        kept.append(text[cursor : match.start()])
        calls.append(call)
        cursor = match.end()
    kept.append(text[cursor:])
    return ParsedAssistant(content="".join(kept), reasoning=reasoning, tool_calls=calls)
