"""Where rl360 keeps results it can compute again, and how one is written safely.

Owns the cache root (`$RL360_CACHE_DIR`, else `$XDG_CACHE_HOME/rl360`, else `~/.cache/rl360`)
and an atomic write (a temporary file in the same folder, then a rename), so processes that fill
the same entry at once never leave a half-written file. What goes in an entry, and the key that
makes a stale entry impossible to hit, belong to its owner (e.g. `rl360_ext.local.demo.trainer`'s
warm start).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

CACHE_DIR_ENV = "RL360_CACHE_DIR"


def cache_root() -> Path:
    """The folder rl360's caches live under (not created here)."""
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "rl360"


def write_atomically(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Create `path` (and its folders) with what `write` writes, all or nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
