"""The append-only checker: proves or refutes, for one tokenizer and chat template, that the session
server's token-in/token-out stream equals the tokenization of the canonical render.

Owns the replay of generated conversations exactly as the session server handles them (first
prompt through `ChatRenderer.prompt_ids`; the model's turn = the tokens of the template's own render
of that assistant message after the generation prompt, through the end-of-turn token; the reply
parsed with `ChatRenderer.parse_assistant` and echoed back by the agent; each later batch of
messages through `ChatRenderer.suffix_ids`), the two properties checked on it, the classification
of violations, shrinking to the smallest failing conversation, and the report (`CheckReport`:
human summary and JSON). It does not own rendering (`render.py`), conversation generation
(`conversations.py`) or template selection (`select.py`).

Properties, for a conversation and each generated assistant turn k:
- prefix: tokens(request k) + generated_k + suffix_ids(history, new messages) ==
  tokens(render(history + new messages, generation prompt)) at every split point;
- generation: the reply's render starts with the generation prompt, the session's parser recovers
  the tool calls, and generated_k appears verbatim in the tokens of every later request's render
  and of the final conversation's render.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import jinja2

from rl360_ext.templates.conversations import Conversation, Turn, generate_conversations, shrink_candidates
from rl360_ext.templates.emission import (
    PROBE_CONTENT,
    PROBE_REASONING,
    THINK_CLOSE,
    THINK_OPEN,
    Emission,
    parse_emission_override,
)
from rl360_ext.templates.parse import ParsedAssistant
from rl360_ext.templates.render import ChatRenderer, TemplateNotAppendOnlyError, mapping_arguments

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
_CONTEXT_TOKENS = 6
_CONTEXT_CHARS = 48


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


@dataclass
class CaseResult:
    """The replay of one conversation: its violations (first per property and kind) and notes."""

    mismatches: list[Mismatch] = field(default_factory=list)
    notes: list[Mismatch] = field(default_factory=list)
    split_points: int = 0
    generated_turns: int = 0

    def add(self, mismatch: Mismatch, note: bool = False) -> None:
        target = self.notes if note else self.mismatches
        if all((m.property, m.kind) != (mismatch.property, mismatch.kind) for m in target):
            target.append(mismatch)


def _first_difference(a: Sequence[Any], b: Sequence[Any]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _contains(haystack: Sequence[int], needle: Sequence[int]) -> bool:
    if not needle:
        return True
    first, size = needle[0], len(needle)
    return any(
        haystack[i] == first and list(haystack[i : i + size]) == list(needle)
        for i in range(len(haystack) - size + 1)
    )


def find_end_token(renderer: ChatRenderer) -> str:
    """The (first) token that ends an assistant turn, as `Emission.end_tokens` detects it: the
    first added token the template renders after an assistant's content in a turn that is not the
    last, else the tokenizer's eos token. Raises ValueError for a template whose turns end at the
    next role token (`end_tokens == ()`)."""
    ends = renderer.emission.end_tokens
    if not ends:
        raise ValueError("the template has no end-of-turn token: the next role token ends the turn")
    return ends[0]


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


def _echo(parsed: ParsedAssistant, original: Message) -> Message:
    """The message the agent sends back: the parsed reply, tool-call ids as the original's."""
    message = parsed.to_message()
    for call, source in zip(message.get("tool_calls") or [], original.get("tool_calls") or [], strict=False):
        call["id"] = source.get("id", call["id"])
    return message


class _RenderFailed(Exception):
    """The template raised while rendering (the cause is chained)."""


def _rendering(function: Any, *args: Any) -> Any:
    """Call a rendering function; an error raised by the template becomes `_RenderFailed`."""
    try:
        return function(*args)
    except TemplateNotAppendOnlyError:
        raise
    except Exception as exc:  # templates raise anything: TemplateError, TypeError, KeyError, ...
        raise _RenderFailed from exc


def _call_names(calls: Sequence[Mapping[str, Any]] | None) -> list[str]:
    return [(call.get("function") or call).get("name", "") for call in calls or []]


def _text_of(content: Any) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


