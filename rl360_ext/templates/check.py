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
from dataclasses import dataclass, field
from typing import Any

import jinja2

from rl360_ext.templates.conversations import Conversation, generate_conversations, shrink_candidates
from rl360_ext.templates.parse import THINK_END, ParsedAssistant
from rl360_ext.templates.render import ChatRenderer, TemplateNotAppendOnlyError

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

_PROBE = "\u2063rl360-end-probe\u2063"
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
    TOKEN_BOUNDARY: KindInfo(
        "same text, different tokens at a boundary",
        "pieces tokenized alone tokenize differently from the whole text around a boundary",
        "end every piece the session tokenizes alone with a special token",
    ),
}


@dataclass
class Mismatch:
    """One property failing on one conversation, with the two token streams compared."""

    property: str
    kind: str
    turn: int
    detail: str
    server_ids: list[int]
    canonical_ids: list[int]
    server_text: str
    canonical_text: str


@dataclass
class _Generated:
    """What the replay knows about one generated assistant turn."""

    turn: int
    request_text: str
    request_ids: list[int]
    text: str
    ids: list[int]
    trailer: str
    parsed: ParsedAssistant


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
    """The token that ends an assistant turn: the first added token the template renders after an
    assistant's content (read off a turn that is not the last), else the tokenizer's eos token."""
    tokenizer = renderer.tokenizer
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": _PROBE},
        {"role": "user", "content": "ok"},
    ]
    try:
        text = renderer.render_text(messages)
    except Exception:  # a template that cannot render the probe: fall back to eos
        text = ""
    tail = text[text.index(_PROBE) + len(_PROBE) :] if _PROBE in text else ""
    best: tuple[int, int, str] | None = None
    for token in tokenizer.get_added_vocab():
        at = tail.find(token) if token.strip() else -1
        if at >= 0 and (best is None or (at, -len(token)) < best[:2]):
            best = (at, -len(token), token)
    if best is not None:
        return best[2]
    if tokenizer.eos_token:
        return tokenizer.eos_token
    raise ValueError("cannot tell which token ends an assistant turn; pass end_token explicitly")


def _in_reasoning(server_text: str, at: int, g: _Generated) -> bool:
    """True when character `at` of `server_text` falls in turn g's generated reasoning block."""
    if g.parsed.reasoning is None:
        return False
    start = len(g.request_text)
    if server_text[start : start + len(g.text)] != g.text:
        return False
    return start <= at < start + g.text.index(THINK_END) + len(THINK_END)


def _classify(server_text: str, canonical_text: str, generated: Sequence[_Generated], end_token: str) -> str:
    """Name the violation from where and how the session's text departs from the template's
    (`generated`: every generated turn up to the one checked)."""
    at = _first_difference(server_text, canonical_text)
    if server_text[:at].endswith(end_token) and any(
        g.trailer and canonical_text[at:].startswith(g.trailer) for g in generated
    ):
        return AFTER_END
    if any(_in_reasoning(server_text, at, g) for g in generated):
        return REASONING_DROPPED
    for g in generated:
        reasoning = (g.parsed.reasoning or "").strip()
        if reasoning and server_text.count(reasoning) > canonical_text.count(reasoning):
            return REASONING_DROPPED
    for g in generated:
        for call in g.parsed.tool_calls:
            arguments = call["function"]["arguments"]
            if server_text.count(arguments) > canonical_text.count(arguments):
                return TOOL_CALL_RESERIALIZED
    return LOOP_POSITION


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


