"""`check_template`: the whole check of one chat template: replay generated conversations, group
the violations by property and kind, shrink each to its smallest conversation, and report."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2

from rl360_ext.templates.check.classify import Mismatch
from rl360_ext.templates.check.replay import check_conversation
from rl360_ext.templates.check.report import CheckReport, _violation
from rl360_ext.templates.check.shrink import _shrink
from rl360_ext.templates.conversations import Conversation, generate_conversations
from rl360_ext.templates.emission import (
    parse_emission_override,
)
from rl360_ext.templates.render import ChatRenderer


def check_template(
    tokenizer: Any,
    chat_template: str | None = None,
    cases: int = 200,
    seed: int = 0,
    *,
    end_token: str | Sequence[str] | None = None,
    reasoning: str | None = None,
    tool_format: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    label: str | None = None,
    shrink_budget: int = 300,
    renderer: ChatRenderer | None = None,
) -> CheckReport:
    """Check a chat template (the tokenizer's own when None) on `cases` generated conversations.

    `end_token` (one token, several, or ["none"]: the next role token ends the turn),
    `reasoning` and `tool_format` override the detected emission facts (ValueError on a value the
    tokenizer or the checker does not know); `template_kwargs` are extra template variables (e.g.
    {"enable_thinking": False}); `label` names the template in the report. `renderer` checks that
    renderer (a session server's, built on `tokenizer` with `chat_template`) instead of a new one,
    so the decisions it caches (its incremental-suffix probe, reported as `incremental`) are made
    once and are the ones the server uses.
    """
    if cases < 1:
        raise ValueError(f"cases: must be at least 1, got {cases}")
    started = time.perf_counter()
    if renderer is None:
        renderer = ChatRenderer(tokenizer, chat_template, template_kwargs)
    elif (
        renderer.tokenizer is not tokenizer
        or (chat_template and chat_template != renderer.chat_template)
        or (template_kwargs and dict(template_kwargs) != renderer.template_kwargs)
    ):
        raise ValueError(
            "renderer: must be built on the tokenizer, chat template and template kwargs being checked"
        )
    try:
        renderer.render_text([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"chat template does not compile: {exc}") from None
    except Exception:  # a template that raises at run time is reported per conversation
        pass
    ends = [end_token] if isinstance(end_token, str) else end_token
    renderer.use_emission(parse_emission_override(renderer.emission, tokenizer, reasoning, ends, tool_format))
    groups: dict[tuple[str, str], list[tuple[Conversation, Mismatch]]] = {}
    note_groups: dict[tuple[str, str], list[tuple[Conversation, Mismatch]]] = {}
    split_points = generated_turns = 0
    for conversation in generate_conversations(cases, seed):
        result = check_conversation(renderer, conversation)
        split_points += result.split_points
        generated_turns += result.generated_turns
        for mismatch in result.mismatches:
            groups.setdefault((mismatch.property, mismatch.kind), []).append((conversation, mismatch))
        for note in result.notes:
            note_groups.setdefault((note.property, note.kind), []).append((conversation, note))
    violations = []
    for key in sorted(groups):
        conversation, mismatch = min(groups[key], key=lambda item: item[0].size())
        conversation, mismatch = _shrink(renderer, conversation, mismatch, shrink_budget)
        violations.append(_violation(tokenizer, mismatch, conversation, len(groups[key])))
    notes = []
    for key in sorted(note_groups):
        conversation, note = min(note_groups[key], key=lambda item: item[0].size())
        notes.append(_violation(tokenizer, note, conversation, len(note_groups[key])))
    return CheckReport(
        template=label or ("given template" if chat_template else "the tokenizer's chat_template"),
        emission=renderer.emission,
        cases=cases,
        seed=seed,
        split_points=split_points,
        generated_turns=generated_turns,
        violations=violations,
        notes=notes,
        elapsed_s=time.perf_counter() - started,
        incremental=renderer.incremental,
    )