def fit_to_emission(conversation: Conversation, emission: Emission) -> Conversation:
    """The conversation as this family can produce it: at most `emission.max_tool_calls` calls per
    generated turn (harmony stops at `<|call|>`), the dropped calls' results removed."""
    limit = emission.max_tool_calls
    if limit is None or all(len(t.assistant.get("tool_calls") or []) <= limit for t in conversation.turns):
        return conversation
    turns = []
    for turn in conversation.turns:
        calls = turn.assistant.get("tool_calls") or []
        if len(calls) <= limit:
            turns.append(turn)
            continue
        kept = {call.get("id") for call in calls[:limit]}
        assistant = {**turn.assistant, "tool_calls": calls[:limit]}
        new = [m for m in turn.new_messages if m.get("role") != "tool" or m.get("tool_call_id") in kept]
        turns.append(Turn(assistant, new))
    return Conversation(conversation.prompt, turns, conversation.tools)


class _Replay:
    """Replays one conversation through the session server's rendering calls, with the model's
    turns built from what the family emits (`renderer.emission`)."""

    def __init__(self, renderer: ChatRenderer, conversation: Conversation) -> None:
        self.renderer = renderer
        self.emission = renderer.emission
        self.conversation = fit_to_emission(conversation, self.emission)
        self.tools = conversation.tools
        self.result = CaseResult()
        self.generated: list[_Generated] = []
        self.later: list[tuple[int, str, list[int]]] = []  # renders containing turn k: (k, text, ids)

    def render(self, messages: Sequence[Message], generation_prompt: bool) -> str:
        return _rendering(self.renderer.render_text, messages, self.tools, generation_prompt)

    def run(self) -> CaseResult:
        try:
            self._turns()
        except _RenderFailed as failed:
            cause = failed.__cause__
            detail = f"turn {len(self.generated)}: {type(cause).__name__}: {cause}"
            self.result.add(
                Mismatch(GENERATION, RENDER_ERROR, len(self.generated), detail, [], [], "", "", str(cause))
            )
        self._generation_property()
        return self.result

    def _turns(self) -> None:
        conversation = self.conversation
        history = list(conversation.prompt)
        request_text = self.render(history, True)
        request_ids = _rendering(self.renderer.prompt_ids, history, self.tools)
        for k, turn in enumerate(conversation.turns):
            generated = self._generate(k, turn.assistant, history, request_text, request_ids)
            echo = (
                _echo(generated.parsed, turn.assistant)
                if self._parsed_ok(generated, turn.assistant)
                else turn.assistant
            )
            generated.history, generated.echo = list(history), echo
            generated.following = list(turn.new_messages)
            history.append(echo)
            if not turn.new_messages:
                final_text = self.render(history, False)
                self.later.append((k, final_text, self.renderer.encode(final_text)))
                continue
            self.result.split_points += 1
            expected_text = self.render([*history, *turn.new_messages], True)
            expected_ids = self.renderer.encode(expected_text)
            self._prefix_property(k, generated, history, turn.new_messages, expected_text, expected_ids)
            self.later.append((k, expected_text, expected_ids))
            history.extend(turn.new_messages)
            request_text, request_ids = expected_text, expected_ids

    def _probe_message(self, assistant: Message, reasoning: str | None) -> Message:
        content = assistant.get("content")
        probe: Message = {"role": "assistant", "content": PROBE_CONTENT if _text_of(content) else content}
        if reasoning is not None:
            probe["reasoning_content"] = PROBE_REASONING
        if assistant.get("tool_calls"):
            probe["tool_calls"] = [mapping_arguments(call) for call in assistant["tool_calls"]]
        return probe

    def _with_reasoning(self, request_text: str, rest: str, reasoning: str | None, prompted: bool) -> str:
        """The template's render of the turn (`rest`, after the generation prompt) with the
        reasoning block where the model emits it, whether or not the template renders it."""
        mode = self.emission.reasoning
        opened = mode == "think" and request_text.rstrip(" \n").endswith(THINK_OPEN)
        if opened and PROBE_REASONING in rest:
            return rest
        if opened:  # the prompt opened the block: the model writes the reasoning and closes it
            body = PROBE_REASONING if reasoning is not None else ""
            return body + (rest if rest.lstrip().startswith(THINK_CLOSE) else f"\n{THINK_CLOSE}\n\n" + rest)
        if reasoning is None or mode == "none" or PROBE_REASONING in rest:
            return rest
        if mode == "think":
            if request_text.rstrip(" \n").endswith(THINK_CLOSE):
                return rest  # the prompt closed an empty block: thinking is off
            empty = THINK_OPEN + THINK_CLOSE
            if empty in rest:
                return rest.replace(empty, THINK_OPEN + PROBE_REASONING + THINK_CLOSE, 1)
            if not prompted:
                return rest  # no generation prompt: the model continues its turn (after tool outputs)
            return self.emission.think_open + PROBE_REASONING + THINK_CLOSE + rest
        return f"<|channel|>analysis<|message|>{PROBE_REASONING}<|end|><|start|>assistant" + rest

    def _cut(self, emitted: str, assistant: Message) -> tuple[str, str, str | None]:
        """The turn as the model emits it: through the first end token after its last field."""
        ends = self.emission.end_tokens
        if not ends:
            return emitted, "", None
        anchor = 0
        markers = (
            PROBE_CONTENT,
            PROBE_REASONING,
            "<|start|>assistant",
            *_call_names(assistant.get("tool_calls")),
        )
        for marker in markers:
            at = emitted.rfind(marker)
            if at >= 0:
                anchor = max(anchor, at + len(marker))
        found = [(emitted.find(token, anchor), token) for token in ends if emitted.find(token, anchor) >= 0]
        if not found:  # the template leaves the turn open; the model still samples an end token
            calls = assistant.get("tool_calls") and "<|call|>" in ends
            token = "<|call|>" if calls else ends[0]
            return emitted + token, "", token
        at, token = min(found)
        return emitted[: at + len(token)], emitted[at + len(token) :], token

    def _generate(
        self, k: int, assistant: Message, history: list[Message], request_text: str, request_ids: list[int]
    ) -> _Generated:
        """The tokens the model emits for `assistant` (see `Emission`)."""
        reasoning = assistant.get("reasoning_content") if self.emission.reasoning != "none" else None
        if self.emission.reasoning == "think" and request_text.rstrip(" \n").endswith(THINK_CLOSE):
            reasoning = None  # the prompt closed an empty block: thinking is off for this turn
        reply_text = self.render([*history, self._probe_message(assistant, reasoning)], False)
        head = request_text
        if not reply_text.startswith(request_text):
            opened = request_text.rstrip(" \n")
            head = opened[: -len(THINK_OPEN)] if opened.endswith(THINK_OPEN) else request_text
            if not reply_text.startswith(head) or head == request_text:
                at = _first_difference(request_text, reply_text)
                self._generation_prompt_mismatch(k, request_text, request_ids, reply_text, at)
                head = request_text[:at]
            elif head != request_text:
                reply_text = request_text + reply_text[len(head) :]
                head = request_text
        prompted = reasoning is None or self.render(history, False) != request_text
        rest = self._with_reasoning(request_text, reply_text[len(head) :], reasoning, prompted)
        text, trailer, end_token = self._cut(rest, assistant)
        text = text.replace(PROBE_REASONING, reasoning or "").replace(
            PROBE_CONTENT, _text_of(assistant.get("content"))
        )
        body = text[: -len(end_token)] if end_token else text
        parsed = self.renderer.parse_assistant(body)
        generated = _Generated(
            k, request_text, request_ids, text, self.renderer.encode(text), trailer, end_token, parsed
        )
        self.generated.append(generated)
        self.result.generated_turns += 1
        return generated

    def _generation_prompt_mismatch(
        self, k: int, request_text: str, request_ids: list[int], reply_text: str, at: int
    ) -> None:
        detail = (
            f"turn {k}: the render with this assistant message differs from the generation prompt at "
            f"character {at}"
        )
        evidence = (
            f"generation prompt ends {_short(request_text[max(0, at - 10) :])}; the assistant's render has "
            f"{_short(reply_text[max(0, at - 10) : at + 30])}"
        )
        reply_ids = self.renderer.encode(reply_text)
        self.result.add(
            Mismatch(
                GENERATION,
                GENERATION_PROMPT,
                k,
                detail,
                request_ids,
                reply_ids,
                request_text,
                reply_text,
                evidence,
            )
        )

    def _parsed_ok(self, generated: _Generated, assistant: Message) -> bool:
        expected = _call_names(assistant.get("tool_calls"))
        got = _call_names(generated.parsed.tool_calls)
        if got == expected:
            return True
        detail = f"turn {generated.turn}: the model's tool calls {expected} parse as {got}"
        evidence = (
            f"tool-call format {self.emission.tool_format!r}"
            + ("" if self.emission.session_parses_tool_calls else " (the session server does not parse it)")
            + f"; generated {_short(generated.text, 80)}"
        )
        held = generated.request_text + generated.text
        ids = generated.request_ids + generated.ids
        self.result.add(
            Mismatch(
                GENERATION, TOOL_CALLS_NOT_PARSED, generated.turn, detail, ids, ids, held, held, evidence
            )
        )
        return False

    def _prefix_property(
        self,
        k: int,
        generated: _Generated,
        history: list[Message],
        new_messages: list[Message],
        expected_text: str,
        expected_ids: list[int],
    ) -> None:
        held_ids = generated.request_ids + generated.ids
        held_text = generated.request_text + generated.text
        try:
            suffix_ids = _rendering(self.renderer.suffix_ids, history, new_messages, self.tools)
        except TemplateNotAppendOnlyError as exc:
            detail = (
                f"turn {k}: suffix_ids refused (TemplateNotAppendOnlyError): the history's render is not a "
                f"prefix of the conversation's render (first difference at character {exc.position})"
            )
            kind, evidence = _classify(self.renderer, held_text, expected_text, self.generated, self.tools)
            self.result.add(
                Mismatch(PREFIX, kind, k, detail, held_ids, expected_ids, held_text, expected_text, evidence)
            )
            return
        server_ids = held_ids + suffix_ids
        if server_ids == expected_ids:
            return
        server_text = held_text + _rendering(self.renderer.suffix_text, history, new_messages, self.tools)
        if server_text == expected_text:
            at = _first_difference(server_ids, expected_ids)
            start = len(generated.request_ids)
            detail = f"turn {k}: same text, tokens differ at position {at}"
            mismatch = Mismatch(
                PREFIX,
                TOKEN_BOUNDARY,
                k,
                detail,
                server_ids,
                expected_ids,
                server_text,
                expected_text,
                "the same text tokenizes differently in pieces and whole",
            )
            self.result.add(mismatch, note=start - 1 <= at <= start)
            return
        kind, evidence = _classify(self.renderer, server_text, expected_text, self.generated, self.tools)
        detail = f"turn {k}: the session's tokens differ from the render of the conversation"
        self.result.add(
            Mismatch(PREFIX, kind, k, detail, server_ids, expected_ids, server_text, expected_text, evidence)
        )

    def _generation_property(self) -> None:
        for g in self.generated:
            for turn, text, ids in self.later:
                if turn < g.turn:
                    continue
                if _contains(ids, g.ids):
                    continue
                held_ids, held_text = g.request_ids + g.ids, g.request_text + g.text
                if g.text in text:
                    detail = f"turn {g.turn}: generated text is in the render, its tokens are not"
                    mismatch = Mismatch(
                        GENERATION,
                        TOKEN_BOUNDARY,
                        g.turn,
                        detail,
                        held_ids,
                        ids,
                        held_text,
                        text,
                        "the generated text is in the render; its tokens are not",
                    )
                    self.result.add(mismatch, note=True)
                    continue
                window = text[: len(held_text) + 200] if text.startswith(g.request_text) else text
                kind, evidence = _classify(
                    self.renderer, held_text, window, self.generated[: g.turn + 1], self.tools
                )
                detail = f"turn {g.turn}: the model's tokens do not appear in the render after turn {turn}"
                self.result.add(
                    Mismatch(GENERATION, kind, g.turn, detail, held_ids, ids, held_text, text, evidence)
                )
                break


