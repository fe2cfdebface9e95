"""The append-only checker: proves or refutes, for one tokenizer and chat template, that the session
server's token-in/token-out stream equals the tokenization of the canonical render.

Owns the replay of generated conversations exactly as the session server handles them (first
prompt through `ChatRenderer.prompt_ids`; the model's turn = the tokens of the template's own render
of that assistant message after the generation prompt, through the end-of-turn token; the reply
parsed with `ChatRenderer.parse_assistant` and echoed back by the agent; each later batch of
messages through `ChatRenderer.suffix_ids`), the two properties checked on it, the classification
of violations, shrinking to the smallest failing conversation, and the report (`CheckReport`:
human summary and JSON), each in its module: `replay` (the replay and the properties),
`classify` (the kinds of violation, read from evidence), `shrink`, `report`, and `run`
(`check_template`, the whole run). It does not own rendering (`render.py`), conversation generation
(`conversations.py`) or template selection (`select.py`).

Properties, for a conversation and each generated assistant turn k:
- prefix: tokens(request k) + generated_k + suffix_ids(history, new messages) ==
  tokens(render(history + new messages, generation prompt)) at every split point;
- generation: the reply's render starts with the generation prompt, the session's parser recovers
  the tool calls, and generated_k appears verbatim in the tokens of every later request's render
  and of the final conversation's render.
"""

from rl360_ext.templates.check.classify import (
    AFTER_END,
    CONTENT_REWRITTEN,
    END_TOKEN_REWRITTEN,
    GENERATION,
    GENERATION_PROMPT,
    KINDS,
    LOOP_POSITION,
    PREFIX,
    REASONING_DROPPED,
    REASONING_REWRITTEN,
    RENDER_ERROR,
    TOKEN_BOUNDARY,
    TOOL_CALL_RESERIALIZED,
    TOOL_CALLS_NOT_PARSED,
    UNCLASSIFIED,
    KindInfo,
    Mismatch,
)
from rl360_ext.templates.check.replay import CaseResult, check_conversation, find_end_token, fit_to_emission
from rl360_ext.templates.check.report import CheckReport, TokenContext, Violation
from rl360_ext.templates.check.run import check_template

__all__ = [
    "AFTER_END",
    "CONTENT_REWRITTEN",
    "END_TOKEN_REWRITTEN",
    "GENERATION",
    "GENERATION_PROMPT",
    "KINDS",
    "LOOP_POSITION",
    "PREFIX",
    "REASONING_DROPPED",
    "REASONING_REWRITTEN",
    "RENDER_ERROR",
    "TOKEN_BOUNDARY",
    "TOOL_CALLS_NOT_PARSED",
    "TOOL_CALL_RESERIALIZED",
    "UNCLASSIFIED",
    "CaseResult",
    "CheckReport",
    "KindInfo",
    "Mismatch",
    "TokenContext",
    "Violation",
    "check_conversation",
    "check_template",
    "find_end_token",
    "fit_to_emission",
]
