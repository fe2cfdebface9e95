"""Shrinking a failing conversation: the smallest variant (`conversations.shrink_candidates`)
that still shows the same property and kind of violation."""

from __future__ import annotations

from rl360_ext.templates.check.classify import Mismatch
from rl360_ext.templates.check.replay import check_conversation
from rl360_ext.templates.conversations import Conversation, shrink_candidates
from rl360_ext.templates.render import ChatRenderer


def _shrink(
    renderer: ChatRenderer, conversation: Conversation, mismatch: Mismatch, budget: int
) -> tuple[Conversation, Mismatch]:
    """Greedy: keep the first smaller variant that still shows the same property and kind."""
    key = (mismatch.property, mismatch.kind)
    tried = 0
    improved = True
    while improved and tried < budget:
        improved = False
        size = conversation.size()
        for candidate in shrink_candidates(conversation):
            if candidate.size() >= size:
                continue
            tried += 1
            found = [
                m for m in check_conversation(renderer, candidate).mismatches if (m.property, m.kind) == key
            ]
            if found:
                conversation, mismatch, improved = candidate, found[0], True
                break
            if tried >= budget:
                break
    return conversation, mismatch
