"""What a model family emits in an assistant turn: how it reasons, which tokens end the turn, and
the tool-call format, detected from a chat template and its tokenizer's special tokens.

Owns `Emission` (the three facts), `detect_emission` (reads them off the template by rendering
probe messages, and off the special tokens) and `parse_emission_override` (the `--reasoning`,
`--end-token`, `--tool-format` overrides). The checker (`check/`) builds the model's turn from
these facts, and `ChatRenderer` parses replies with the detected tool format, so the session
server and the checker read the same facts. It does not render (`render.py`) or parse
(`parse.py`) by itself.

- reasoning: "think" (`<think>…</think>` before the content), "harmony" (an `analysis` channel
  message before the final one, gpt-oss), or "none".
- end tokens: the tokens that may end a turn (the model stops after sampling one): one
  (`<|im_end|>`), several (harmony: `<|return|>`, `<|call|>`, `<|end|>`), or none: the next role
  token ends the turn (GLM: the model stops at `<|user|>` / `<|observation|>`, which starts the
  next message and is rendered by it).
- tool format: "hermes" (`<tool_call>{"name": …, "arguments": …}</tool_call>`), "glm-xml"
  (`<tool_call>name<arg_key>…</arg_key><arg_value>…</arg_value></tool_call>`), "llama3-json"
  (`{"name": …, "parameters": …}` as the whole reply), "harmony" (`to=functions.NAME` commentary
  messages), or a format the session server does not parse ("deepseek", "kimi", "mistral",
  "gemma"), or "none" (the template renders no tool calls).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

REASONING_MODES = ("think", "harmony", "none")
PARSED_TOOL_FORMATS = ("hermes", "glm-xml", "llama3-json", "harmony", "deepseek")
UNPARSED_TOOL_FORMATS = ("kimi", "mistral", "gemma")
TOOL_FORMATS = (*PARSED_TOOL_FORMATS, *UNPARSED_TOOL_FORMATS, "none")
HARMONY_END_TOKENS = ("<|return|>", "<|call|>", "<|end|>")
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

PROBE_CONTENT = "\u2063rl360-content\u2063"
PROBE_TOOL_NAME = "rl360_probe"
_PROBE_USER = "\u2063rl360-user\u2063"
_PROBE_NEXT = "\u2063rl360-next\u2063"
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": PROBE_TOOL_NAME,
        "description": "probe",
        "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}},
    },
}
# Markers of tool-call formats, in the order they are tried (the first found names the format).
_FORMAT_MARKERS = (
    ("harmony", ("to=functions.",)),
    ("kimi", ("<|tool_call_begin|>", "<|tool_calls_section_begin|>")),
    ("deepseek", ("<｜tool▁call▁begin｜>", "<｜tool▁calls▁begin｜>")),
    ("mistral", ("[TOOL_CALLS]",)),
    ("gemma", ("<|tool_call>",)),
    ("glm-xml", ("<arg_key>",)),
    ("hermes", ("<tool_call>",)),
)


@dataclass(frozen=True)
class Emission:
    """How a family's model emits an assistant turn (see the module docstring)."""

    reasoning: str
    end_tokens: tuple[str, ...]
    tool_format: str
    think_open: str = THINK_OPEN
    think_close: str = THINK_CLOSE
    detected: bool = True

    @property
    def session_parses_tool_calls(self) -> bool:
        return self.tool_format in PARSED_TOOL_FORMATS

    @property
    def max_tool_calls(self) -> int | None:
        """Calls one turn can hold: harmony stops at the first `<|call|>`; Llama 3.1's JSON form is
        one call per reply."""
        return 1 if self.tool_format in ("harmony", "llama3-json") else None

    @property
    def needs_mapping_arguments(self) -> bool:
        """The format renders arguments key by key (the template needs a mapping, not a string)."""
        return self.tool_format == "glm-xml"

    def describe(self) -> str:
        ends = ", ".join(self.end_tokens) if self.end_tokens else "none (the next role token ends the turn)"
        return f"reasoning {self.reasoning}; end tokens {ends}; tool calls {self.tool_format}"

    def to_json(self) -> dict[str, Any]:
        return {
            "reasoning": self.reasoning,
            "end_tokens": list(self.end_tokens),
            "tool_format": self.tool_format,
            "detected": self.detected,
        }


