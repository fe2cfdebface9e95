"""Token-in/token-out rendering: the one place that turns chat messages into token IDs.

Owns how a conversation's first prompt is tokenized and how new messages are rendered as a
*suffix* and tokenized alone, to be appended to token IDs a session already holds. The session
server and the append-only checker both call this module, so what the checker proves is what the
server does. It does not own template selection (`rl360_ext.templates.select`) or parsing of
model output (`rl360_ext.templates.parse`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Message = dict[str, Any]


class TemplateNotAppendOnlyError(ValueError):
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
            f"history {history_text[position:position + 40]!r} vs full {full_text[position:position + 40]!r})"
        )


class ChatRenderer:
    """Renders messages with a tokenizer's chat template (or an override) and tokenizes them."""

    def __init__(self, tokenizer: Any, chat_template: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template or tokenizer.chat_template
        if not self.chat_template:
            raise ValueError("tokenizer has no chat_template and none was given")

    def render_text(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages),
            tools=list(tools) if tools else None,
            chat_template=self.chat_template,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """Tokens of a conversation's first prompt, generation prompt included."""
        return self.encode(self.render_text(messages, tools, add_generation_prompt=True))

    def suffix_text(
        self,
        history: Sequence[Message],
        new_messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> str:
        """Text the new messages (and the generation prompt) add after the history's render."""
        history_text = self.render_text(history, tools, add_generation_prompt=False)
        full_text = self.render_text([*history, *new_messages], tools, add_generation_prompt=True)
        if not full_text.startswith(history_text):
            raise TemplateNotAppendOnlyError(history_text, full_text)
        return full_text[len(history_text) :]

    def suffix_ids(
        self,
        history: Sequence[Message],
        new_messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> list[int]:
        """Tokens to append after the tokens a session holds for `history` (tokenized alone)."""
        return self.encode(self.suffix_text(history, new_messages, tools))