class _Replay:
    """Replays one conversation through the session server's rendering calls."""

    def __init__(self, renderer: ChatRenderer, conversation: Conversation, end_token: str) -> None:
        self.renderer = renderer
        self.conversation = conversation
        self.end_token = end_token
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
            self.result.add(Mismatch(GENERATION, RENDER_ERROR, len(self.generated), detail, [], [], "", ""))
            return self.result
        self._generation_property()
        return self.result

    def _turns(self) -> None:
        conversation = self.conversation
        history = list(conversation.prompt)
        request_text = self.render(history, True)
        request_ids = _rendering(self.renderer.prompt_ids, history, self.tools)
        for k, turn in enumerate(conversation.turns):
            generated = self._generate(k, turn.assistant, history, request_text, request_ids)
            if generated is None:
                return
            history.append(
                _echo(generated.parsed, turn.assistant)
                if self._parsed_ok(generated, turn.assistant)
                else turn.assistant
            )
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

    def _generate(
        self, k: int, assistant: Message, history: list[Message], request_text: str, request_ids: list[int]
    ) -> _Generated | None:
        """The tokens the model emits for `assistant`: its render after the generation prompt."""
        reply_text = self.render([*history, assistant], False)
        if not reply_text.startswith(request_text):
            at = _first_difference(request_text, reply_text)
            detail = (
                f"turn {k}: the render with this assistant message differs from the generation prompt at "
                f"character {at}"
            )
            reply_ids = self.renderer.encode(reply_text)
            self.result.add(
                Mismatch(
                    GENERATION, GENERATION_PROMPT, k, detail, request_ids, reply_ids, request_text, reply_text
                )
            )
            return None
        rest = reply_text[len(request_text) :]
        at = rest.find(self.end_token)
        text = rest[: at + len(self.end_token)] if at >= 0 else rest + self.end_token
        trailer = rest[at + len(self.end_token) :] if at >= 0 else ""
        parsed = self.renderer.parse_assistant(text[: -len(self.end_token)])
        generated = _Generated(
            k, request_text, request_ids, text, self.renderer.encode(text), trailer, parsed
        )
        self.generated.append(generated)
        self.result.generated_turns += 1
        return generated

    def _parsed_ok(self, generated: _Generated, assistant: Message) -> bool:
        if _call_names(generated.parsed.tool_calls) == _call_names(assistant.get("tool_calls")):
            return True
        detail = (
            f"turn {generated.turn}: the model's tool calls {_call_names(assistant.get('tool_calls'))} parse "
            f"as {_call_names(generated.parsed.tool_calls)}"
        )
        self.result.add(
            Mismatch(
                GENERATION,
                TOOL_CALLS_NOT_PARSED,
                generated.turn,
                detail,
                generated.request_ids + generated.ids,
                generated.request_ids + generated.ids,
                generated.request_text + generated.text,
                generated.request_text + generated.text,
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
            kind = _classify(held_text, expected_text, self.generated, self.end_token)
            self.result.add(
                Mismatch(PREFIX, kind, k, detail, held_ids, expected_ids, held_text, expected_text)
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
                PREFIX, TOKEN_BOUNDARY, k, detail, server_ids, expected_ids, server_text, expected_text
            )
            self.result.add(mismatch, note=start - 1 <= at <= start)
            return
        kind = _classify(server_text, expected_text, self.generated, self.end_token)
        detail = f"turn {k}: the session's tokens differ from the render of the conversation"
        self.result.add(
            Mismatch(PREFIX, kind, k, detail, server_ids, expected_ids, server_text, expected_text)
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
                        GENERATION, TOKEN_BOUNDARY, g.turn, detail, held_ids, ids, held_text, text
                    )
                    self.result.add(mismatch, note=True)
                    continue
                kind = _classify(held_text, text, self.generated[: g.turn + 1], self.end_token)
                detail = f"turn {g.turn}: the model's tokens do not appear in the render after turn {turn}"
                self.result.add(Mismatch(GENERATION, kind, g.turn, detail, held_ids, ids, held_text, text))
                break


def check_conversation(renderer: ChatRenderer, conversation: Conversation, end_token: str) -> CaseResult:
    """Replay one conversation and check both properties on it."""
    return _Replay(renderer, conversation, end_token).run()


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
    end_token: str
    cases: int
    seed: int
    split_points: int
    generated_turns: int
    violations: list[Violation]
    notes: list[Violation]
    elapsed_s: float

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "template": self.template,
            "end_token": self.end_token,
            "cases": self.cases,
            "seed": self.seed,
            "split_points": self.split_points,
            "generated_turns": self.generated_turns,
            "elapsed_s": round(self.elapsed_s, 3),
            "violations": [v.to_json() for v in self.violations],
            "notes": [n.to_json() for n in self.notes],
        }

    def json_text(self) -> str:
        return json.dumps(self.to_json(), indent=2, ensure_ascii=False)

    def summary(self) -> str:
        lines = [
            f"chat template: {self.template} (end-of-turn token {self.end_token!r})",
            f"checked {self.cases} conversations (seed {self.seed}): {self.split_points} split points, "
            f"{self.generated_turns} generated turns in {self.elapsed_s:.2f} s",
        ]
        if self.ok:
            lines.append("OK: append-only. The prefix and generation properties hold on every conversation.")
        else:
            lines.append(f"NOT APPEND-ONLY: {len(self.violations)} kind(s) of violation")
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
    lines += [
        f"   text: session {v.server_text[0][-24:]!r} ▏ {v.server_text[1][:24]!r}",
        f"         template {v.canonical_text[0][-24:]!r} ▏ {v.canonical_text[1][:24]!r}",
        f"   why: {v.info.why}",
        f"   fix: {v.info.fix}",
    ]
    return lines


def _shrink(
    renderer: ChatRenderer, conversation: Conversation, mismatch: Mismatch, end_token: str, budget: int
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
                m
                for m in check_conversation(renderer, candidate, end_token).mismatches
                if (m.property, m.kind) == key
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
    end_token: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    label: str | None = None,
    shrink_budget: int = 300,
) -> CheckReport:
    """Check a chat template (the tokenizer's own when None) on `cases` generated conversations.

    `end_token` overrides the detected end-of-turn token; `template_kwargs` are extra template
    variables (e.g. {"enable_thinking": False}); `label` names the template in the report.
    """
    if cases < 1:
        raise ValueError(f"cases: must be at least 1, got {cases}")
    started = time.perf_counter()
    renderer = ChatRenderer(tokenizer, chat_template, template_kwargs)
    try:
        renderer.render_text([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"chat template does not compile: {exc}") from None
    except Exception:  # a template that raises at run time is reported per conversation
        pass
    end = end_token or find_end_token(renderer)
    groups: dict[tuple[str, str], list[tuple[Conversation, Mismatch]]] = {}
    note_groups: dict[tuple[str, str], list[tuple[Conversation, Mismatch]]] = {}
    split_points = generated_turns = 0
    for conversation in generate_conversations(cases, seed):
        result = check_conversation(renderer, conversation, end)
        split_points += result.split_points
        generated_turns += result.generated_turns
        for mismatch in result.mismatches:
            groups.setdefault((mismatch.property, mismatch.kind), []).append((conversation, mismatch))
        for note in result.notes:
            note_groups.setdefault((note.property, note.kind), []).append((conversation, note))
    violations = []
    for key in sorted(groups):
        conversation, mismatch = min(groups[key], key=lambda item: item[0].size())
        conversation, mismatch = _shrink(renderer, conversation, mismatch, end, shrink_budget)
        violations.append(_violation(tokenizer, mismatch, conversation, len(groups[key])))
    notes = []
    for key in sorted(note_groups):
        conversation, note = min(note_groups[key], key=lambda item: item[0].size())
        notes.append(_violation(tokenizer, note, conversation, len(note_groups[key])))
    return CheckReport(
        template=label or ("given template" if chat_template else "the tokenizer's chat_template"),
        end_token=end,
        cases=cases,
        seed=seed,
        split_points=split_points,
        generated_turns=generated_turns,
        violations=violations,
        notes=notes,
        elapsed_s=time.perf_counter() - started,
    )
