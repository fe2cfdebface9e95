"""Token-in/token-out rendering: the one place that turns chat messages into token IDs.

Owns how a conversation's first prompt is tokenized and how new messages are rendered as a
*suffix* and tokenized alone, to be appended to token IDs a session already holds, plus the two
template facts both the session server and the checker need: the text an assistant turn closes
with and the separator the template puts before a tool call (so generated text parses back into
fields that re-render byte for byte). The session server and the append-only checker both call
this module, so what the checker proves is what the server does. The renderer also holds the
family's emission facts (`rl360_ext.templates.emission`: reasoning, end tokens, tool-call format;
detected from the template unless given), parses replies with that tool-call format, and, for
formats that render arguments key by key (GLM), hands the template the arguments as a mapping
(OpenAI clients send a JSON string). It does not own template selection
(`rl360_ext.templates.select`), the checker (`rl360_ext.templates.check`) or the parsing rules
themselves (`rl360_ext.templates.parse`).

A suffix costs the new messages, not the history: for a template whose render of appended messages
does not depend on what came before them (decided once per renderer by `incremental`, a probe over
the checker's conversation generator), `suffix_text` renders the new messages after a short anchor
that stands in for the history -- its first message when that is a system message, one fixed user
message, and its last message -- and takes the difference. Templates where the anchor changes the
render (loop counters, first-user or last-user logic, state carried across messages) are detected
by the probe and keep the full render (`full_suffix_text`: the whole history, twice), as does any
single turn whose anchor renders oddly. The merge-time drift check (`rl360_ext.templates.drift`)
compares the whole trajectory once, so a mis-rendered suffix cannot reach training unnoticed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

from rl360_ext.errors import Rl360Error
from rl360_ext.templates.emission import Emission, detect_emission
from rl360_ext.templates.parse import TOOL_CALL_END, TOOL_CALL_START, ParsedAssistant, parse_assistant
from rl360_ext.templates.tokenizer import Encoder, fast_encoder

Message = dict[str, Any]
_PROBE = "\u2063rl360-probe\u2063"
_PROBE_TOOL = {"type": "function", "function": {"name": "probe", "parameters": {"type": "object"}}}
# The one user message of every anchor (see `ChatRenderer.anchor`).
ANCHOR_USER: Message = {"role": "user", "content": "rl360 anchor"}
# Conversations (of `rl360_ext.templates.conversations`, seed 0) the incremental probe compares on.
INCREMENTAL_PROBE_CASES = 48


class TemplateNotAppendOnlyError(Rl360Error, ValueError):
    """The template rendered a history that is not a prefix of the longer conversation's render."""

    def __init__(self, history_text: str, full_text: str) -> None:
        position = next(
            (i for i, (a, b) in enumerate(zip(history_text, full_text, strict=False)) if a != b),
            min(len(history_text), len(full_text)),
        )
        self.position = position
        super().__init__(
            "chat template is not append-only: the history's render is not a prefix of the "
            f"conversation's render (first difference at character {position}: "
            f"history {history_text[position : position + 40]!r} vs "
            f"full {full_text[position : position + 40]!r})"
        )


def _resolve_template(tokenizer: Any, chat_template: str | None) -> str:
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if isinstance(template, Mapping):
        # Tokenizers with several named templates: the one transformers uses by default.
        template = template.get("default") or template.get("tool_use")
    if not template:
        raise ValueError("tokenizer has no chat_template and none was given")
    return template


