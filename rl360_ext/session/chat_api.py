"""The OpenAI chat-completions surface, without HTTP: request validation and reply shapes.

Owns parsing an agent's request body into `ChatRequest` (every rejection is a `RequestError`
naming the field), the engine sampling parameters it maps to, and the `chat.completion` /
`chat.completion.chunk` reply objects (content, reasoning, tool calls, finish_reason, usage; no
routing data). It does not own sessions (`core.py`) or the web framework (`app.py`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rl360_ext.session.errors import RequestError
from rl360_ext.templates.parse import ParsedAssistant

ROLES = ("system", "user", "assistant", "tool")
TOOL_CHOICES = ("none", "auto", "required")
Message = dict[str, Any]


def _bad(param: str, message: str) -> RequestError:
    return RequestError(f"{param}: {message}", param=param)


@dataclass
class ChatRequest:
    """A validated chat-completions request."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    new_chars: int = field(default=0, compare=False)
    """Characters of text in the messages (and, on a first prompt, the tools) this turn tokenizes:
    those not equal to the held message at their index."""

    def sampling_params(self) -> dict[str, Any]:
        """SGLang sampling_params for this request (the session adds its forced flags)."""
        params: dict[str, Any] = {}
        for ours, theirs in (
            ("max_tokens", "max_new_tokens"),
            ("temperature", "temperature"),
            ("top_p", "top_p"),
            ("seed", "sampling_seed"),
            ("frequency_penalty", "frequency_penalty"),
            ("presence_penalty", "presence_penalty"),
        ):
            value = getattr(self, ours)
            if value is not None:
                params[theirs] = value
        if self.stop:
            params["stop"] = list(self.stop)
        if self.logit_bias:
            params["logit_bias"] = dict(self.logit_bias)
        return params


def _content_ok(content: Any) -> bool:
    if content is None or isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(p, dict) and isinstance(p.get("type"), str) for p in content
    )


def _check_tool_calls(calls: Any, where: str) -> None:
    if not isinstance(calls, list):
        raise _bad(where, "must be a list of tool calls")
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _bad(f"{where}[{j}].function.name", "is required and must be a string")
        if not isinstance(fn.get("arguments"), str | dict):
            raise _bad(f"{where}[{j}].function.arguments", "must be a JSON string")