def check_conversation(
    renderer: ChatRenderer, conversation: Conversation, end_token: str | None = None
) -> CaseResult:
    """Replay one conversation and check both properties on it (`end_token`: an override of the
    renderer's detected end tokens)."""
    if end_token is not None and renderer.emission.end_tokens != (end_token,):
        renderer.use_emission(replace(renderer.emission, end_tokens=(end_token,), detected=False))
    return _Replay(renderer, conversation).run()


# ---- report ------------------------------------------------------------------------------------


@dataclass
class TokenContext:
    """Tokens around the first difference, each as (id, decoded text)."""

    before: list[tuple[int, str]]
    after: list[tuple[int, str]]

    def to_json(self) -> dict[str, Any]:
        return {
            "before": [{"id": i, "text": t} for i, t in self.before],
            "after": [{"id": i, "text": t} for i, t in self.after],
        }

    def line(self) -> str:
        def show(tokens: list[tuple[int, str]]) -> str:
            return " ".join(repr(t) for _, t in tokens)

        return f"{show(self.before)} ▏ {show(self.after)}".strip()


@dataclass
class Violation:
    """One kind of violation of one property, on the smallest failing conversation found."""

    property: str
    kind: str
    detail: str
    cases: int
    conversation: Conversation
    turn: int
    token_position: int | None
    server: TokenContext
    canonical: TokenContext
    server_text: tuple[str, str]
    canonical_text: tuple[str, str]
    evidence: str = ""

    @property
    def info(self) -> KindInfo:
        return KINDS[self.kind]

    def to_json(self) -> dict[str, Any]:
        return {
            "property": self.property,
            "kind": self.kind,
            "title": self.info.title,
            "why": self.info.why,
            "fix": self.info.fix,
            "detail": self.detail,
            "evidence": self.evidence,
            "cases": self.cases,
            "conversation": self.conversation.to_json(),
            "turn": self.turn,
            "token_position": self.token_position,
            "server_tokens": self.server.to_json(),
            "canonical_tokens": self.canonical.to_json(),
            "server_text": {"before": self.server_text[0], "after": self.server_text[1]},
            "canonical_text": {"before": self.canonical_text[0], "after": self.canonical_text[1]},
        }


