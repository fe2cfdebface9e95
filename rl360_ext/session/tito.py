"""Token-in/token-out for a session: what to append to the held tokens, and what the reply says.

Owns the session's use of `ChatRenderer` (every message the session tokenizes goes through
`prompt_ids` / `suffix_ids`, the contract the append-only checker proves; a suffix renders only the
new messages after an anchor when the template allows it, `ChatRenderer.incremental`), the end-of-turn
facts of a template (which token ends an assistant turn and the text the template renders after
the assistant's content), the closing tokens appended when a turn did not end with that token
(a `length` cut or a stop string), the role tokens a family with no end token stops at (GLM),
decoding sampled tokens into the reply text, and the drift
check of a merged trajectory (its held tokens vs one canonical render of its final messages,
`rl360_ext.templates.drift`). It does not own sessions (`core.py`) or the parsing rules
(`rl360_ext.templates.parse`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rl360_ext.templates.drift import find_drift, not_checked
from rl360_ext.templates.emission import next_role_tokens
from rl360_ext.templates.parse import ParsedAssistant
from rl360_ext.templates.render import ChatRenderer
from rl360_ext.templates.tokenizer import TokenBudgetExceeded, within

Message = dict[str, Any]


@dataclass(frozen=True)
class TurnEnd:
    """How an assistant turn ends in this template."""

    closing_text: str  # rendered after the assistant's content, e.g. "<|im_end|>"
    end_token_id: int | None  # the token the model samples to end its turn, if the closing starts with one
    end_token_text: str


def turn_end(renderer: ChatRenderer) -> TurnEnd:
    """The template's closing text and the special token it starts with (else the eos token)."""
    tokenizer = renderer.tokenizer
    eos_text = tokenizer.eos_token or ""
    if not renderer.emission.end_tokens:  # the next role token ends the turn: nothing to close
        return TurnEnd("", None, "")
    closing = renderer.assistant_closing()
    if closing is None:
        closing = eos_text
    added = {text: token_id for text, token_id in tokenizer.get_added_vocab().items() if text.strip()}
    for text in sorted(added, key=len, reverse=True):
        if closing.startswith(text):
            return TurnEnd(closing, added[text], text)
    return TurnEnd(closing, tokenizer.eos_token_id, eos_text)


class TitoRenderer:
    """The session's tokenization: first prompts, suffixes, closing tokens, reply text."""

    def __init__(self, renderer: ChatRenderer) -> None:
        self.renderer = renderer
        self.tokenizer = renderer.tokenizer
        self.turn_end = turn_end(renderer)
        renderer.incremental  # noqa: B018 - decide the suffix mode (the probe) now, not on a first turn
        # Families with no end token (GLM): the model stops at the next message's role token,
        # which the next suffix renders again.
        roles = next_role_tokens(renderer) if not renderer.emission.end_tokens else ()
        vocab = self.tokenizer.get_vocab()
        self.role_stop_ids = {vocab[token] for token in roles if token in vocab}

    @property
    def stop_token_ids(self) -> list[int]:
        ids = {self.turn_end.end_token_id, self.tokenizer.eos_token_id, *self.role_stop_ids}
        return sorted(i for i in ids if i is not None)

    def first_prompt(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None,
        max_tokens: int | None = None,
    ) -> list[int]:
        """The first prompt's tokens; over `max_tokens`, TokenBudgetExceeded before they are built."""
        return self.renderer.prompt_ids(messages, tools, max_tokens)

    def suffix(
        self,
        history: Sequence[Message],
        new_messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None,
        held: Sequence[int] = (),
        max_tokens: int | None = None,
    ) -> list[int]:
        """Raises TemplateNotAppendOnlyError when the history's render is not a prefix. When the
        held tokens end with the role token the model stopped at (a family with no end token), the
        suffix starts after it, so the token is held once. A suffix of more than `max_tokens`
        raises TokenBudgetExceeded (its count a lower bound), its ids never built."""
        budget = None if max_tokens is None else max_tokens + 1  # `_after_held` may drop one
        try:
            suffix = self._after_held(held, self.renderer.suffix_ids(history, new_messages, tools, budget))
        except TokenBudgetExceeded as exc:
            raise TokenBudgetExceeded(exc.tokens - 1, max_tokens or 0) from exc
        within(len(suffix), max_tokens)
        return suffix

    def anchored_suffix(
        self,
        history: Sequence[Message],
        new_messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None,
        held: Sequence[int] = (),
    ) -> list[int] | None:
        """`suffix` when the template renders incrementally and this turn's anchor renders (the
        cheap case: a few messages); None otherwise (then `suffix` decides, rendering it all)."""
        if not self.renderer.incremental:
            return None
        text = self.renderer.anchored_suffix_text(history, new_messages, tools)
        return None if text is None else self._after_held(held, self.renderer.encode(text))

    def _after_held(self, held: Sequence[int], suffix: list[int]) -> list[int]:
        if held and suffix and held[-1] in self.role_stop_ids and suffix[0] == held[-1]:
            return suffix[1:]
        return suffix

    def closing_ids(self, output_ids: Sequence[int]) -> list[int]:
        """Tokens the template renders after this turn's output that the model did not sample."""
        end = self.turn_end
        closing = end.closing_text
        if output_ids and end.end_token_id is not None and output_ids[-1] == end.end_token_id:
            closing = closing[len(end.end_token_text) :]
        return self.renderer.encode(closing) if closing else []

    def parse(self, text: str) -> ParsedAssistant:
        """Reply text as message fields that re-render verbatim (the template's tool-call separator)."""
        return self.renderer.parse_assistant(text)

    def reply_text(self, output_ids: Sequence[int], finish_type: str, matched: int | str | None) -> str:
        """The sampled text the agent sees: the end token or a matched stop string removed."""
        ids = list(output_ids)
        ends_with_stop = ids and (ids[-1] == matched or ids[-1] in self.stop_token_ids)
        if finish_type == "stop" and ends_with_stop:
            ids = ids[:-1]
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        if finish_type == "stop" and isinstance(matched, str) and matched and matched in text:
            text = text[: text.index(matched)]
        return text

    def drift(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None,
        tokens: Sequence[int],
        finish_reasons: Sequence[str],
        last_output_start: int | None = None,
    ) -> dict[str, Any]:
        """The merged trajectory's drift record (`rl360_ext.templates.drift`): compared only when every
        turn of the segment was merged. A cut last turn renders differently, so then only the tokens
        before its output (`last_output_start`; None: nothing) are compared (`"cut_last_turn": True`)."""
        cut = bool(finish_reasons) and finish_reasons[-1] != "stop"
        if not messages or not finish_reasons or (cut and last_output_start is None):
            return not_checked("the last turn did not stop normally")
        if cut:
            tokens = tokens[:last_output_start]
        elif tokens and tokens[-1] in self.role_stop_ids:
            tokens = tokens[:-1]  # the next message's role token the model stopped at
        try:
            record = find_drift(self.renderer, messages, tools, tokens).to_json()
            return {**record, "cut_last_turn": True} if cut else record
        except Exception as exc:  # the template raising on the final messages is drift too
            return {
                "checked": True,
                "mismatch": True,
                "position": 0,
                "kind": "render-error",
                "evidence": str(exc),
            }
