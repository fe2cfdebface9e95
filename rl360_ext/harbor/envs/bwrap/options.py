"""The bwrap environment's options (`--env-kwarg`, checked when a server starts): their names,
defaults and bounds. docs/harbor.md lists them with what each limits."""

from __future__ import annotations

from typing import Literal

from harbor.environments.options import EnvironmentOptions
from pydantic import Field

from rl360_ext.harbor.envs.bwrap.layout import DEFAULT_HOST_UID


class BwrapConfig(EnvironmentOptions):
    sandbox_root: str | None = Field(default=None, description="Host dir for per-trial sandbox dirs.")
    allow_network: bool = Field(default=False, description="Give 'public' network tasks the host network.")
    node_label: str | None = Field(default=None, description="Placement label (logged; one local node).")
    limits: Literal["auto", "cgroup", "watchdog"] = Field(
        default="auto", description="How to enforce limits."
    )
    sandbox_uid: int = Field(
        default=DEFAULT_HOST_UID, ge=1, description="Unprivileged host uid (and gid) the sandbox runs as."
    )
    max_file_mb: int = Field(default=64, ge=1, description="Largest file copied out of a sandbox.")
    max_copy_mb: int = Field(default=256, ge=1, description="Bytes copied out of a sandbox per download.")
    max_copy_inodes: int = Field(
        default=10_000, ge=1, description="Files and directories copied out per download."
    )
    max_copy_s: float = Field(
        default=5.0,
        gt=0,
        description="Seconds one download may copy for (a trial has three; keep 2x within --margin-s).",
    )
    max_pids: int = Field(default=1024, ge=8, description="Processes and threads one sandbox may run.")
    disk_mb: int = Field(
        default=1024, ge=1, description="Size of the sandbox's tmpfs (all its writable dirs); RLIMIT_FSIZE."
    )
    max_inodes: int = Field(
        default=65_536, ge=64, description="Files and directories the sandbox may create."
    )
    seccomp: bool = Field(
        default=True, description="Refuse bpf, perf_event_open and io_uring in the sandbox (seccomp)."
    )
    max_output_kb: int = Field(
        default=1024, ge=1, description="Output kept per command and stream (its head and tail)."
    )
    warm_sandboxes: int = Field(
        default=0,
        ge=0,
        description=(
            "Sandboxes kept started ahead of the trials that take them (per server, of the shapes "
            "last started); 0: every trial starts its own."
        ),
    )
    warm_max_age_s: float = Field(
        default=300.0, gt=0, description="A warm sandbox older than this is discarded, not taken."
    )
    verifier_disk_mb: int = Field(
        default=64,
        ge=0,
        description=(
            "Bytes added to the sandbox's tmpfs when grading starts: the verifier's own disk, "
            "which an agent that filled `disk_mb` cannot take."
        ),
    )
    verifier_inodes: int = Field(
        default=4096,
        ge=0,
        description="Inodes added to the sandbox's tmpfs when grading starts (the verifier's own).",
    )
