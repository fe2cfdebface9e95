"""Cleaning up after a server killed without teardown: its sandboxes' directories and cgroups,
found by the tag each carries (the server's pid and start time), removed when that server is
gone. A server runs it when it starts."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from rl360_ext.harbor.envs import nofollow
from rl360_ext.harbor.envs.bwrap.layout import FILES_DIR, OWNER_FILE, default_sandbox_root
from rl360_ext.harbor.envs.bwrap.sandbox import _remove_host_dir
from rl360_ext.harbor.envs.limits import clean_stale_cgroups, owner_alive, unmount


def clean_stale(sandbox_root: Path | None = None) -> list[str]:
    """Remove sandbox directories and cgroups whose server is gone (killed without teardown);
    returns what was removed. Directories of live servers, and untagged ones, are kept."""
    root = sandbox_root or default_sandbox_root()
    removed = clean_stale_cgroups()
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(root):
            if not entry.is_dir(follow_symlinks=False):
                continue
            try:
                tag = nofollow.read_regular(Path(entry.path) / OWNER_FILE, 256).decode().strip()
            except (OSError, ValueError):
                continue
            if not owner_alive(tag):
                with contextlib.suppress(OSError):
                    unmount(Path(entry.path) / FILES_DIR)
                _remove_host_dir(Path(entry.path))
                removed.append(entry.path)
    return removed
