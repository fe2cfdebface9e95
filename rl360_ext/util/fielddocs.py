"""Dataclass field docstrings (the string literal right below a field), read from the class source.

Owns `field_docs`, so a config dataclass can be the single place a field's help text is written
and a CLI derives its flags' help from it (the session, Harbor and engine servers' flags all do),
and `flag_of`, the one rule for a field's flag name (`--<metadata flag or field name>`, underscores
as dashes), which the configs' own error messages use too.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import textwrap
from typing import Any


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """{field name: its docstring, whitespace-joined} for every annotated field of `cls` followed by
    a string literal."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, following in itertools.pairwise(body):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        if (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def flag_of(spec: dataclasses.Field[Any]) -> str:
    """The flag of a config field: `--` and its metadata `flag` (else its name), underscores as dashes."""
    return "--" + str(spec.metadata.get("flag", spec.name)).replace("_", "-")
