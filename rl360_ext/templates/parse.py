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
template uses, and the family's tool-call format (`rl360_ext.templates.emission`): "hermes" (the
default), "glm-xml" (`<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>`,
arguments returned as the JSON object text of the pairs), "llama3-json" (the whole reply is
`{"name": …, "parameters": …}`) or "harmony" (gpt-oss channels: `analysis` is the reasoning,
`final` the content, each `to=functions.NAME` commentary message a tool call) or "deepseek"
(`<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`
ending the reply). Reasoning is a
`<think>…</think>` block at the start (`think_open` is the opener the template uses, e.g.
"\\n<think>" for GLM; `think_close` the closer with the separator the template puts before the
content, e.g. "</think>\\n\\n" for Qwen3: layout, not content), or, when the prompt already
opened it (DeepSeek-R1), the text before the first `</think>`. It does not own rendering
(`rl360_ext.templates.render`).
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
_LLAMA3_CALL = re.compile(r'^\{"name": "((?:[^"\\]|\\.)*)", "parameters": (.*)\}$', re.DOTALL)
_GLM_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>\s*", re.DOTALL)
_DEEPSEEK_CALLS = re.compile(
    r"<｜tool▁calls▁begin｜>((?:<｜tool▁call▁begin｜>.*?<｜tool▁call▁end｜>)+)<｜tool▁calls▁end｜>$",
    re.DOTALL,
)
_DEEPSEEK_CALL = re.compile(r"<｜tool▁call▁begin｜>([^<]+?)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>", re.DOTALL)
_HARMONY_START = "<|start|>assistant"
_HARMONY_MESSAGE = "<|message|>"
_HARMONY_END = "<|end|>"
_HARMONY_RECIPIENT = re.compile(r"^ to=functions\.([^<\s]+)<\|channel\|>commentary(?: [^<]*)?$")


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


def _glm_value(text: str) -> Any:
    """An `<arg_value>` as the value it renders from: JSON when it re-serializes to the same text."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if isinstance(value, str) or json.dumps(value, ensure_ascii=False) != text:
        return text
    return value


def _parse_glm_call(body: str) -> dict[str, Any] | None:
    name, _, rest = body.partition("<arg_key>")
    name = name.strip()
    if not name or "<" in name:
        return None
    pairs = _GLM_PAIR.findall("<arg_key>" + rest if rest else "")
    leftover = _GLM_PAIR.sub("", "<arg_key>" + rest if rest else "")
    if leftover.strip():
        return None
    arguments = {key: _glm_value(value) for key, value in pairs}
    return {
        "id": f"call_{secrets.token_hex(8)}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def _opens_block(before_end: str) -> bool:
    """Whether the text before the first `</think>` opened a block of its own, so that `</think>`
    does not close a reasoning block the prompt opened: a `<think>`, or a tool call (reasoning never
    follows one; a `</think>` inside a call's arguments is argument text)."""
    return THINK_START in before_end or TOOL_CALL_START in before_end


def _split_reasoning(text: str, think_open: str, think_close: str) -> tuple[str | None, str]:
    start = None
    if text.startswith(think_open) and THINK_END in text:
        start = len(think_open)
    elif THINK_END in text and not _opens_block(text[: text.index(THINK_END)]):
        start = 0  # the prompt opened the block (DeepSeek-R1 style)
    if start is None:
        return None, text
    end = text.index(THINK_END, start)
    rest = text[end + len(THINK_END) :]
    separator = think_close[len(THINK_END) :] if think_close.startswith(THINK_END) else ""
    if separator and rest.startswith(separator):
        rest = rest[len(separator) :]
    return text[start:end], rest


def parse_harmony(text: str) -> ParsedAssistant:
    """gpt-oss text after `<|start|>assistant` (final end token removed) as message fields."""
    messages = text.split(_HARMONY_START)
    parsed = ParsedAssistant(content="")
    contents: list[str] = []
    for index, message in enumerate(messages):
        if index == 0 and not message:
            return ParsedAssistant(content=text)
        header, sep, body = message.partition(_HARMONY_MESSAGE)
        body = body.removesuffix(_HARMONY_END)
        if not sep or _HARMONY_END in body:
            return ParsedAssistant(content=text)
        recipient = _HARMONY_RECIPIENT.search(header)
        if recipient is not None:
            call = {
                "id": f"call_{secrets.token_hex(8)}",
                "type": "function",
                "function": {"name": recipient.group(1), "arguments": body},
            }
            parsed.tool_calls.append(call)
        elif header == "<|channel|>analysis" and parsed.reasoning is None and not contents:
            parsed.reasoning = body
        elif header in ("<|channel|>final", "<|channel|>commentary") and not parsed.tool_calls:
            contents.append(body)
        else:
            return ParsedAssistant(content=text)
    parsed.content = "".join(contents)
    return parsed


def _parse_llama3(text: str) -> ParsedAssistant | None:
    match = _LLAMA3_CALL.match(text)
    if match is None:
        return None
    try:
        json.loads(match.group(2))
        name = json.loads(f'"{match.group(1)}"')
    except ValueError:
        return None
    call = {
        "id": f"call_{secrets.token_hex(8)}",
        "type": "function",
        "function": {"name": name, "arguments": match.group(2)},
    }
    return ParsedAssistant(content="", tool_calls=[call])


def _parse_deepseek(text: str) -> tuple[str, list[dict[str, Any]]] | None:
    match = _DEEPSEEK_CALLS.search(text)
    if match is None:
        return None
    calls = []
    for name, arguments in _DEEPSEEK_CALL.findall(match.group(1)):
        try:
            json.loads(arguments)
        except ValueError:
            return None
        calls.append(
            {
                "id": f"call_{secrets.token_hex(8)}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
    return text[: match.start()], calls


def parse_assistant(
    text: str,
    tool_call_separator: str = "",
    tool_format: str = "hermes",
    think_open: str = THINK_START,
    think_close: str = THINK_END,
    separator_always: bool = False,
) -> ParsedAssistant:
    """Split generated text (end-of-turn token already removed) into content, reasoning, tool calls.

    A tool-call block that is not valid for its format stays in `content` untouched, so nothing
    the model produced is lost. `tool_call_separator` is the text the template renders before
    each tool call (before the first only when the content is not empty); it is removed there and
    kept everywhere else. `tool_format` and `think_open`: see the module docstring.
    """
    if tool_format == "harmony":
        return parse_harmony(text)
    reasoning, text = _split_reasoning(text, think_open, think_close)
    if tool_format == "llama3-json":
        parsed = _parse_llama3(text)
        if parsed is not None:
            parsed.reasoning = reasoning
            return parsed
        return ParsedAssistant(content=text, reasoning=reasoning)
    if tool_format == "deepseek":
        found = _parse_deepseek(text)
        if found is None:
            return ParsedAssistant(content=text, reasoning=reasoning)
        return ParsedAssistant(content=found[0], reasoning=reasoning, tool_calls=found[1])
    parse_call = _parse_glm_call if tool_format == "glm-xml" else _parse_tool_call
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    cursor = 0
    for match in _TOOL_CALL.finditer(text):
        call = parse_call(match.group(1))
        if call is None:
            continue
        before = text[cursor : match.start()]
        kept.append(
            _drop_separator(before, tool_call_separator, keep_nonempty=not calls and not separator_always)
        )
        calls.append(call)
        cursor = match.end()
    kept.append(text[cursor:])
    return ParsedAssistant(content="".join(kept), reasoning=reasoning, tool_calls=calls)