class ChatRenderer:
    """Renders messages with a tokenizer's chat template (or an override) and tokenizes them.

    `template_kwargs` are extra variables the template sees on every render (for example
    `{"enable_thinking": False}` for Qwen3-style templates). `emission` overrides the detected
    emission facts. `incremental` pins the suffix mode (True: anchored, False: full render)
    instead of probing the template for it. `encoder` replaces the tokenizer's own encode (a server's
    `IsolatedEncoder`); it must give the same ids.
    """

    def __init__(
        self,
        tokenizer: Any,
        chat_template: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        emission: Emission | None = None,
        incremental: bool | None = None,
        encoder: Encoder | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self._encode = encoder or fast_encoder(tokenizer)
        self._pinned_incremental = incremental is not None
        if incremental is not None:
            self.__dict__["incremental"] = incremental
        self.chat_template = _resolve_template(tokenizer, chat_template)
        self.template_kwargs = dict(template_kwargs or {})
        self._emission: Emission | None = None
        self._mapping_arguments = False
        self._detecting = False
        if emission is not None:
            self.use_emission(emission)

    @property
    def emission(self) -> Emission:
        """The family's emission facts (detected once from the template, unless given)."""
        if self._emission is None:
            self._detecting = True
            try:
                detected = detect_emission(self)
            finally:
                self._detecting = False
            self.use_emission(detected)
        assert self._emission is not None
        return self._emission

    def _template_messages(self, messages: Sequence[Message]) -> list[Message]:
        if not self._mapping_arguments:
            return list(messages)
        return [_with_mapping_arguments(message) for message in messages]

    def render_text(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        if self._emission is None and not self._detecting:
            self.emission  # noqa: B018 - detection decides how arguments reach the template
        return self.tokenizer.apply_chat_template(
            self._template_messages(messages),
            tools=list(tools) if tools else None,
            chat_template=self.chat_template,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
        )

    def encode(self, text: str, max_tokens: int | None = None) -> list[int]:
        """`text`'s tokens without added special tokens: the tokenizer's `encode`, through its
        backend directly where that is the same (`rl360_ext.templates.tokenizer.backend_encoder`).
        With `max_tokens`, a longer text raises TokenBudgetExceeded before its ids are built."""
        return self._encode(text, max_tokens)

    def prompt_ids(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
    ) -> list[int]:
        """Tokens of a conversation's first prompt, generation prompt included (`max_tokens`: as `encode`)."""
        return self.encode(self.render_text(messages, tools, add_generation_prompt=True), max_tokens)

    def suffix_text(
        self,
        history: Sequence[Message],
        new_messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> str:
        """Text the new messages (and the generation prompt) add after the history's render.

        Renders only the new messages after the history's anchor when the template passed the
        incremental probe (`incremental`), else (or when the anchor does not render as a prefix)
        the whole history (`full_suffix_text`, which raises TemplateNotAppendOnlyError)."""
        if self.incremental:
            text = self.anchored_suffix_text(history, new_messages, tools)
            if text is not None:
                return text
        return self.full_suffix_text(history, new_messages, tools)

    def full_suffix_text(
        self,
        history: Sequence[Message],
        new_messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> str:
        """The suffix from two renders of the whole conversation (the reference `suffix_text` is held to)."""
        history_text = self.render_text(history, tools, add_generation_prompt=False)
        full_text = self.render_text([*history, *new_messages], tools, add_generation_prompt=True)
        if not full_text.startswith(history_text):
            raise TemplateNotAppendOnlyError(history_text, full_text)
        return full_text[len(history_text) :]

    @staticmethod
    def anchor(history: Sequence[Message]) -> list[Message] | None:
        """A short stand-in for `history` that ends as it does: its first message when that is a
        system (or developer) message, `ANCHOR_USER`, and its last message, which must be an
        assistant's. None when the history does not end with an assistant message or is no longer
        than its anchor (nothing to save)."""
        if not history or history[-1].get("role") != "assistant":
            return None
        head = [history[0]] if history[0].get("role") in ("system", "developer") else []
        anchor = [*head, ANCHOR_USER, history[-1]]
        return anchor if len(anchor) < len(history) else None

    def anchored_suffix_text(
        self,
        history: Sequence[Message],
        new_messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> str | None:
        """The suffix rendered after the history's `anchor` (cost: the anchor and the new messages).

        None when there is no anchor, the template raises on it, or the anchor's render is not a
        prefix of the anchor-plus-new render (the caller then renders the whole history). Equal to
        `full_suffix_text` only for templates `incremental` accepts."""
        anchor = self.anchor(history)
        if anchor is None:
            return None
        try:
            base = self.render_text(anchor, tools, add_generation_prompt=False)
            text = self.render_text([*anchor, *new_messages], tools, add_generation_prompt=True)
        except Exception:  # a template refusing the anchor (e.g. a role-order check): render it all
            return None
        return text[len(base) :] if text.startswith(base) else None

    @cached_property
    def incremental(self) -> bool:
        """True when the anchored suffix equals the full-render suffix at every split point of the
        probe conversations (and at least one was compared); False for templates whose render of
        new messages depends on the history, and for templates that are not append-only there."""
        return incremental_probe(self)

    def suffix_ids(
        self,
        history: Sequence[Message],
        new_messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
    ) -> list[int]:
        """Tokens to append after the tokens a session holds for `history` (tokenized alone;
        `max_tokens`: as `encode`)."""
        return self.encode(self.suffix_text(history, new_messages, tools), max_tokens)

    # ---- template facts ---------------------------------------------------------------------

    def assistant_closing(self) -> str | None:
        """Text the template renders after a plain assistant reply's content (e.g. "<|im_end|>").

        None when the reply's render does not start with the generation prompt followed by the
        content, so the closing cannot be read off.
        """
        user = [{"role": "user", "content": "hi"}]
        try:
            prompt = self.render_text(user, add_generation_prompt=True)
            full = self.render_text([*user, {"role": "assistant", "content": _PROBE}])
        except Exception:  # a template that cannot render the probe has no closing to read
            return None
        head = prompt + _PROBE
        return full[len(head) :] if full.startswith(head) else None

    @cached_property
    def tool_call_separator(self) -> str:
        """Text the template puts between an assistant's content and each tool call ("" if none)."""
        calls = [
            {"id": f"call_{i}", "type": "function", "function": {"name": "probe", "arguments": "{}"}}
            for i in range(2)
        ]
        message = {"role": "assistant", "content": _PROBE, "tool_calls": calls}
        try:
            text = self.render_text([{"role": "user", "content": "hi"}, message], [_PROBE_TOOL])
        except Exception:  # no tool-call support: nothing to separate
            return ""
        start = text.find(_PROBE)
        first = text.find(TOOL_CALL_START, start)
        first_end = text.find(TOOL_CALL_END, first)
        second = text.find(TOOL_CALL_START, first_end)
        if start < 0 or first < 0 or first_end < 0 or second < 0:
            return ""
        before_first = text[start + len(_PROBE) : first]
        between = text[first_end + len(TOOL_CALL_END) : second]
        return before_first if before_first == between else ""

    @cached_property
    def tool_call_separator_always(self) -> bool:
        """True when the template renders the separator before the first tool call even when the
        content is empty (GLM: "</think>\n<tool_call>")."""
        separator = self.tool_call_separator
        if not separator:
            return False
        user = [{"role": "user", "content": "hi"}]
        call = {"id": "call_0", "type": "function", "function": {"name": "probe", "arguments": {}}}
        message = {"role": "assistant", "content": "", "tool_calls": [call]}
        try:
            head = self.render_text(user, [_PROBE_TOOL], add_generation_prompt=True)
            text = self.render_text([*user, message], [_PROBE_TOOL])
        except Exception:  # no tool-call support: nothing to separate
            return False
        if not text.startswith(head) or TOOL_CALL_START not in text[len(head) :]:
            return False
        lead = text[len(head) : text.index(TOOL_CALL_START, len(head))]
        return lead.rpartition("</think>")[2] == separator

    def parse_assistant(self, text: str) -> ParsedAssistant:
        """Generated text (end-of-turn token removed) as message fields that re-render verbatim."""
        emission = self.emission
        return parse_assistant(
            text,
            self.tool_call_separator,
            emission.tool_format,
            emission.think_open,
            emission.think_close,
            self.tool_call_separator_always,
        )

    def use_emission(self, emission: Emission) -> None:
        """Render and parse with these emission facts (mapping arguments for key-by-key formats).

        The facts already in use change nothing (the probes' cached decisions stay)."""
        if emission == self._emission:
            return
        self._emission = emission
        self._mapping_arguments = emission.needs_mapping_arguments
        self.__dict__.pop("tool_call_separator", None)
        self.__dict__.pop("tool_call_separator_always", None)
        if not self._pinned_incremental:
            self.__dict__.pop("incremental", None)


def probe_splits(conversations: Sequence[Any]) -> list[tuple[list[Message], list[Message], Any]]:
    """(history ending with an assistant message, the messages appended after it, tools) of every
    turn of `conversations` (`rl360_ext.templates.conversations.Conversation`) that has new messages."""
    splits = []
    for conversation in conversations:
        history = list(conversation.prompt)
        for turn in conversation.turns:
            history = [*history, turn.assistant]
            if turn.new_messages:
                splits.append((history, list(turn.new_messages), conversation.tools))
            history = [*history, *turn.new_messages]
    return splits


def incremental_probe(renderer: ChatRenderer, cases: int = INCREMENTAL_PROBE_CASES) -> bool:
    """Does `renderer`'s anchored suffix equal its full-render suffix on the probe conversations?

    False at the first split point where the template is not append-only (the full render refuses
    with TemplateNotAppendOnlyError: such templates keep the full render, so the session still
    forks there) or the anchored suffix is missing or differs; False when nothing was compared.
    Split points the template refuses to render at all (it raises) are skipped: the server answers
    those with a 400 either way."""
    from rl360_ext.templates.conversations import generate_conversations

    compared = 0
    for history, new_messages, tools in probe_splits(generate_conversations(cases, seed=0)):
        try:
            expected = renderer.full_suffix_text(history, new_messages, tools)
        except TemplateNotAppendOnlyError:
            return False
        except Exception:  # the template refuses this conversation (e.g. two tool calls in one reply)
            continue
        if renderer.anchor(history) is None:
            continue
        if renderer.anchored_suffix_text(history, new_messages, tools) != expected:
            return False
        compared += 1
    return compared > 0


def mapping_arguments(call: Mapping[str, Any]) -> dict[str, Any]:
    """The tool call with its JSON-object string arguments as the mapping a template serializes
    (what the model learned to emit; key order kept); other arguments stay as given."""
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except ValueError:
            value = None
        if isinstance(value, dict):
            function["arguments"] = value
    return {**call, "function": function}


def _with_mapping_arguments(message: Message) -> Message:
    """The message with JSON-object string arguments as mappings (key order kept)."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    return {**message, "tool_calls": [mapping_arguments(call) for call in calls]}
