"""Replaying one conversation exactly as the session server handles it (first prompt through
`ChatRenderer.prompt_ids`; the model's turn = the template's render of that assistant message
after the generation prompt, through the end-of-turn token; the reply parsed and echoed back;
each later batch through `ChatRenderer.suffix_ids`), and checking the prefix and generation
properties on it (`check_conversation`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rl360_ext.errors import Rl360Error
from rl360_ext.templates.check.classify import (
    GENERATION,
    GENERATION_PROMPT,
    PREFIX,
    RENDER_ERROR,
    TOKEN_BOUNDARY,
    TOOL_CALLS_NOT_PARSED,
    Message,
    Mismatch,
    _classify,
    _first_difference,
    _Generated,
    _short,
)
from rl360_ext.templates.conversations import Conversation, Turn
from rl360_ext.templates.emission import (
    PROBE_CONTENT,
    PROBE_REASONING,
    THINK_CLOSE,
    THINK_OPEN,
    Emission,
)
from rl360_ext.templates.parse import ParsedAssistant
from rl360_ext.templates.render import ChatRenderer, TemplateNotAppendOnlyError, mapping_arguments


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


def _echo(parsed: ParsedAssistant, original: Message) -> Message:
    """The message the agent sends back: the parsed reply, tool-call ids as the original's."""
    message = parsed.to_message()
    for call, source in zip(message.get("tool_calls") or [], original.get("tool_calls") or [], strict=False):
        call["id"] = source.get("id", call["id"])
    return message


class _RenderFailed(Rl360Error):
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
