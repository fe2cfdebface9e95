"""rl360's one exception root: every exception class in `rl360_ext` derives from `Rl360Error`.

Owns the project-level base and nothing else, so a caller (the CLI, a Ray actor, a Miles hook)
can catch everything rl360 raises with one `except Rl360Error`. The three servers each own an
error tree under it whose classes carry the HTTP status their adapter answers with:

- `rl360_ext.session.errors.SessionServerError` (the session server),
- `rl360_ext.harbor.errors.HarborRequestError` (the Harbor /run server),
- `rl360_ext.reference.engine.errors.EngineError` (the tiny and instant engine stand-ins).

Errors that are not a request's (startup, CLI flags, clients, sandbox walks) derive from
`Rl360Error` directly, keeping the builtin base (`ValueError`, `RuntimeError`, ...) that says
what they are. The one exception outside it is `rl360_ext.util.signals.Terminated`, a
`SystemExit`, which `except Exception` must not catch. docs/errors.md lists the trees;
tests/foundation/test_error_trees.py holds the contract. This module imports nothing.
"""

from __future__ import annotations


class Rl360Error(Exception):
    """Base of every exception rl360 raises (see the module docstring for the trees under it)."""
