"""Fixed (append-only) chat templates and which one a tokenizer gets.

Owns the registry of fixed templates (package data written for rl360-ext) and the fingerprinting
that picks one for a tokenizer from its special tokens and original template text:

- "qwen3": `templates/data/qwen3_append_only.jinja`, the Qwen3 text format (reasoning, Hermes
  `<tool_call>` JSON, grouped `<tool_response>`s) with the turn separator moved before
  `<|im_start|>`, reasoning kept for every turn and tool-call arguments rendered verbatim. For
  tokenizers with ChatML turn tokens and Hermes tool-call tokens (Qwen2.5 / Qwen3 / QwQ families).
- "reference": the reference template (`templates/data/reference.jinja`), where nothing at
  all is emitted between `<|im_end|>` and the next `<|im_start|>`. It is the design reference and
  the template the tiny engine ships; it is one file, not a copy.

It does not check templates (`rl360_ext.templates.check`) or render them (`render.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from rl360_ext.templates.markup import (
    THINK_END,
    THINK_START,
    TOOL_CALL_END,
    TOOL_CALL_START,
    TURN_END,
    TURN_START,
)

_CHATML = (TURN_START, TURN_END)
_HERMES = (TOOL_CALL_START, TOOL_CALL_END)
_THINKING = (THINK_START, THINK_END)
_XML_TOOL_CALLS = ("<function=", "<parameter=")  # Qwen3-Coder style: not the Hermes JSON we parse


def fixed_template_names() -> tuple[str, ...]:
    return ("qwen3", "reference")


def fixed_template(name: str) -> str:
    """The text of a fixed template by name ("qwen3" or "reference")."""
    if name == "qwen3":
        return resources.files("rl360_ext.templates").joinpath("data/qwen3_append_only.jinja").read_text()
    if name == "reference":
        return resources.files("rl360_ext.templates").joinpath("data/reference.jinja").read_text()
    raise ValueError(f"unknown fixed template {name!r}; choose one of {', '.join(fixed_template_names())}")


@dataclass(frozen=True)
class FixedTemplateChoice:
    """The outcome of fingerprinting: a fixed template's name and text (None: keep the tokenizer's)."""

    name: str | None
    text: str | None
    reason: str


def _original_text(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, Mapping):
        return "\n".join(str(text) for text in template.values())
    return str(template)


def _has_tokens(vocab: Mapping[str, int], tokens: tuple[str, ...]) -> bool:
    return all(token in vocab for token in tokens)


def choose_fixed_template(tokenizer: Any) -> FixedTemplateChoice:
    """Pick a fixed template for a tokenizer by its special tokens and original template text."""
    original = _original_text(tokenizer)
    for name in fixed_template_names():
        if original.strip() and original.strip() == fixed_template(name).strip():
            return FixedTemplateChoice(
                None, None, f"the tokenizer's template is already rl360's {name!r} template"
            )
    vocab = tokenizer.get_vocab()
    if not _has_tokens(vocab, _CHATML):
        return FixedTemplateChoice(
            None, None, "no ChatML turn tokens (<|im_start|>, <|im_end|>): no fixed template"
        )
    if any(marker in original for marker in _XML_TOOL_CALLS):
        return FixedTemplateChoice(
            None,
            None,
            "XML tool calls (<function=...>, Qwen3-Coder style): the session parses Hermes JSON only",
        )
    if not _has_tokens(vocab, _HERMES):
        return FixedTemplateChoice(
            None, None, "ChatML without <tool_call> tokens: no fixed template for this family"
        )
    family = (
        "Qwen3 family (reasoning)" if _has_tokens(vocab, _THINKING) else "Qwen2.5 family (no <think> tokens)"
    )
    return FixedTemplateChoice(
        "qwen3", fixed_template("qwen3"), f"ChatML + Hermes tool-call tokens: {family}"
    )


def fixed_template_for(tokenizer: Any) -> str | None:
    """The fixed template to use instead of the tokenizer's own, or None (keep the tokenizer's)."""
    return choose_fixed_template(tokenizer).text
