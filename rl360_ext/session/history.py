"""Is an agent's message list an append of what the session holds? (pure functions)

Owns the comparison of the messages a session holds (the agent's earlier requests plus the
assistant replies the session returned) with the messages of a new request: what counts as the
same message (role, text, tool calls by name and arguments; tool-call ids and reasoning are not
compared, since clients drop or rewrite them), the index of the first difference, and a
human-readable description for the 409 / the fork record. A message equal to the held one as a
dict is the same message without building its comparable form, so an agent that echoes its
history costs one dict comparison per message. It does not decide what happens on a mismatch
(`core.py`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")


def _arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def comparable(message: Message) -> tuple[Any, ...]:
    """The parts of a message that must match for it to count as the same message."""
    calls = tuple(
        (
            (call.get("function") or {}).get("name"),
            json.dumps(_arguments((call.get("function") or {}).get("arguments")), sort_keys=True),
        )
        for call in message.get("tool_calls") or []
    )
    return (message.get("role"), _text(message.get("content")), calls)


@dataclass(frozen=True)
class Mismatch:
    """Where and how a request's history departs from the session's."""

    index: int | None  # first differing message; None when the tools differ
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"message_index": self.index, "reason": self.reason}


def _preview(message: Message) -> str:
    text = _text(message.get("content"))
    short = text if len(text) <= 60 else text[:57] + "..."
    calls = [(c.get("function") or {}).get("name") for c in message.get("tool_calls") or []]
    return f"{message.get('role')} {short!r}" + (f" tool_calls={calls}" if calls else "")


def _same_tools(held: Sequence[dict[str, Any]] | None, incoming: Sequence[dict[str, Any]] | None) -> bool:
    return json.dumps(list(held or []), sort_keys=True) == json.dumps(list(incoming or []), sort_keys=True)


def find_mismatch(
    held: Sequence[Message],
    incoming: Sequence[Message],
    held_tools: Sequence[dict[str, Any]] | None = None,
    incoming_tools: Sequence[dict[str, Any]] | None = None,
) -> Mismatch | None:
    """None when `incoming` repeats every held message and adds at least one; else the first difference."""
    if not _same_tools(held_tools, incoming_tools):
        return Mismatch(None, "the request's tools differ from the tools of the session's earlier turns")
    for i, message in enumerate(held):
        if i >= len(incoming):
            return Mismatch(
                i,
                f"messages ends after {len(incoming)} messages, but the session holds messages[{i}] "
                f"({_preview(message)}); a retry or a shortened history is not an append",
            )
        if incoming[i] == message:  # the agent echoed it as held (one C-level comparison)
            continue
        if comparable(incoming[i]) != comparable(message):
            return Mismatch(
                i,
                f"messages[{i}] ({_preview(incoming[i])}) differs from what the session holds "
                f"({_preview(message)})",
            )
    if len(incoming) == len(held):
        return Mismatch(len(held), "the request adds no new message after the session's last reply")
    return None