def _token_context(tokenizer: Any, ids: list[int], at: int) -> TokenContext:
    def decoded(span: list[int]) -> list[tuple[int, str]]:
        return [(i, tokenizer.decode([i], skip_special_tokens=False)) for i in span]

    return TokenContext(
        decoded(ids[max(0, at - _CONTEXT_TOKENS) : at]), decoded(ids[at : at + _CONTEXT_TOKENS])
    )


def _text_context(text: str, at: int) -> tuple[str, str]:
    return text[max(0, at - _CONTEXT_CHARS) : at], text[at : at + _CONTEXT_CHARS]


def _violation(tokenizer: Any, mismatch: Mismatch, conversation: Conversation, cases: int) -> Violation:
    has_ids = bool(mismatch.server_ids or mismatch.canonical_ids)
    at = _first_difference(mismatch.server_ids, mismatch.canonical_ids) if has_ids else None
    chars = _first_difference(mismatch.server_text, mismatch.canonical_text)
    return Violation(
        property=mismatch.property,
        kind=mismatch.kind,
        detail=mismatch.detail,
        cases=cases,
        conversation=conversation,
        turn=mismatch.turn,
        token_position=at,
        server=_token_context(tokenizer, mismatch.server_ids, at or 0),
        canonical=_token_context(tokenizer, mismatch.canonical_ids, at or 0),
        server_text=_text_context(mismatch.server_text, chars),
        canonical_text=_text_context(mismatch.canonical_text, chars),
        evidence=mismatch.evidence,
    )


