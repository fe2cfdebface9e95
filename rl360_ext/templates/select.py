"""Fixed (append-only) chat templates and which one a tokenizer gets.

Owns the registry of fixed templates (package data written for rl360-ext) and the fingerprinting
that picks one for a tokenizer from its special tokens and original template text:

- "qwen3": `templates/data/qwen3_append_only.jinja`, the Qwen3 text format (reasoning, Hermes
  `<tool_call>` JSON, grouped `<tool_response>`s) with the turn separator moved before
  `<|im_start|>`, reasoning kept for every turn and tool-call arguments rendered verbatim. For
  tokenizers with ChatML turn tokens and Hermes tool-call tokens (Qwen2.5 / Qwen3 / QwQ families).
- "deepseek": `deepseek_append_only.jinja`, DeepSeek-R1 / V3 (reasoning kept for every turn,
  V3-style tool calls with arguments verbatim). For tokenizers with `<｜User｜>`, `<｜Assistant｜>`.
- "glm4": `glm4_append_only.jinja`, GLM-4.5 / 4.6 (reasoning kept, content verbatim, XML tool
  calls). For tokenizers with `<|user|>`, `<|assistant|>`, `<|observation|>`.
- "harmony": `harmony_append_only.jinja`, gpt-oss (analysis kept, `<|return|>` kept in history,
  arguments verbatim). For tokenizers with `<|start|>`, `<|channel|>`, `<|message|>`.
- "llama3": `llama3_append_only.jinja`, Llama 3.1 / 3.2 / 3.3 with tool calls (content and
  arguments verbatim). For tokenizers with `<|start_header_id|>`, `<|eot_id|>`.
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


_FILES = {
    "qwen3": "qwen3_append_only.jinja",
    "deepseek": "deepseek_append_only.jinja",
    "glm4": "glm4_append_only.jinja",
    "harmony": "harmony_append_only.jinja",
    "llama3": "llama3_append_only.jinja",
    "reference": "reference.jinja",
}
# Families fingerprinted by special tokens (ChatML/Qwen is handled first, with its own checks).
_FAMILIES = (
    ("deepseek", ("<｜User｜>", "<｜Assistant｜>"), "DeepSeek-R1 / V3 family (<｜User｜>, <｜Assistant｜>)"),
    ("glm4", ("<|user|>", "<|assistant|>", "<|observation|>"), "GLM-4.5 / 4.6 family"),
    ("harmony", ("<|start|>", "<|channel|>", "<|message|>"), "gpt-oss (harmony)"),
    ("llama3", ("<|start_header_id|>", "<|eot_id|>"), "Llama 3.x family"),
)


def fixed_template_names() -> tuple[str, ...]:
    return tuple(_FILES)


def fixed_template(name: str) -> str:
    """The text of a fixed template by name (see `fixed_template_names()`)."""
    if name not in _FILES:
        raise ValueError(
            f"unknown fixed template {name!r}; choose one of {', '.join(fixed_template_names())}"
        )
    return resources.files("rl360_ext.templates").joinpath(f"data/{_FILES[name]}").read_text()


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
        for name, tokens, family in _FAMILIES:
            if _has_tokens(vocab, tokens):
                return FixedTemplateChoice(name, fixed_template(name), f"{' '.join(tokens)}: {family}")
        return FixedTemplateChoice(
            None,
            None,
            "no ChatML turn tokens (<|im_start|>, <|im_end|>) and no other known family: no fixed template",
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
