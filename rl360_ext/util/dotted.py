"""Loading a hook by its dotted path, as Miles' `load_function` reads its `--custom-*-path` flags.

Owns `load_function("package.module.attr")`: the module imported, the attribute returned, and a
ValueError naming the flag when the path has no module part or the attribute is missing. It
does not decide which hooks exist or what they are called with.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def load_function(path: str, flag: str = "a hook path") -> Callable[..., Any]:
    """The attribute `path` names (`module.attr`); ValueError naming `flag` when it cannot."""
    module, _, attr = path.rpartition(".")
    if not module or not attr:
        raise ValueError(f"{flag} must be module.function, got {path!r}")
    loaded = importlib.import_module(module)
    if not hasattr(loaded, attr):
        raise ValueError(f"{flag}: module {module!r} has no attribute {attr!r}")
    return getattr(loaded, attr)