def _render(
    renderer: Any, messages: Sequence[Mapping[str, Any]], tools: Any = None, gen: bool = False
) -> str:
    try:
        return renderer.render_text(messages, tools, gen)
    except Exception:  # a template that cannot render a probe tells nothing about it
        return ""


def _added_tokens(tokenizer: Any) -> list[str]:
    return [token for token in tokenizer.get_added_vocab() if token.strip()]


def _first_token(text: str, tokens: Sequence[str]) -> str | None:
    best: tuple[int, int, str] | None = None
    for token in tokens:
        at = text.find(token)
        if at >= 0 and (best is None or (at, -len(token)) < best[:2]):
            best = (at, -len(token), token)
    return best[2] if best else None


def _probe_call(arguments: Any) -> dict[str, Any]:
    return {
        "id": "rl360call",
        "type": "function",
        "function": {"name": PROBE_TOOL_NAME, "arguments": arguments},
    }


def detect_tool_format(renderer: Any) -> str:
    """The tool-call format the template renders for an assistant tool call."""
    user = [{"role": "user", "content": _PROBE_USER}]
    texts = []
    for arguments in ({"arg": "v"}, '{"arg": "v"}'):
        message = {"role": "assistant", "content": "", "tool_calls": [_probe_call(arguments)]}
        texts.append(_render(renderer, [*user, message], [_PROBE_TOOL]))
    text = next((t for t in texts if PROBE_TOOL_NAME in t), "")
    head = _render(renderer, user, [_PROBE_TOOL], True)
    tail = text[len(head) :] if text.startswith(head) else text[text.find(_PROBE_USER) + 1 :]
    for name, markers in _FORMAT_MARKERS:
        if any(marker in tail for marker in markers):
            return name
    if f'"name": "{PROBE_TOOL_NAME}"' in tail and '"parameters"' in tail:
        return "llama3-json"
    return "none"


def detect_reasoning(renderer: Any) -> str:
    tokenizer = renderer.tokenizer
    vocab = set(_added_tokens(tokenizer))
    template = renderer.chat_template
    if "<|channel|>" in vocab and "analysis" in template:
        return "harmony"
    if THINK_CLOSE in template and (THINK_CLOSE in vocab or not vocab):
        return "think"
    return "none"


def detect_end_tokens(renderer: Any, reasoning: str) -> tuple[str, ...]:
    """The tokens that end a turn: harmony's three; else the first added token the template renders
    after an assistant's content in a turn that is not the last; `()` when that token is the next
    message's role token (it starts the user message too); else the eos token."""
    tokenizer = renderer.tokenizer
    added = _added_tokens(tokenizer)
    if reasoning == "harmony":
        return tuple(token for token in HARMONY_END_TOKENS if token in added)
    messages = [
        {"role": "user", "content": _PROBE_USER},
        {"role": "assistant", "content": PROBE_CONTENT},
        {"role": "user", "content": _PROBE_NEXT},
    ]
    text = _render(renderer, messages)
    if PROBE_CONTENT in text and _PROBE_NEXT in text:
        tail = text[text.index(PROBE_CONTENT) + len(PROBE_CONTENT) : text.index(_PROBE_NEXT)]
        token = _first_token(tail, added)
        if token is not None:
            others = tail.replace(token, "", 1)
            if _first_token(others, added) is None:
                return ()  # the only token before the next message's text is that message's role token
            return (token,)
    if tokenizer.eos_token:
        return (tokenizer.eos_token,)
    raise ValueError("cannot tell which token ends an assistant turn; pass end_token explicitly")


PROBE_REASONING = "\u2063rl360-reasoning\u2063"


