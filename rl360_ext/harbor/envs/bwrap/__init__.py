"""A Harbor environment on bubblewrap: one long-lived local sandbox per trial, no container engine.

Select it with `EnvironmentConfig(import_path=IMPORT_PATH)` (`rl360 harbor serve --env bwrap`).
The modules: `layout` (fixed names), `options`, `sandbox` (the host side: directories, tmpfs,
cgroup, holder, teardown; warm spares), `network` (slirp4netns egress), `capture` (capped reads
of its pipes), `environment` (Harbor's adapter: lifecycle, phases, commands), `files` (files in
and out), `tracer` (the verifier's traced exit), `stale` (cleanup after a killed server). The
design, its threat model and its promises are in docs/harbor.md ("The bubblewrap sandbox").
"""

from rl360_ext.harbor.envs.bwrap.capture import HeadTail, read_handshake
from rl360_ext.harbor.envs.bwrap.environment import BwrapEnvironment, MemoryLimitExceededError
from rl360_ext.harbor.envs.bwrap.layout import FILES_DIR, OWNER_FILE, SANDBOX_PATH
from rl360_ext.harbor.envs.bwrap.network import slirp4netns_executable
from rl360_ext.harbor.envs.bwrap.options import BwrapConfig
from rl360_ext.harbor.envs.bwrap.stale import clean_stale
from rl360_ext.harbor.envs.bwrap.tracer import EXIT_TAG, reported_exit

IMPORT_PATH = "rl360_ext.harbor.envs.bwrap:BwrapEnvironment"

__all__ = [
    "EXIT_TAG",
    "FILES_DIR",
    "IMPORT_PATH",
    "OWNER_FILE",
    "SANDBOX_PATH",
    "BwrapConfig",
    "BwrapEnvironment",
    "HeadTail",
    "MemoryLimitExceededError",
    "clean_stale",
    "read_handshake",
    "reported_exit",
    "slirp4netns_executable",
]
