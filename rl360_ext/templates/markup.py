"""Chat markup of the ChatML / Qwen family: turn, reasoning and tool-call tokens.

Owns the special-token strings that the parser, the renderer and the fixed templates share, and
that the tiny engine's tokenizer (`rl360_ext.reference.engine.tokenizer`) is built with. It does not own
rendering (`render.py`) or parsing (`parse.py`).
"""

from __future__ import annotations

END_OF_TEXT = "<|endoftext|>"
TURN_START = "<|im_start|>"
TURN_END = "<|im_end|>"
THINK_START = "<think>"
THINK_END = "</think>"
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOL_RESPONSE_START = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"
SPECIAL_TOKENS = (
    END_OF_TEXT,
    TURN_START,
    TURN_END,
    THINK_START,
    THINK_END,
    TOOL_CALL_START,
    TOOL_CALL_END,
    TOOL_RESPONSE_START,
    TOOL_RESPONSE_END,
)
