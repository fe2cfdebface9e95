"""Dataclass field docstrings (the string literal right below a field), read from the class source.

Owns `field_docs`, so a config dataclass can be the single place a field's help text is written
and a CLI derives its flags' help from it (the session, Harbor and engine servers' flags all do),
`flag_of`, the one rule for a field's flag name (`--<metadata flag or field name>`, underscores
as dashes), which the configs' own error messages use too, and `field_flags`, field values back as
those flags (a config handed to a process that builds it from its command line).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import textwrap
from collections.abc import Mapping
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


def field_flags(cls: type, values: Mapping[str, Any]) -> tuple[str, ...]:
    """`values` of fields of the config dataclass `cls` as the flags the CLI derives from them
    (`rl360_ext.cli.fields`): the flag and the value's text, a repeatable field's flag once per item,
    a true bool its flag alone; None, or a false bool whose field defaults to false, adds nothing.
    ValueError names a key that is not a field of `cls`, or a bool no flag can set."""
    specs = {spec.name: spec for spec in dataclasses.fields(cls)}
    flags: list[str] = []
    for name, value in values.items():
        spec = specs.get(name)
        if spec is None:
            raise ValueError(f"{name!r} is not a {cls.__name__} field")
        if value is None or (value is False and spec.default is False):
            continue
        if isinstance(value, bool):
            if value is not True:
                raise ValueError(f"{name}: no flag turns it off (its default is {spec.default!r})")
            flags.append(flag_of(spec))
            continue
        for item in value if isinstance(value, tuple) else (value,):
            flags += [flag_of(spec), str(item)]
    return tuple(flags)
