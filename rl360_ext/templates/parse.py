"""Parsing of generated assistant text into OpenAI message fields for the Qwen/Hermes family.

Owns the inverse of the template's assistant render: `<think>…</think>` becomes
`reasoning_content`, each `<tool_call>{"name": …, "arguments": …}</tool_call>` becomes a tool call
whose `arguments` string is the exact JSON text the model emitted (never re-serialized, so the
agent echoes back the same bytes and the template re-renders them verbatim). Text is not stripped:
reasoning and content are returned byte for byte, so a template that renders them verbatim
reproduces the generated text exactly.

Templates differ in the text they put between the content and a tool call (the engine's reference
template: nothing; the Qwen3-style fixed template: a newline). `tool_call_separator` names that
text so it is not mistaken for content; `ChatRenderer.parse_assistant` passes the separator its
template uses. It does not own rendering (`rl360_ext.templates.render`).
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from rl360_ext.templates.markup import THINK_END, THINK_START, TOOL_CALL_END, TOOL_CALL_START

_TOOL_CALL = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)" + re.escape(TOOL_CALL_END), re.DOTALL)
_NAME_THEN_ARGS = re.compile(r'^\{"name": "((?:[^"\\]|\\.)*)", "arguments": (.*)\}$', re.DOTALL)


@dataclass
class ParsedAssistant:
    content: str
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def to_message(self) -> dict[str, Any]:
        """The OpenAI assistant message an agent receives (and echoes back in its next request)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            message["reasoning_content"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
            message["content"] = self.content or None
        return message


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


def _drop_separator(text: str, separator: str, keep_nonempty: bool) -> str:
    """`text` without a trailing separator (kept when removing it would leave nothing and
    `keep_nonempty` says the template puts the separator only after non-empty content)."""
    if not separator or not text.endswith(separator):
        return text
    rest = text[: -len(separator)]
    return text if keep_nonempty and not rest else rest


def parse_assistant(text: str, tool_call_separator: str = "") -> ParsedAssistant:
    """Split generated text (end-of-turn token already removed) into content, reasoning, tool calls.

    A `<tool_call>` block that is not valid JSON of the expected shape stays in `content`
    untouched, so nothing the model produced is lost. `tool_call_separator` is the text the
    template renders before each tool call (before the first only when the content is not empty);
    it is removed there and kept everywhere else.
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
        before = text[cursor : match.start()]
        kept.append(_drop_separator(before, tool_call_separator, keep_nonempty=not calls))
        calls.append(call)
        cursor = match.end()
    kept.append(text[cursor:])
    return ParsedAssistant(content="".join(kept), reasoning=reasoning, tool_calls=calls)
