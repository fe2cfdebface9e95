"""The content digest of a task directory: what a cached audit result and a control are keyed by.

Owns `task_digest`: sha256 over every regular file of a tree (relative path and bytes, in path
order), links hashed by their target text, so a changed task never reuses a cached result. The
task audit (`rl360_ext.tasks.audit`) keys its cache and its `task_health.jsonl` by it; the Harbor
server computes it over a task's snapshot to find that audit evidence (`rl360_ext.harbor.controls`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def task_digest(task_dir: Path) -> str:
    """sha256 over every regular file of a task (relative path and bytes, in path order); links
    are hashed by their target text, so a changed task never reuses a cached result."""
    digest = hashlib.sha256()
    for path in sorted(p for p in task_dir.rglob("*") if p.is_symlink() or p.is_file()):
        rel = path.relative_to(task_dir).as_posix().encode()
        body = b"link:" + str(path.readlink()).encode() if path.is_symlink() else path.read_bytes()
        digest.update(len(rel).to_bytes(8, "big") + rel + len(body).to_bytes(8, "big") + body)
    return digest.hexdigest()