def text_chars(value: Any) -> int:
    """Characters in every string value of a JSON-like value: text a render tokenizes (keys, which
    a template need not render, are not counted, so the count never overstates the text)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(text_chars(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(text_chars(v) for v in value)
    return 0


def _over_budget(where: str, chars: int, max_chars: int) -> RequestError:
    return _bad(
        where,
        f"the new text of this request is over {max_chars} characters ({chars} so far): more tokens "
        "than the engine's context holds, at most --max-chars-per-token characters per token; "
        "it is refused before it is tokenized",
    )


def _check_messages(
    messages: Any, held: Sequence[Message] = (), max_chars: int | None = None
) -> tuple[list[Message], int]:
    """`messages`, checked, and the characters of text in the new ones; a message equal to the held
    message at its index (one C-level dict comparison) is valid as that one was when it arrived, so
    an echoed history costs no checks. Past `max_chars` of new text: RequestError naming the message."""
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "must be a non-empty list of messages")
    held_count = len(held)
    chars = 0
    for i, message in enumerate(messages):
        if i < held_count and message == held[i]:
            continue
        if not isinstance(message, dict):
            raise _bad(f"messages[{i}]", "must be an object with a role")
        role = message.get("role")
        if role not in ROLES:
            raise _bad(f"messages[{i}].role", f"{role!r} is not one of {', '.join(ROLES)}")
        if not _content_ok(message.get("content")):
            raise _bad(f"messages[{i}].content", "must be a string, a list of content parts, or null")
        if role != "assistant" and message.get("content") is None:
            raise _bad(f"messages[{i}].content", f"is required for role {role!r}")
        if role == "assistant" and message.get("tool_calls") is not None:
            _check_tool_calls(message["tool_calls"], f"messages[{i}].tool_calls")
        chars += text_chars(message) - len(role)  # the role renders as the template's own markup
        if max_chars is not None and chars > max_chars:
            raise _over_budget(f"messages[{i}]", chars, max_chars)
    return messages, chars


def _check_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise _bad("tools", "must be a list of tool definitions")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _bad(f"tools[{i}].function.name", "is required and must be a string")
    return tools or None


def _check_tool_choice(choice: Any) -> str | dict[str, Any] | None:
    if choice is None or choice in TOOL_CHOICES:
        return choice
    if isinstance(choice, dict) and isinstance((choice.get("function") or {}).get("name"), str):
        return choice
    raise _bad("tool_choice", f"must be one of {', '.join(TOOL_CHOICES)} or a named function, got {choice!r}")


def _number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise _bad(name, f"must be a number in [{low}, {high}], got {value!r}")
    return float(value)


def _integer(body: dict[str, Any], name: str, low: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _bad(name, f"must be an integer >= {low}, got {value!r}")
    return value


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) and s for s in value):
        return list(value)
    raise _bad("stop", "must be a string or a list of non-empty strings")


def _logit_bias(value: Any) -> dict[str, float] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad("logit_bias", "must be an object mapping token ids to biases")
    for token, bias in value.items():
        if not str(token).isdigit():
            raise _bad("logit_bias", f"key {token!r} is not a token id")
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not -100 <= bias <= 100:
            raise _bad("logit_bias", f"bias for token {token} must be a number in [-100, 100]")
    return {str(token): float(bias) for token, bias in value.items()}


def parse_chat_request(body: Any, held: Sequence[Message] = (), max_chars: int | None = None) -> ChatRequest:
    """Validate an agent's chat-completions body; raises RequestError(400) naming the field.

    `held`: messages already validated (the session's; the replies it made are valid too); a
    request message equal to the one at its index is not checked again. The answer, and the
    first error, are those of checking every message. `max_chars`: the most characters of new
    text (new messages; on a first prompt the tools too) a turn may tokenize
    (`SessionCoreConfig.max_text_chars`); more is a RequestError before anything is rendered."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object", param="body")
    n = _integer(body, "n", 1)
    if n not in (None, 1):
        raise _bad("n", f"n={n} is not supported: a session records one trajectory, so n must be 1")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream", "must be true or false")
    max_tokens = _integer(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 1)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model", "must be a string")
    messages, chars = _check_messages(body.get("messages"), held, max_chars)
    tools = _check_tools(body.get("tools"))
    if not held and tools:
        chars += text_chars(tools)
        if max_chars is not None and chars > max_chars:
            raise _over_budget("tools", chars, max_chars)
    return ChatRequest(
        messages=messages,
        tools=tools,
        tool_choice=_check_tool_choice(body.get("tool_choice")),
        model=model,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 0.0, 2.0),
        top_p=_number(body, "top_p", 1e-9, 1.0),
        stop=_stop(body.get("stop")),
        seed=_integer(body, "seed", 0),
        frequency_penalty=_number(body, "frequency_penalty", -2.0, 2.0),
        presence_penalty=_number(body, "presence_penalty", -2.0, 2.0),
        logit_bias=_logit_bias(body.get("logit_bias")),
        stream=stream,
        new_chars=chars,
    )


@dataclass
class Reply:
    """What a turn produced for the agent."""

    completion_id: str
    model: str
    parsed: ParsedAssistant
    finish_reason: str  # the engine's: stop | length | abort
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def openai_finish_reason(self) -> str:
        if self.finish_reason == "stop" and self.parsed.tool_calls:
            return "tool_calls"
        return self.finish_reason

    def message(self) -> Message:
        """The assistant message as returned to the agent (and as the session expects it back)."""
        return self.parsed.to_message()

    def usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    def completion(self) -> dict[str, Any]:
        """A `chat.completion` object."""
        return {
            "id": self.completion_id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "message": self.message(), "finish_reason": self.openai_finish_reason}],
            "usage": self.usage(),
        }

    def chunk(self) -> dict[str, Any]:
        """The whole reply as one `chat.completion.chunk` (the stream is this chunk, then [DONE])."""
        delta = self.message()
        if "tool_calls" in delta:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(delta["tool_calls"])]
        return {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": self.openai_finish_reason}],
            "usage": self.usage(),
        }
