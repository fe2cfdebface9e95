"""Conversations for the append-only checker: a seeded generator and the shapes it builds.

Owns `Conversation` (the first prompt, then turns of one generated assistant message followed by
the messages the agent sends next, plus the `tools`), the generator that covers what agents send
(system prompts, users, assistants with and without reasoning, one or several tool calls,
tool results, empty and missing content, content-part lists, unicode and whitespace edge cases,
with and without tools), and the simplifications the checker's shrinker tries. Choices go
through a `Chooser`, so the same generator runs from a seed (`RandomChooser`, deterministic) or
from a property-testing library. It does not render or check anything (`rl360_ext.templates.check`).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]

TEXTS: tuple[str, ...] = (
    "",
    "Run the tests and fix the failing one.",
    "ok",
    " leading space",
    "trailing space ",
    "  padded on both sides  ",
    " ",
    "\n",
    "\n\nstarts with blank lines",
    "ends with a newline\n",
    "two\n\nparagraphs",
    "\ttabs\tand  double  spaces",
    "windows\r\nline endings\r\n",
    "naïve café — “curly quotes” ‘single’ … ellipsis",
    "中文内容，测试一下。",
    "日本語のテキストです",
    "emoji 🚀🔥👍🏽 and a ZWJ sequence 👩‍💻",
    "right-to-left: שלום עולם مرحبا",
    "combining marks: e\u0301 a\u0308 n\u0303",
    "zero-width:\u200b\u200c\u200d|",
    "no-break\u00a0spaces\u202fhere",
    "```python\ndef f(x):\n    return x + 1\n```",
    '{"key": "value", "n": [1, 2]}',
    "<b>markup</b> & {{ not jinja }} {% raw %} {# nor this #}",
    "C:\\path\\to\\file and a literal \\n",
    "word " * 40,
)
REASONINGS: tuple[str, ...] = (
    "",
    "The test fails because the list is not sorted.",
    "\nLet me look at the file first.\n",
    "step 1: read\nstep 2: patch\nstep 3: rerun",
    "  spaces around  ",
    "思考：先运行测试。",
    "maybe 🤔",
)
TOOL_RESULTS: tuple[str, ...] = (
    "",
    "exit code 0\n3 passed in 0.12s",
    'Traceback (most recent call last):\n  File "main.py", line 3\nNameError: x',
    '{"ok": true, "files": ["a.py", "b.py"]}',
    "  indented output\n\n",
    "résumé.txt\nnaïve.py\n",
)
ARGUMENTS: tuple[Any, ...] = (
    '{"command": "ls -la /app"}',
    '{"command":"python -m pytest -q"}',
    '{\n  "path": "/app/main.py",\n  "line": 3\n}',
    '{"query": "café ☕"}',
    '{"query": "caf\\u00e9"}',
    "{}",
    '{"n": 1.50, "ok": true, "none": null, "list": [1, "two", {"three": 3}]}',
    '{"z": 1, "a": 2}',
    '{"text": "line1\\nline2\\t\\"quoted\\""}',
    {"command": "echo hi"},
    {"path": "/tmp/ünïcode.txt", "n": 2},
)
TOOL_NAMES: tuple[str, ...] = ("bash", "read_file", "search_code", "write_file")


def tool_schema(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}, "required": []},
        },
    }


class Chooser:
    """The choices the generator makes; subclass to drive it from another source of randomness."""

    def chance(self, p: float) -> bool:
        raise NotImplementedError

    def integer(self, low: int, high: int) -> int:
        raise NotImplementedError

    def pick(self, options: Sequence[Any]) -> Any:
        raise NotImplementedError

    def text(self, pool: Sequence[str]) -> str:
        """A string for a message field: an edge case from `pool` or something built from it."""
        raise NotImplementedError


class RandomChooser(Chooser):
    """Choices from `random.Random(seed)`: the same seed gives the same conversations."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def integer(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)

    def pick(self, options: Sequence[Any]) -> Any:
        return options[self.rng.randrange(len(options))]

    def text(self, pool: Sequence[str]) -> str:
        if self.chance(0.25):
            return self.pick(pool) + self.pick(pool)
        return self.pick(pool)


@dataclass
class Turn:
    """One generated assistant message and the messages the agent sends after it ([] = the end)."""

    assistant: Message
    new_messages: list[Message] = field(default_factory=list)