def _describe(message: Message, generated: bool) -> str:
    role = message.get("role", "?") + (" (generated)" if generated else "")
    parts = []
    content = message.get("content")
    if isinstance(content, list):
        parts.append("content parts " + repr([p.get("text") for p in content if isinstance(p, dict)]))
    else:
        parts.append(repr(content))
    if message.get("reasoning_content") is not None:
        parts.append(f"reasoning={message['reasoning_content']!r}")
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or call
        parts.append(f"tool_call {fn.get('name')}({fn.get('arguments')!r})")
    line = f"{role}: " + ", ".join(parts)
    return line if len(line) <= 160 else line[:157] + "..."


@dataclass
class CheckReport:
    """The checker's verdict for one template: `ok`, the violations, notes, and what was checked."""

    template: str
    emission: Emission
    cases: int
    seed: int
    split_points: int
    generated_turns: int
    violations: list[Violation]
    notes: list[Violation]
    elapsed_s: float
    incremental: bool = False  # suffixes render after an anchor (`ChatRenderer.incremental`)

    @property
    def end_token(self) -> str:
        """The first end token ("none": the next role token ends the turn)."""
        return self.emission.end_tokens[0] if self.emission.end_tokens else "none"

    @property
    def warnings(self) -> list[str]:
        if self.split_points == 0:
            return [
                "0 split points checked: no conversation reached a second request, so the prefix property "
                "was never tested and nothing is proven (a conversation's replay stops at a render error)"
            ]
        return []

    @property
    def ok(self) -> bool:
        """No violation, and at least one split point checked (an empty run proves nothing)."""
        return not self.violations and self.split_points > 0

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "template": self.template,
            "end_token": self.end_token,
            "emission": self.emission.to_json(),
            "warnings": self.warnings,
            "cases": self.cases,
            "seed": self.seed,
            "split_points": self.split_points,
            "generated_turns": self.generated_turns,
            "elapsed_s": round(self.elapsed_s, 3),
            "incremental_suffix": self.incremental,
            "violations": [v.to_json() for v in self.violations],
            "notes": [n.to_json() for n in self.notes],
        }

    def json_text(self) -> str:
        return json.dumps(self.to_json(), indent=2, ensure_ascii=False)

    def summary(self) -> str:
        source = "detected" if self.emission.detected else "given"
        lines = [
            f"chat template: {self.template}",
            f"model emits ({source}): {self.emission.describe()}",
            f"checked {self.cases} conversations (seed {self.seed}): {self.split_points} split points, "
            f"{self.generated_turns} generated turns in {self.elapsed_s:.2f} s",
        ]
        lines += [f"WARNING: {warning}" for warning in self.warnings]
        if self.ok:
            lines.append("OK: append-only. The prefix and generation properties hold on every conversation.")
        elif self.violations:
            lines.append(f"NOT APPEND-ONLY: {len(self.violations)} kind(s) of violation")
        else:
            lines.append("NOT PROVEN: no violation found, but nothing was checked")
        for number, violation in enumerate(self.violations, 1):
            lines.extend(_violation_lines(number, violation, self.cases))
        for note in self.notes:
            lines.append(
                f"note [{note.property} property] {note.info.title} in {note.cases} conversation(s), at "
                "the start of a generated turn: the model samples its first tokens after the prompt's last "
                "token, so they can differ from tokenizing prompt and reply together (e.g. '\\n' '\\n' vs "
                "'\\n\\n'). The session never re-tokenizes, so this is not a violation; a re-tokenizing "
                "pipeline would train on other tokens here."
            )
        return "\n".join(lines)


