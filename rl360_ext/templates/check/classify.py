"""The append-only checker's vocabulary and judgement: the properties and kinds of violation (with
why each happens and how to fix the template), one failing comparison (`Mismatch`), and reading a
violation's kind from the evidence in the two token streams (`_classify`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rl360_ext.templates.emission import (
    THINK_CLOSE,
    THINK_OPEN,
)
from rl360_ext.templates.parse import ParsedAssistant
from rl360_ext.templates.render import ChatRenderer

Message = dict[str, Any]

PREFIX = "prefix"
GENERATION = "generation"
LOOP_POSITION = "loop-position-branch"
AFTER_END = "text-after-end-token"
REASONING_DROPPED = "earlier-reasoning-dropped"
TOOL_CALL_RESERIALIZED = "tool-call-reserialization"
GENERATION_PROMPT = "generation-prompt-mismatch"
TOOL_CALLS_NOT_PARSED = "tool-call-format-not-parsed"
RENDER_ERROR = "render-error"
TOKEN_BOUNDARY = "token-boundary"
CONTENT_REWRITTEN = "content-rewritten"
REASONING_REWRITTEN = "reasoning-rewritten"
END_TOKEN_REWRITTEN = "end-token-rewritten"
UNCLASSIFIED = "unclassified"


@dataclass(frozen=True)
class KindInfo:
    title: str
    why: str
    fix: str


KINDS: dict[str, KindInfo] = {
    LOOP_POSITION: KindInfo(
        "a message renders differently depending on what follows it",
        "the template branches on a message's position (loop.last, loop.index, look-ahead at the next "
        "message): the assistant turn rendered as the last message (what the model generated) is not "
        "what the template renders once more messages follow it",
        "render every message the same way wherever it stands; keep position-dependent text in the "
        "generation prompt only",
    ),
    AFTER_END: KindInfo(
        "text after the end-of-turn token that the model never generates",
        "the template renders text after the end-of-turn token (e.g. a newline); the model's turn ends "
        "at that token, so the session's held tokens lack this text and the model sees a different "
        "context than the template's",
        "emit the separator before the next turn's start token instead of after the end token (see the "
        "fixed templates: rl360 template fixed)",
    ),
    REASONING_DROPPED: KindInfo(
        "earlier turns' reasoning is dropped",
        "the template stops rendering an assistant turn's reasoning once later messages arrive, but the "
        "session holds the reasoning tokens the model generated",
        "render reasoning_content for every assistant turn that carries it",
    ),
    TOOL_CALL_RESERIALIZED: KindInfo(
        "tool-call arguments are re-serialized",
        "the model emitted the arguments as JSON text and the agent echoes that same string back, but the "
        "template renders it differently (e.g. `arguments | tojson` applied to a string)",
        "render string arguments verbatim: {% if arguments is string %}{{ arguments }}{% else %}"
        "{{ arguments | tojson }}{% endif %}",
    ),
    GENERATION_PROMPT: KindInfo(
        "the assistant's render does not start with the generation prompt",
        "the model was prompted with the generation prompt, but the template renders the same assistant "
        "turn with a different opening (e.g. the newline after the role only when content is non-empty)",
        "make the assistant header identical to the generation prompt for every message",
    ),
    TOOL_CALLS_NOT_PARSED: KindInfo(
        "the session's parser does not recover this template's tool calls",
        'generated tool calls are not in the <tool_call>{"name": ..., "arguments": ...}</tool_call> '
        "form the session server parses, so the agent would receive them as text",
        "use a Hermes-style (<tool_call> JSON) template for this model, or extend rl360_ext.templates.parse",
    ),
    RENDER_ERROR: KindInfo(
        "the template raised an error",
        "the template cannot render a conversation agents send (system prompt, tools, tool results, ...)",
        "support system, user, assistant (reasoning_content, tool_calls) and tool messages",
    ),
    CONTENT_REWRITTEN: KindInfo(
        "the reply's content is rendered differently",
        "the agent echoes the content the model emitted, but the template renders it changed (stripped, "
        "trimmed, split at a think tag), so the held tokens are not what the template renders",
        "render content verbatim",
    ),
    REASONING_REWRITTEN: KindInfo(
        "the reply's reasoning is rendered differently",
        "the agent echoes the reasoning the model emitted, but the template renders it changed (e.g. "
        "stripped of its leading newline)",
        "render reasoning_content verbatim",
    ),
    END_TOKEN_REWRITTEN: KindInfo(
        "the turn's end token is replaced once more messages follow",
        "the model ended its turn with one end token (e.g. harmony's <|return|>) and the template renders "
        "another one (<|end|>) for the same turn in history",
        "render the end token the model sampled; where the model was trained on the other one, the family "
        "cannot be made append-only without changing what it saw in training",
    ),
    UNCLASSIFIED: KindInfo(
        "the session's tokens differ from the template's render (no kind proven)",
        "no evidence names the cause; the evidence line shows where the two texts differ",
        "inspect the two texts at the first difference",
    ),
    TOKEN_BOUNDARY: KindInfo(
        "same text, different tokens at a boundary",
        "pieces tokenized alone tokenize differently from the whole text around a boundary",
        "end every piece the session tokenizes alone with a special token",
    ),
}


@dataclass
class Mismatch:
    """One property failing on one conversation, with the two token streams compared and the
    evidence its kind was read from."""

    property: str
    kind: str
    turn: int
    detail: str
    server_ids: list[int]
    canonical_ids: list[int]
    server_text: str
    canonical_text: str
    evidence: str = ""


@dataclass
class _Generated:
    """What the replay knows about one generated assistant turn."""

    turn: int
    request_text: str
    request_ids: list[int]
    text: str
    ids: list[int]
    trailer: str
    end_token: str | None
    parsed: ParsedAssistant
    history: list[Message] = field(default_factory=list)
    echo: Message | None = None
    following: list[Message] = field(default_factory=list)


def _first_difference(a: Sequence[Any], b: Sequence[Any]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _short(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _count_evidence(what: str, needle: str, server_text: str, canonical_text: str) -> str | None:
    held, rendered = server_text.count(needle), canonical_text.count(needle)
    if needle.strip() and held > rendered:
        return (
            f"{what} {_short(needle)} is in the session's tokens {held}x, "
            f"in the template's render {rendered}x"
        )
    return None


def _classify(
    renderer: ChatRenderer,
    server_text: str,
    canonical_text: str,
    generated: Sequence[_Generated],
    tools: Any,
) -> tuple[str, str]:
    """The violation's kind and the evidence it was read from (`generated`: every generated turn
    up to the one checked). "unclassified" when no evidence names a kind."""
    at = _first_difference(server_text, canonical_text)
    for g in generated:
        ended = g.end_token and g.trailer and server_text[:at].endswith(g.end_token)
        if ended and canonical_text[at:].startswith(g.trailer):
            return AFTER_END, (
                f"the session's tokens end turn {g.turn} at {g.end_token!r}; the template renders "
                f"{_short(g.trailer)} after it"
            )
    for g in generated:
        if not g.end_token:
            continue
        start = server_text.rfind(g.end_token, 0, at + len(g.end_token))
        if start < 0 or not start <= at <= start + len(g.end_token):
            continue
        for other in renderer.emission.end_tokens:
            if other != g.end_token and canonical_text[start:].startswith(other):
                return END_TOKEN_REWRITTEN, (
                    f"turn {g.turn} ended with {g.end_token!r} as sampled; the template renders "
                    f"{other!r} there once more messages follow"
                )
    for g in generated:
        reasoning = _reasoning_block(g)
        evidence = _count_evidence(f"turn {g.turn}'s reasoning", reasoning, server_text, canonical_text)
        if evidence:
            return REASONING_DROPPED, evidence
    for g in generated:
        for call in g.parsed.tool_calls:
            arguments = call["function"]["arguments"]
            evidence = _count_evidence(
                f"turn {g.turn}'s tool-call arguments", arguments, server_text, canonical_text
            )
            if evidence:
                return TOOL_CALL_RESERIALIZED, evidence
    for g in generated:
        evidence = _count_evidence(f"turn {g.turn}'s content", g.parsed.content, server_text, canonical_text)
        if evidence:
            return CONTENT_REWRITTEN, evidence
    for g in generated:
        found = _echo_evidence(renderer, g, tools)
        if found:
            return found
    around = slice(max(0, at - 20), at + 20)
    return UNCLASSIFIED, (
        f"first difference at character {at}: session {_short(server_text[around], 60)} vs "
        f"template {_short(canonical_text[around], 60)}"
    )


def _reasoning_block(g: _Generated) -> str:
    """Turn g's reasoning with the markers around it as the model emitted them ("" if none)."""
    reasoning = g.parsed.reasoning
    if reasoning == "":
        empty = next((b for b in (THINK_OPEN + THINK_CLOSE, "analysis<|message|><|end|>") if b in g.text), "")
        return empty
    at = g.text.find(reasoning) if reasoning is not None else -1
    if reasoning is None or at < 0:
        return ""
    before, after = g.text[:at], g.text[at + len(reasoning) :]
    opening = next((m for m in (THINK_OPEN, "<|message|>") if before.endswith(m)), "")
    closing = next((m for m in (THINK_CLOSE, "<|end|>") if after.startswith(m)), "")
    return opening + reasoning + closing