@dataclass
class Conversation:
    """A session's conversation: first prompt (ends with a non-assistant message), then turns."""

    prompt: list[Message]
    turns: list[Turn]
    tools: list[dict[str, Any]] | None = None

    def messages(self) -> list[Message]:
        out = list(self.prompt)
        for turn in self.turns:
            out.append(turn.assistant)
            out.extend(turn.new_messages)
        return out

    def size(self) -> tuple[int, int, int]:
        """Ordering for "smallest": messages, then tools, then characters of the messages' JSON."""
        messages = self.messages()
        return len(messages), len(self.tools or []), len(repr(messages)) + len(repr(self.tools or []))

    def to_json(self) -> dict[str, Any]:
        return {
            "messages": copy.deepcopy(self.messages()),
            "first_generated_index": len(self.prompt),
            "tools": copy.deepcopy(self.tools),
        }


def _tool_call(chooser: Chooser, turn: int, index: int, names: Sequence[str]) -> dict[str, Any]:
    return {
        "id": f"call_{turn}_{index}",
        "type": "function",
        "function": {"name": chooser.pick(names), "arguments": copy.deepcopy(chooser.pick(ARGUMENTS))},
    }


def _content(chooser: Chooser) -> Any:
    if chooser.chance(0.1):
        return [{"type": "text", "text": chooser.text(TEXTS)}, {"type": "text", "text": chooser.text(TEXTS)}]
    return chooser.text(TEXTS)


def _assistant(chooser: Chooser, turn: int, names: Sequence[str] | None, prefilled: bool) -> Message:
    message: Message = {"role": "assistant", "content": chooser.text(TEXTS)}
    if chooser.chance(0.5):
        message["reasoning_content"] = chooser.text(REASONINGS)
    if names and not prefilled and chooser.chance(0.55):
        count = chooser.pick((1, 1, 2, 3))
        message["tool_calls"] = [_tool_call(chooser, turn, i, names) for i in range(count)]
        if message["content"] == "" and chooser.chance(0.5):
            message["content"] = None
    return message


def _after(chooser: Chooser, assistant: Message) -> list[Message]:
    calls = assistant.get("tool_calls") or []
    out: list[Message] = [
        {"role": "tool", "tool_call_id": call["id"], "content": chooser.text(TOOL_RESULTS)} for call in calls
    ]
    if not calls or chooser.chance(0.3):
        out.append({"role": "user", "content": _content(chooser)})
    return out


def build_conversation(chooser: Chooser) -> Conversation:
    """One conversation; every generated assistant message is followed by what an agent sends."""
    names = list(TOOL_NAMES[: chooser.integer(1, len(TOOL_NAMES))]) if chooser.chance(0.6) else None
    prompt: list[Message] = []
    if chooser.chance(0.7):
        prompt.append({"role": "system", "content": chooser.text(TEXTS)})
    if chooser.chance(0.15):
        prompt.append({"role": "user", "content": _content(chooser)})
        prompt.append(_assistant(chooser, -1, names, prefilled=True))
    prompt.append({"role": "user", "content": _content(chooser)})
    turns: list[Turn] = []
    count = chooser.integer(1, 4)
    for index in range(count):
        assistant = _assistant(chooser, index, names, prefilled=False)
        last = index == count - 1
        turns.append(Turn(assistant, [] if last and chooser.chance(0.4) else _after(chooser, assistant)))
    tools = [tool_schema(name) for name in names] if names else None
    return Conversation(prompt, turns, tools)


def generate_conversations(count: int, seed: int) -> list[Conversation]:
    """`count` conversations, the same for the same seed."""
    chooser = RandomChooser(seed)
    return [build_conversation(chooser) for _ in range(count)]


# ---- shrinking ---------------------------------------------------------------------------------


def _with(conversation: Conversation, **changes: Any) -> Conversation:
    fresh = copy.deepcopy(conversation)
    for name, value in changes.items():
        setattr(fresh, name, copy.deepcopy(value))
    return fresh


