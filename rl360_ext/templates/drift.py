"""Template drift at run time: the tokens a session holds vs the canonical render of its final messages.

Owns `find_drift`: render a trajectory's final messages once with the session's template, tokenize,
and compare with the tokens the session stored (prompt + sampled + appended suffixes). The held
tokens must be a prefix of the render (what the template renders after the last turn is never
trained on). A mismatch is reported with the first differing token position and a kind read from
evidence in the two texts (the checker's kind names, or "unclassified"). This catches, on live
traffic and with the real model's emissions, what an offline check missed. It does not decide what
happens to a drifting sample (the session records it; the generate hook masks it on request).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DRIFT_KEY = "template_drift"


@dataclass(frozen=True)
class Drift:
    """One trajectory's comparison: `position` is None when the held tokens match the render."""

    position: int | None
    kind: str | None
    evidence: str
    held_tokens: int
    rendered_tokens: int
    render_s: float

    @property
    def mismatch(self) -> bool:
        return self.position is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "checked": True,
            "mismatch": self.mismatch,
            "position": self.position,
            "kind": self.kind,
            "evidence": self.evidence,
            "held_tokens": self.held_tokens,
            "rendered_tokens": self.rendered_tokens,
            "render_s": round(self.render_s, 6),
        }


def not_checked(why: str) -> dict[str, Any]:
    """Metadata for a trajectory whose final messages cannot be compared (e.g. a cut last turn)."""
    return {"checked": False, "mismatch": False, "why": why}


def _kind(held: str, rendered: str, end_tokens: Sequence[str]) -> tuple[str, str]:
    at = next(
        (i for i, (a, b) in enumerate(zip(held, rendered, strict=False)) if a != b),
        min(len(held), len(rendered)),
    )
    near = f"session {held[max(0, at - 16) : at + 24]!r} vs template {rendered[max(0, at - 16) : at + 24]!r}"
    for token in end_tokens:
        if held[:at].endswith(token) and rendered[at : at + 1].isspace() and not held[at : at + 1].isspace():
            return (
                "text-after-end-token",
                f"the template renders {rendered[at : at + 1]!r} after {token!r}; {near}",
            )
        start = held.rfind(token, 0, at + len(token))
        if 0 <= start <= at:
            for other in end_tokens:
                if other != token and rendered[start:].startswith(other):
                    return "end-token-rewritten", f"{token!r} sampled, {other!r} rendered; {near}"
    for marker in ("</think>", "<|channel|>analysis"):
        if held.count(marker) > rendered.count(marker):
            return (
                "earlier-reasoning-dropped",
                f"{marker!r} {held.count(marker)}x held, {rendered.count(marker)}x rendered",
            )
    if rendered.count('\\"') > held.count('\\"'):
        return "tool-call-reserialization", f"escaped quotes only in the render; {near}"
    if held == rendered[: len(held)]:
        return "token-boundary", "same text, different tokens"
    return "unclassified", near


def find_drift(
    renderer: Any,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
    held_ids: Sequence[int],
) -> Drift:
    """Compare `held_ids` with the tokens of `renderer`'s render of `messages` (one render)."""
    started = time.perf_counter()
    text = renderer.render_text(messages, tools, add_generation_prompt=False)
    rendered = renderer.encode(text)
    held = list(held_ids)
    position = next((i for i, (a, b) in enumerate(zip(held, rendered, strict=False)) if a != b), None)
    if position is None and len(held) > len(rendered):
        position = len(rendered)
    kind = evidence = None
    if position is not None:
        held_text = renderer.tokenizer.decode(held, skip_special_tokens=False)
        kind, evidence = _kind(held_text, text, renderer.emission.end_tokens)
    return Drift(position, kind, evidence or "", len(held), len(rendered), time.perf_counter() - started)
