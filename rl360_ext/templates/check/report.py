"""The checker's report: each violation on its smallest failing conversation with the tokens and
text around the first difference (`Violation`), and the verdict for one template (`CheckReport`:
a human summary and JSON)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rl360_ext.templates.check.classify import KINDS, KindInfo, Message, Mismatch, _first_difference
from rl360_ext.templates.conversations import Conversation
from rl360_ext.templates.emission import (
    Emission,
)

_CONTEXT_TOKENS = 6
_CONTEXT_CHARS = 48


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
