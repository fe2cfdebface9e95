"""The fixed names every part of the bwrap sandbox agrees on: the PATH it and the host-side
processes run with, its user, its host directory's layout and its writable directories."""

from __future__ import annotations

import tempfile
from pathlib import Path

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SANDBOX_UID = 1000  # the sandbox user inside its user namespace
DEFAULT_HOST_UID = 65534  # the unprivileged host uid the sandbox runs as (nobody)
OWNER_FILE = ".rl360-owner"  # in each sandbox dir (host-only): the tag of the server that made it
FILES_DIR = "fs"  # in each sandbox dir: the mount point of the sandbox's tmpfs
SCRATCH_DIR = "/tmp"  # the sandbox's HOME and tmp: emptied before grading
_WRITABLE_DIRS = ("/app", "/logs", "/tests", "/solution", SCRATCH_DIR)
_LOG_DIRS = ("logs/agent", "logs/verifier", "logs/artifacts")
_GRADED_DIRS = ("/tests", "/logs")  # with the workdir: given back to the sandbox user before grading
_READY_TIMEOUT_S = 30.0


def default_sandbox_root() -> Path:
    return Path(tempfile.gettempdir()) / "rl360-sandboxes"