def _simpler_texts(text: str) -> Iterator[str]:
    if text == "":
        return
    yield ""
    if text.strip() != text:
        yield text.strip()
    if len(text) > 2:
        yield text[: len(text) // 2]
        yield text[len(text) // 2 :]
    if text.strip() and text.strip() != "x":
        lead = text[: len(text) - len(text.lstrip())]
        trail = text[len(text.rstrip()) :]
        yield f"{lead}x{trail}"


def _simpler_messages(message: Message) -> Iterator[Message]:
    if "reasoning_content" in message:
        yield {k: v for k, v in message.items() if k != "reasoning_content"}
        for text in _simpler_texts(message["reasoning_content"]):
            yield {**message, "reasoning_content": text}
    calls = message.get("tool_calls") or []
    for i, call in enumerate(calls):
        if call["function"]["arguments"] != "{}":
            simple = {**call, "function": {**call["function"], "arguments": "{}"}}
            yield {**message, "tool_calls": [*calls[:i], simple, *calls[i + 1 :]]}
    content = message.get("content")
    if isinstance(content, list):
        yield {**message, "content": "".join(part.get("text", "") for part in content)}
    elif isinstance(content, str):
        for text in _simpler_texts(content):
            yield {**message, "content": text}


def _messages_at(conversation: Conversation) -> Iterator[tuple[tuple[str, int, int], Message]]:
    """Every message with its place: ("prompt", -1, i), ("assistant", turn, -1) or ("new", turn, i)."""
    for i, message in enumerate(conversation.prompt):
        yield ("prompt", -1, i), message
    for t, turn in enumerate(conversation.turns):
        yield ("assistant", t, -1), turn.assistant
        for i, message in enumerate(turn.new_messages):
            yield ("new", t, i), message


def _replace(conversation: Conversation, place: tuple[str, int, int], message: Message) -> Conversation:
    fresh = copy.deepcopy(conversation)
    kind, t, i = place
    if kind == "prompt":
        fresh.prompt[i] = copy.deepcopy(message)
    elif kind == "assistant":
        fresh.turns[t].assistant = copy.deepcopy(message)
    else:
        fresh.turns[t].new_messages[i] = copy.deepcopy(message)
    return fresh


def _without_call(turn: Turn, index: int) -> Turn:
    """The turn without its tool call `index` and that call's result."""
    calls = turn.assistant["tool_calls"]
    dropped = calls[index].get("id")
    assistant = {k: v for k, v in turn.assistant.items() if k != "tool_calls"}
    if len(calls) > 1:
        assistant["tool_calls"] = calls[:index] + calls[index + 1 :]
    new = [m for m in turn.new_messages if not (m.get("role") == "tool" and m.get("tool_call_id") == dropped)]
    return Turn(assistant, new)


def is_valid(conversation: Conversation) -> bool:
    """Tool calls only with tools, and every tool result answers a call of the turn before it."""
    if not conversation.prompt or conversation.prompt[-1].get("role") == "assistant":
        return False
    for t, turn in enumerate(conversation.turns):
        ids = {call.get("id") for call in turn.assistant.get("tool_calls") or []}
        if ids and not conversation.tools:
            return False
        if t < len(conversation.turns) - 1 and not turn.new_messages:
            return False
        if any(m.get("role") == "tool" and m.get("tool_call_id") not in ids for m in turn.new_messages):
            return False
    return True


def shrink_candidates(conversation: Conversation) -> Iterator[Conversation]:
    """Smaller valid variants of a conversation, biggest cuts first (each one a fresh copy)."""
    return (candidate for candidate in _candidates(conversation) if is_valid(candidate))


def _candidates(conversation: Conversation) -> Iterator[Conversation]:
    turns = conversation.turns
    for i in range(len(turns)):
        if len(turns) > 1:
            yield _with(conversation, turns=turns[:i] + turns[i + 1 :])
    if turns and turns[-1].new_messages:
        yield _with(conversation, turns=[*turns[:-1], Turn(turns[-1].assistant, [])])
    prompt = conversation.prompt
    for i in range(len(prompt) - 1):
        yield _with(conversation, prompt=prompt[:i] + prompt[i + 1 :])
    for t, turn in enumerate(turns):
        for i in range(len(turn.new_messages)):
            rest = turn.new_messages[:i] + turn.new_messages[i + 1 :]
            if rest or t == len(turns) - 1:
                yield _with(conversation, turns=[*turns[:t], Turn(turn.assistant, rest), *turns[t + 1 :]])
    if conversation.tools:
        if len(conversation.tools) > 1:
            for i in range(len(conversation.tools)):
                yield _with(conversation, tools=conversation.tools[:i] + conversation.tools[i + 1 :])
        yield _with(conversation, tools=None)
    for t, turn in enumerate(turns):
        for i in range(len(turn.assistant.get("tool_calls") or [])):
            yield _with(conversation, turns=[*turns[:t], _without_call(turn, i), *turns[t + 1 :]])
    for place, message in list(_messages_at(conversation)):
        for simpler in _simpler_messages(message):
            yield _replace(conversation, place, simpler)
