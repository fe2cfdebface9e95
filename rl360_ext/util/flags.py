"""Flag values several components parse: KEY=VALUE pairs (`--env-kwarg`, `--kwarg`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


def key_values(pairs: Sequence[str]) -> dict[str, Any]:
    """KEY=VALUE pairs; VALUE is read as JSON when it parses (true, 3, "x"), else as a string.
    Raises ValueError naming the first pair that is not KEY=VALUE."""
    parsed: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {pair!r}")
        try:
            parsed[key] = json.loads(value)
        except ValueError:
            parsed[key] = value
    return parsed