def _echo_evidence(renderer: ChatRenderer, g: _Generated, tools: Any) -> tuple[str, str] | None:
    """What the template does with the echoed message: it does not reproduce the model's turn even
    as the last message (content rewritten, or unclassified), or it does, and renders the same
    message differently once a message follows it (two renders that differ only by position)."""
    if g.echo is None:
        return None
    alone = [*g.history, g.echo]
    followed = [*alone, *(g.following or [{"role": "user", "content": "\u2063rl360-next\u2063"}])]
    try:
        last = renderer.render_text(alone, tools)
        not_last = renderer.render_text(followed, tools)
    except Exception:  # the evidence needs both renders
        return None
    body = g.text[: -len(g.end_token)] if g.end_token else g.text
    emitted = g.request_text + body
    if not last.startswith(g.request_text):
        at = _first_difference(g.request_text, last)
        return GENERATION_PROMPT, (
            f"turn {g.turn} was generated after the prompt {_short(g.request_text[max(0, at - 10) :])}; "
            f"its render has {_short(last[max(0, at - 10) : at + 30])}"
        )
    if not last.startswith(emitted):
        at = _first_difference(emitted, last)
        evidence = (
            f"turn {g.turn} as the last message renders {_short(last[at : at + 30])} "
            f"where the model emitted {_short(emitted[at : at + 30])}"
        )
        fields = [(REASONING_REWRITTEN, g.parsed.reasoning), (CONTENT_REWRITTEN, g.parsed.content)]
        fields += [(TOOL_CALL_RESERIALIZED, call["function"]["arguments"]) for call in g.parsed.tool_calls]
        for kind, field_text in fields:
            start = emitted.find(field_text, len(g.request_text)) if field_text else -1
            if start >= 0 and start <= at <= start + len(field_text):
                return kind, f"{evidence} (inside {_short(field_text)})"
        return UNCLASSIFIED, evidence
    if (
        g.end_token
        and not_last.startswith(emitted + g.end_token)
        and not last.startswith(emitted + g.end_token)
    ):
        return LOOP_POSITION, (
            f"turn {g.turn}'s message renders without the end token {g.end_token!r} the model sampled when "
            f"it is the last message ({_short(last[len(emitted) :])}) and with it when a message follows"
        )
    if not_last.startswith(last):
        return None
    at = _first_difference(last, not_last)
    return LOOP_POSITION, (
        f"turn {g.turn}'s message renders as {_short(last[at : at + 30])} when it is the last message and "
        f"as {_short(not_last[at : at + 30])} when a message follows it"
    )