def _tool_names(conversation: Conversation) -> str:
    if not conversation.tools:
        return "none"
    return ", ".join(str((tool.get("function") or tool).get("name")) for tool in conversation.tools)


def _violation_lines(number: int, v: Violation, cases: int) -> list[str]:
    conversation = v.conversation
    first = conversation.to_json()["first_generated_index"]
    generated = {
        first + sum(1 + len(t.new_messages) for t in conversation.turns[:i])
        for i in range(len(conversation.turns))
    }
    lines = [
        "",
        f"{number}. [{v.property} property] {v.kind}: {v.info.title}",
        f"   seen in {v.cases} of {cases} conversations; {v.detail}",
        f"   smallest failing conversation (tools: {_tool_names(conversation)}):",
    ]
    for i, message in enumerate(conversation.messages()):
        lines.append(f"     [{i}] {_describe(message, i in generated)}")
    if v.token_position is not None:
        lines += [
            f"   first differing token at position {v.token_position}:",
            f"     session holds   : {v.server.line()}",
            f"     template renders: {v.canonical.line()}",
        ]
    if any(v.server_text) or any(v.canonical_text):
        lines += [
            f"   text: session {v.server_text[0][-24:]!r} ▏ {v.server_text[1][:24]!r}",
            f"         template {v.canonical_text[0][-24:]!r} ▏ {v.canonical_text[1][:24]!r}",
        ]
    if v.evidence:
        lines.append(f"   evidence: {v.evidence}")
    lines += [
        f"   why: {v.info.why}",
        f"   fix: {v.info.fix}",
    ]
    return lines


