"""What the template tests' generated texts may hold: no chat special token (a model's generated
text cannot contain one, so a round trip over one proves nothing about the template)."""

from __future__ import annotations

from rl360_ext.templates.markup import SPECIAL_TOKENS


def has_special_token(text: str) -> bool:
    """True when `text` holds a chat special token."""
    return any(token in text for token in SPECIAL_TOKENS)
