"""Chat templates: token-in/token-out rendering, output parsing, the append-only checker, and the
fixed templates.

The names below are imported lazily, so `import rl360_ext.templates` (done by the `rl360` command)
stays cheap: `check_template`, `CheckReport`, `Violation` (check/), `fixed_template_for`,
`fixed_template`, `choose_fixed_template` (select.py), `ChatRenderer`,
`TemplateNotAppendOnlyError` (render.py), `parse_assistant`, `ParsedAssistant` (parse.py).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "check_template": "check",
    "CheckReport": "check",
    "Violation": "check",
    "fixed_template_for": "select",
    "fixed_template": "select",
    "choose_fixed_template": "select",
    "ChatRenderer": "render",
    "TemplateNotAppendOnlyError": "render",
    "parse_assistant": "parse",
    "ParsedAssistant": "parse",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)