def detect_think_layout(renderer: Any) -> tuple[str, str]:
    """The text the template puts around the reasoning: the opener (`<think>`, or with leading
    whitespace: GLM's "\n<think>") and the closer (`</think>` with the separator the template puts
    before the content: Qwen3's "</think>\n\n"). Whitespace inside the tags belongs to the
    reasoning."""
    user = [{"role": "user", "content": _PROBE_USER}]
    message = {"role": "assistant", "content": PROBE_CONTENT, "reasoning_content": PROBE_REASONING}
    head = _render(renderer, user, None, True)
    text = _render(renderer, [*user, message])
    opener, closer = THINK_OPEN, THINK_CLOSE
    if head and text.startswith(head) and PROBE_REASONING in text and PROBE_CONTENT in text:
        lead = text[len(head) : text.index(PROBE_REASONING)]
        if lead.rstrip().endswith(THINK_OPEN):
            candidate = lead[: lead.rindex(THINK_OPEN) + len(THINK_OPEN)]
            if not candidate[: -len(THINK_OPEN)].strip():
                opener = candidate
        between = text[text.index(PROBE_REASONING) + len(PROBE_REASONING) : text.index(PROBE_CONTENT)]
        if THINK_CLOSE in between and not between[between.index(THINK_CLOSE) + len(THINK_CLOSE) :].strip():
            closer = between[between.index(THINK_CLOSE) :]
    return opener, closer


def detect_emission(renderer: Any) -> Emission:
    """Emission facts read off the renderer's template and its tokenizer's special tokens."""
    reasoning = detect_reasoning(renderer)
    opener, closer = detect_think_layout(renderer) if reasoning == "think" else (THINK_OPEN, THINK_CLOSE)
    return Emission(
        reasoning=reasoning,
        end_tokens=detect_end_tokens(renderer, reasoning),
        tool_format=detect_tool_format(renderer),
        think_open=opener,
        think_close=closer,
    )


def parse_emission_override(
    detected: Emission,
    tokenizer: Any,
    reasoning: str | None = None,
    end_tokens: Sequence[str] | None = None,
    tool_format: str | None = None,
) -> Emission:
    """`detected` with the given facts replaced; ValueError (naming the option) on a bad value:
    an unknown mode or format, or an end token that is not a single token of the tokenizer."""
    if reasoning is not None and reasoning not in REASONING_MODES:
        raise ValueError(f"--reasoning {reasoning!r}: choose one of {', '.join(REASONING_MODES)}")
    if tool_format is not None and tool_format not in TOOL_FORMATS:
        raise ValueError(f"--tool-format {tool_format!r}: choose one of {', '.join(TOOL_FORMATS)}")
    ends: tuple[str, ...] | None = None
    if end_tokens:
        if list(end_tokens) == ["none"]:
            ends = ()
        else:
            for token in end_tokens:
                if token == "none":
                    raise ValueError("--end-token none: cannot be combined with other end tokens")
                ids = tokenizer.encode(token, add_special_tokens=False)
                if len(ids) != 1 or tokenizer.decode(ids, skip_special_tokens=False) != token:
                    raise ValueError(
                        f"--end-token {token!r}: not a token of this tokenizer (it encodes to {len(ids)} "
                        "tokens); pass a special token the model samples to end its turn, or 'none'"
                    )
            ends = tuple(end_tokens)
    changes: dict[str, Any] = {}
    if reasoning is not None:
        changes["reasoning"] = reasoning
    if ends is not None:
        changes["end_tokens"] = ends
    if tool_format is not None:
        changes["tool_format"] = tool_format
    return replace(detected, detected=False, **changes) if changes else detected


def next_role_tokens(renderer: Any) -> tuple[str, ...]:
    """The role tokens that start the message after an assistant turn (a user message, a tool
    result): where the next role token ends the turn (`end_tokens == ()`), the model stops by
    sampling one of them."""
    added = _added_tokens(renderer.tokenizer)
    user = {"role": "user", "content": _PROBE_USER}
    plain = {"role": "assistant", "content": PROBE_CONTENT}
    call = {"role": "assistant", "content": "", "tool_calls": [_probe_call({"arg": "v"})]}
    result = {"role": "tool", "tool_call_id": "rl360call", "content": _PROBE_NEXT}
    found: list[str] = []
    for history, after, tools in (
        ([user, plain], {"role": "user", "content": _PROBE_NEXT}, None),
        ([user, call], result, [_PROBE_TOOL]),
    ):
        base, longer = _render(renderer, history, tools), _render(renderer, [*history, after], tools)
        token = _first_token(longer[len(base) :], added) if base and longer.startswith(base) else None
        if token is not None and token not in found:
            found.append(token)
    return tuple(found)