def _shrink(
    renderer: ChatRenderer, conversation: Conversation, mismatch: Mismatch, budget: int
) -> tuple[Conversation, Mismatch]:
    """Greedy: keep the first smaller variant that still shows the same property and kind."""
    key = (mismatch.property, mismatch.kind)
    tried = 0
    improved = True
    while improved and tried < budget:
        improved = False
        size = conversation.size()
        for candidate in shrink_candidates(conversation):
            if candidate.size() >= size:
                continue
            tried += 1
            found = [
                m for m in check_conversation(renderer, candidate).mismatches if (m.property, m.kind) == key
            ]
            if found:
                conversation, mismatch, improved = candidate, found[0], True
                break
            if tried >= budget:
                break
    return conversation, mismatch


def check_template(
    tokenizer: Any,
    chat_template: str | None = None,
    cases: int = 200,
    seed: int = 0,
    *,
    end_token: str | Sequence[str] | None = None,
    reasoning: str | None = None,
    tool_format: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    label: str | None = None,
    shrink_budget: int = 300,
    renderer: ChatRenderer | None = None,
) -> CheckReport:
    """Check a chat template (the tokenizer's own when None) on `cases` generated conversations.

    `end_token` (one token, several, or ["none"]: the next role token ends the turn),
    `reasoning` and `tool_format` override the detected emission facts (ValueError on a value the
    tokenizer or the checker does not know); `template_kwargs` are extra template variables (e.g.
    {"enable_thinking": False}); `label` names the template in the report. `renderer` checks that
    renderer (a session server's, built on `tokenizer` with `chat_template`) instead of a new one,
    so the decisions it caches (its incremental-suffix probe, reported as `incremental`) are made
    once and are the ones the server uses.
    """
    if cases < 1:
        raise ValueError(f"cases: must be at least 1, got {cases}")
    started = time.perf_counter()
    if renderer is None:
        renderer = ChatRenderer(tokenizer, chat_template, template_kwargs)
    elif (
        renderer.tokenizer is not tokenizer
        or (chat_template and chat_template != renderer.chat_template)
        or (template_kwargs and dict(template_kwargs) != renderer.template_kwargs)
    ):
        raise ValueError(
            "renderer: must be built on the tokenizer, chat template and template kwargs being checked"
        )
    try:
        renderer.render_text([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"chat template does not compile: {exc}") from None
    except Exception:  # a template that raises at run time is reported per conversation
        pass
    ends = [end_token] if isinstance(end_token, str) else end_token
    renderer.use_emission(parse_emission_override(renderer.emission, tokenizer, reasoning, ends, tool_format))
    groups: dict[tuple[str, str], list[tuple[Conversation, Mismatch]]] = {}
    note_groups: dict[tuple[str, str], list[tuple[Conversation, Mismatch]]] = {}
    split_points = generated_turns = 0
    for conversation in generate_conversations(cases, seed):
        result = check_conversation(renderer, conversation)
        split_points += result.split_points
        generated_turns += result.generated_turns
        for mismatch in result.mismatches:
            groups.setdefault((mismatch.property, mismatch.kind), []).append((conversation, mismatch))
        for note in result.notes:
            note_groups.setdefault((note.property, note.kind), []).append((conversation, note))
    violations = []
    for key in sorted(groups):
        conversation, mismatch = min(groups[key], key=lambda item: item[0].size())
        conversation, mismatch = _shrink(renderer, conversation, mismatch, shrink_budget)
        violations.append(_violation(tokenizer, mismatch, conversation, len(groups[key])))
    notes = []
    for key in sorted(note_groups):
        conversation, note = min(note_groups[key], key=lambda item: item[0].size())
        notes.append(_violation(tokenizer, note, conversation, len(note_groups[key])))
    return CheckReport(
        template=label or ("given template" if chat_template else "the tokenizer's chat_template"),
        emission=renderer.emission,
        cases=cases,
        seed=seed,
        split_points=split_points,
        generated_turns=generated_turns,
        violations=violations,
        notes=notes,
        elapsed_s=time.perf_counter() - started,
        incremental=renderer.incremental,
    )
