"""A Harbor environment on bubblewrap: one long-lived local sandbox per trial, no container engine.

Owns starting, entering, limiting and tearing down one sandbox, moving files in and out without
following anything the sandbox planted, and cleaning what a killed server left behind. It does
not own task semantics or scoring. Select it with
`EnvironmentConfig(import_path="rl360_ext.harbor.envs.bwrap:BwrapEnvironment")`
(`rl360 harbor serve --env bwrap`).

Design (the sandboxed code is hostile: the policy wrote it)
- Identity: the server runs as root; bwrap is started as an unprivileged host uid
  (`sandbox_uid`, default 65534) with a scrubbed environment (PATH only: `/proc/1/environ` shows
  nothing of the server's), in its own user namespace where the sandbox user is uid/gid 1000.
  No capability, no uid 0 inside, no further user namespaces (`--disable-userns`), a fresh
  `/proc` with `/proc/sys` read-only, `no_new_privs`.
- `start` launches `bwrap --unshare-all` around a holder process (`sleep infinity`). The holder
  keeps the sandbox's user, mount, PID, IPC, UTS and network namespaces alive, so state that
  lives in processes survives between commands (terminus-2's tmux server).
- `exec` enters the mount, UTS, IPC, network and PID namespaces with `nsenter` as root (bwrap
  nests its user namespaces, so only an ancestor can enter those), changes root to the sandbox's
  root, drops to the sandbox's host uid, enters the sandbox's user namespace, sets
  `no_new_privs` and runs `bash -c` as uid 1000. Every command runs as that one user, whatever
  `user` Harbor asks for. The command's environment travels in a file descriptor and is applied
  inside the sandbox only; the host-side processes (root) run with PATH only, by absolute path.
  Each command runs in its own host process group, killed on timeout or cancellation.
- `end_phase` kills every process of the sandbox (the holder is PID 1 of its namespace: the
  kernel kills the rest and no fork survives), empties the directories it is given, and has the
  next command start a fresh holder (fresh namespaces of every kind) over the same directories
  first: nothing runs in the sandbox between a phase end and that command, and two phase ends
  in a row (the agent's, then grading's) start one holder, not two. The /run server
  calls it when the agent phase ends and again with `grading=True` when the verifier starts,
  emptying /logs/verifier, /tests and /solution; grading also empties /tmp, resets modes and
  grows the tmpfs by the verifier's reserve (see `end_phase`). What the agent can
  hand the verifier is its work product only: the workdir (/app by default), /logs/agent and
  /logs/artifacts; no process, no file in HOME, /tmp, /tests or /solution, no namespace state.
- Filesystem: host /usr read-only (with the /bin, /lib, /lib64, /sbin links), a curated read-only
  /etc, a private /proc and /dev. Writable: /app, /logs (with /logs/agent, /logs/verifier,
  /logs/artifacts), /tests, /solution, /tmp and the task's workdir; each is a directory owned by
  `sandbox_uid` on the sandbox's own tmpfs (host-mounted under its sandbox dir, `disk_mb` bytes
  and `max_inodes` inodes at most, nosuid, nodev), so a full disk is the sandbox's alone. No
  trial directory is bind-mounted: Harbor downloads the log directories through
  `download_dir`, which copies regular files and directories only (capped in bytes, inodes and
  seconds), opened with O_NOFOLLOW one component at a time (`rl360_ext.harbor.envs.nofollow`).
  Uploads replace what is in the way and never write through a link. `is_dir`/`is_file` on a
  writable directory's path are answered the same way on the host, without a command.
- Network: none (a private network namespace with loopback only). A task whose
  `[environment] network_mode` is "public" gets egress only when the server allows it
  (`allow_network=true`): its own network namespace, NATed by `slirp4netns` (run as the
  sandbox's unprivileged uid, `--disable-host-loopback`), with unreachable routes for
  link-local 169.254.0.0/16 and every address of the host's own interfaces; never the host's
  namespace. Without slirp4netns such a task is refused at start. Without `allow_network` it
  runs offline. "allowlist" is rejected (not enforceable).
- Limits: the trial's reservation (task `cpus`/`memory_mb`, or the server's overrides) is
  enforced by `rl360_ext.harbor.envs.limits` (a child cgroup, else a watchdog). A memory limit
  hit makes the phase's next `exec` raise `MemoryLimitExceededError`; `limit_hits()` lists
  every limit hit by phase (docs/harbor.md). Every command runs under RLIMIT_NPROC
  (`max_pids`, counted in the sandbox's own user namespace, plus the cgroup's pids.max where
  there is a pids controller) and RLIMIT_FSIZE (`disk_mb`). A command's stdout and stderr are
  pipes read while it runs; at most `max_output_kb` of each is kept (its head and tail).
- Environment definition: there is no image to build. `environment/app/` (if present) is copied
  into /app, then `environment/setup.sh` (if present) runs inside the sandbox as the sandbox
  user with the task's env and network policy; a non-zero exit fails the start
  (`SandboxBuildFailedError`). Links in the task are never followed (the catalog refuses links
  that leave the task directory). `environment/Dockerfile`, `docker-compose.yaml` and
  `[environment] docker_image` are ignored: the host's /usr is the image.
- Warm sandboxes (`warm_sandboxes`): a sandbox's start depends only on its shape (options,
  workdir, reservation), so the server can keep sandboxes started ahead of the trials
  (`rl360_ext.harbor.envs.warm`); a trial of that shape takes one (`WarmSpare.hand_to`) instead
  of starting its own. Nothing but the holder ran in it: it is the sandbox a cold start makes.
  Tasks with network always start their own.
- Teardown: `stop` SIGKILLs the holder, waits until no process of the PID namespace is left,
  removes the cgroup and, with `delete`, the sandbox's host directories. Each sandbox directory
  and cgroup is tagged with its server's pid and start time; `clean_stale` (run when a server
  starts) removes those whose server is gone (after a SIGKILL).

- Kernel surface: with `seccomp` (the default) every sandbox process runs under
  `rl360_ext.harbor.envs.seccomp`'s filter: bpf, perf_event_open and io_uring fail with EPERM
  (bwrap `--seccomp` for the holder; the host-side process that enters the sandbox loads it
  before it execs nsenter, so every command inherits it).

Not promised: CPU time beyond the reservation's quota; the sandboxed code shares the host kernel
(the seccomp filter refuses only the calls above) and sees the host's /usr. The tmpfs is memory:
in cgroup mode its pages count against the sandbox's memory reservation.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import ipaddress
import json
import logging
import os
import select
import shutil
import signal
import stat
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar, Literal

from harbor.environments.base import BaseEnvironment, ExecResult, SandboxBuildFailedError
from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
from harbor.environments.options import EnvironmentOptions
from harbor.models.task.config import NetworkMode
from harbor.utils.path_filter import filter_paths_by_patterns
from pydantic import Field

from rl360_ext.harbor.envs import nofollow, seccomp, warm
from rl360_ext.harbor.envs.limits import (
    SandboxLimits,
    clean_stale_cgroups,
    make_limits,
    mount_tmpfs,
    owner_alive,
    owner_tag,
    pids_in_namespace,
    remount_tmpfs,
    rlimit_argv,
    unmount,
)
from rl360_ext.outcomes.attribution import LimitHit, Phase, Resource

IMPORT_PATH = "rl360_ext.harbor.envs.bwrap:BwrapEnvironment"
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SANDBOX_UID = 1000  # the sandbox user inside its user namespace
DEFAULT_HOST_UID = 65534  # the unprivileged host uid the sandbox runs as (nobody)
OWNER_FILE = ".rl360-owner"  # in each sandbox dir (host-only): the tag of the server that made it
FILES_DIR = "fs"  # in each sandbox dir: the mount point of the sandbox's tmpfs
SCRATCH_DIR = "/tmp"  # the sandbox's HOME and tmp: emptied before grading
_WRITABLE_DIRS = ("/app", "/logs", "/tests", "/solution", SCRATCH_DIR)
_LOG_DIRS = ("logs/agent", "logs/verifier", "logs/artifacts")
_GRADED_DIRS = ("/tests", "/logs")  # with the workdir: given back to the sandbox user before grading
_FULL_BYTES = 64 * 1024  # a tmpfs with less free than this is full (no useful write fits)
_PIDS_SLACK = 64  # RLIMIT_NPROC above a cgroup's pids.max: the cgroup refuses first, and counts it
_ETC_FILES = (
    "passwd",
    "group",
    "hosts",
    "resolv.conf",
    "nsswitch.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl",
    "ca-certificates",
    "alternatives",
    "localtime",
    "bash.bashrc",
    "profile",
    "profile.d",
    "inputrc",
    "terminfo",
    "mime.types",
    "os-release",
    "debian_version",
    "login.defs",
)
# Inside the sandbox: read the command's environment (NUL-separated KEY=VALUE) from fd $1, close
# it, and exec the command with exactly that environment.
_ENV_LOADER = (
    'fd=$1; shift; entries=(); while IFS= read -r -d "" entry; do entries+=("$entry"); done <&"$fd"; '
    'exec {fd}<&-; exec /usr/bin/env -i -- "${entries[@]}" "$@"'
)
_READY_TIMEOUT_S = 30.0
_HANDSHAKE_CAP = 4000  # bytes read of a holder's info, first line and stderr at start
_SETUP_SCRIPT_CAP = 1 << 20
_PIPE_BYTES = 1 << 20  # asked-for pipe buffer of a command's stdout/stderr (fewer wake-ups)
_F_SETPIPE_SZ = 1031
_NS_GET_USERNS = 0xB701  # ioctl on a namespace fd: the user namespace that owns it
_IP = "/usr/sbin/ip"
_NSENTER = "/usr/bin/nsenter"
_LINK_LOCAL = ("169.254.0.0/16",)
_log = logging.getLogger(__name__)
_PYTHON = "/usr/bin/python3"  # the host's, which every sandbox sees (/usr is the image)
EXIT_TAG = "rl360-exit="  # a line `<tag><exit code>`: a command's exit code, told before its kill
# `exec_and_end`'s tracer, run in the sandbox as its user: runs argv[2:] traced with
# PTRACE_O_TRACEEXIT, so it stops as it begins to exit (before its descriptors close: nothing it
# left can have seen it go); prints `<tag><exit code>` and kills every process it may signal
# (never as uid 0: the sandbox's user is not root). Signals are delivered to it as usual.
_TRACER = r"""
import os, signal, sys
try:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
except Exception:  # no tracing here: run the command untraced (the host still kills after it)
    os.execv(sys.argv[2], sys.argv[2:])
def end(status):
    code = os.waitstatus_to_exitcode(status)
    print(f"{sys.argv[1]}{code if code >= 0 else 128 - code}", flush=True)
    if os.getuid() != 0:
        os.kill(-1, signal.SIGKILL)
    os._exit(0)
pid = os.fork()
if pid == 0:
    libc.ptrace(0, 0, None, None)  # PTRACE_TRACEME; untraced if refused: the tracer only ends later
    try:
        os.execv(sys.argv[2], sys.argv[2:])
    finally:
        os._exit(127)
_, status = os.waitpid(pid, 0)
if os.WIFSTOPPED(status):  # at its exec: PTRACE_O_TRACEEXIT | PTRACE_O_TRACEEXEC | PTRACE_O_EXITKILL
    libc.ptrace(0x4200, pid, None, ctypes.c_void_p(0x40 | 0x10 | 0x100000))
    libc.ptrace(7, pid, None, None)
info = ctypes.create_string_buffer(128)
message = ctypes.c_ulong()
while not os.WIFEXITED(status) and not os.WIFSIGNALED(status):
    _, status = os.waitpid(pid, 0)
    if os.WIFSTOPPED(status):
        event = status >> 16
        if event == 6:  # PTRACE_EVENT_EXIT: its exit status
            libc.ptrace(0x4201, pid, None, ctypes.byref(message))
            end(message.value)
        signalled = not event and libc.ptrace(0x4202, pid, None, info) == 0  # not an event, nor a group-stop
        libc.ptrace(7, pid, None, ctypes.c_void_p(os.WSTOPSIG(status) if signalled else 0))
end(status)
"""


class MemoryLimitExceededError(RuntimeError):
    """A process of the current phase hit the sandbox's memory reservation (raised by every
    command of that phase once it happened; a later phase starts clean). The name matches
    Harbor's own: its error policy is keyed by exception type name (retry: yes, grade: no,
    valid reward: no)."""


class BwrapOptions(EnvironmentOptions):
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


def bwrap_executable() -> str | None:
    return shutil.which("bwrap")


def slirp4netns_executable() -> str | None:
    return shutil.which("slirp4netns", path=SANDBOX_PATH)


@functools.cache
def _bwrap_path() -> str:
    """bwrap as every sandbox starts it, looked up on PATH once per process."""
    return bwrap_executable() or "bwrap"


@functools.cache
def _host_view_argv() -> tuple[str, ...]:
    """The read-only host part of every sandbox's bwrap argv, built once per process (it is the
    same for every sandbox): /usr, the /bin, /lib, /lib64, /sbin links (or directories) as this
    host has them, and the curated /etc files. Those are `--ro-bind-try`: bwrap binds each that
    exists when the sandbox starts and skips one that does not, as the existence check made here
    at every start did, without a stat per file per start."""
    argv = ["--ro-bind", "/usr", "/usr"]
    for link in ("bin", "lib", "lib64", "sbin"):
        host = Path("/") / link
        if host.is_symlink():
            argv += ["--symlink", os.readlink(host), f"/{link}"]
        elif host.is_dir():
            argv += ["--ro-bind", str(host), f"/{link}"]
    for name in _ETC_FILES:
        argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return tuple(argv)


def _remove_host_dir(path: Path) -> None:
    """Remove a sandbox's host directory (its tmpfs unmounted) without following a link in it,
    iteratively; what cannot be removed stays (for `clean_stale`)."""
    with contextlib.suppress(OSError, nofollow.SandboxTreeError):
        parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            nofollow.remove_entry(parent, path.name)
        finally:
            os.close(parent)


def default_sandbox_root() -> Path:
    return Path(tempfile.gettempdir()) / "rl360-sandboxes"


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


class _Sandbox:
    """One sandbox's host side: its directories and tmpfs, its cgroup, its holder (and
    slirp4netns), entering nothing. `BwrapEnvironment` is one with Harbor's interface on top;
    a `WarmSpare` is one no trial has taken yet. What `_STATE` names is the started sandbox:
    a trial's environment takes a spare's over (`WarmSpare.hand_to`)."""

    _STATE = (
        "sandbox_dir",
        "files_dir",
        "_limits",
        "_holder",
        "_holder_pipes",
        "_init_pid",
        "_init_pidfd",
        "_pidns",
        "_pidns_fd",
    )
    options: BwrapOptions
    session_id: str
    workdir: str
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger]

    def _init_sandbox(self, options: BwrapOptions, session_id: str, workdir: str) -> None:
        self.options = options
        self.session_id = session_id
        self.workdir = workdir
        self._holder: asyncio.subprocess.Process | None = None
        self._holder_pipes: tuple[int, ...] = ()  # read ends of its stdout and stderr
        self._init_pid: int | None = None
        self._init_pidfd: int | None = None  # the init, however its pid is reused once it is gone
        self._pidns: int | None = None
        self._pidns_fd: int | None = None  # keeps the namespace (and so its inode number) alive
        self._limits: SandboxLimits = SandboxLimits()
        self._slirp: asyncio.subprocess.Process | None = None
        self._slirp_exit_fd: int | None = None
        self._slirp_log: _Capture | None = None  # its stderr, read as it comes (bounded)
        root = Path(options.sandbox_root) if options.sandbox_root else default_sandbox_root()
        self.sandbox_dir = root / session_id
        self.files_dir = self.sandbox_dir / FILES_DIR
        self.owner: nofollow.Owner = (options.sandbox_uid, options.sandbox_uid)

    @property
    def network_enabled(self) -> bool:
        return False

    async def _create(self, cpus: float | None, memory_mb: int | None) -> None:
        """Make the directories, tmpfs and limits, and start the holder (raises
        SandboxBuildFailedError; the caller tears down what was made)."""
        await asyncio.to_thread(self._make_dirs)
        self._limits = make_limits(
            self.options.limits, f"{owner_tag()}.{self.session_id}", cpus, memory_mb, self.options.max_pids
        )
        await self._launch()

    async def _remove(self, delete: bool) -> None:
        """After `_kill_sandbox`: remove the cgroup and, with `delete`, the directories."""
        self._limits.detach()  # on the loop: a watchdog's poller is a task of it
        try:
            await asyncio.to_thread(self._release, delete)
        finally:
            self._unpin_pidns()

    def _writable_mounts(self) -> list[tuple[PurePosixPath, Path]]:
        """(sandbox path, host path) of every writable mount, deepest first."""
        mounts = {PurePosixPath(d): self.files_dir / d.strip("/") for d in _WRITABLE_DIRS}
        workdir = PurePosixPath(self.workdir)
        if not any(workdir == m or m in workdir.parents for m in mounts):
            mounts[workdir] = self.files_dir / "workdir"
        return sorted(mounts.items(), key=lambda item: len(item[0].parts), reverse=True)

    def _host_path(self, sandbox_path: str) -> tuple[Path, PurePosixPath]:
        """The writable mount's host root and the path relative to it for a sandbox path."""
        path = PurePosixPath(sandbox_path)
        if not path.is_absolute():
            path = PurePosixPath(self.workdir) / path
        for target, source in self._writable_mounts():
            if path == target or target in path.parents:
                return source, path.relative_to(target)
        raise PermissionError(
            f"{sandbox_path} is not in a writable sandbox directory ({', '.join(_WRITABLE_DIRS)})"
        )

    def _bwrap_argv(self, info_fd: int, seccomp_fd: int | None) -> list[str]:
        uid = self.options.sandbox_uid
        argv = [
            "/usr/bin/env",
            "-i",  # bwrap is PID 1 inside: its environ is readable there; nothing of ours may be in it
            f"PATH={SANDBOX_PATH}",
            "/usr/bin/setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "--",
            _bwrap_path(),
            "--die-with-parent",
            "--new-session",
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",  # no nested user namespace: no "root" of its own to probe the kernel with
            "--uid",
            str(SANDBOX_UID),
            "--gid",
            str(SANDBOX_UID),
            "--cap-drop",
            "ALL",
            "--hostname",
            "sandbox",
            *_host_view_argv(),
        ]
        argv += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev"]
        for target, source in reversed(self._writable_mounts()):
            argv += ["--bind", str(source), str(target)]
        argv += ["--remount-ro", "/dev", "--remount-ro", "/"]  # only the binds above stay writable
        argv += [
            "--chdir",
            "/",  # not the workdir: a phase that chmods it away cannot stop the next holder
            "--clearenv",
            "--setenv",
            "PATH",
            SANDBOX_PATH,
            "--info-fd",
            str(info_fd),
        ]
        if seccomp_fd is not None:
            argv += ["--seccomp", str(seccomp_fd)]
        return [*argv, "--", "/bin/sh", "-c", "echo ready; exec sleep infinity"]

    def _make_dirs(self) -> None:
        self.sandbox_dir.parent.mkdir(parents=True, exist_ok=True, mode=0o711)
        for directory in (self.sandbox_dir.parent, *self.sandbox_dir.parent.parents):
            if not os.stat(directory).st_mode & stat.S_IXOTH:
                raise SandboxBuildFailedError(
                    f"{directory} is not searchable by others: bwrap runs as uid "
                    f"{self.options.sandbox_uid} and must reach sandbox_root {self.sandbox_dir.parent}"
                )
        if self.sandbox_dir.exists():
            self._remove_dirs()
        self.sandbox_dir.mkdir(mode=0o711)
        (self.sandbox_dir / OWNER_FILE).write_text(owner_tag())
        self.files_dir.mkdir(mode=0o711)
        try:
            mount_tmpfs(self.files_dir, self.options.disk_mb * 2**20, self.options.max_inodes)
        except OSError as exc:
            raise SandboxBuildFailedError(
                f"{exc}; the bwrap environment caps each sandbox's disk with its own tmpfs (needs root "
                "with CAP_SYS_ADMIN in the host's mount namespace)"
            ) from exc
        for _, source in self._writable_mounts():
            relative = PurePosixPath(source.relative_to(self.files_dir).as_posix())
            os.close(nofollow.open_dir(self.files_dir, relative, create=True, owner=self.owner))
        for name in _LOG_DIRS:
            os.close(nofollow.open_dir(self.files_dir, PurePosixPath(name), create=True, owner=self.owner))
        workdir_root, workdir = self._host_path(self.workdir)  # a workdir inside a writable dir
        os.close(nofollow.open_dir(workdir_root, workdir, create=True, owner=self.owner))
        with nofollow.opened_dir(self.files_dir, PurePosixPath(SCRATCH_DIR.strip("/"))) as tmp_fd:
            os.fchmod(tmp_fd, 0o1777)

    def _remove_dirs(self) -> None:
        """Unmount the sandbox's tmpfs and remove its host directory."""
        unmount(self.files_dir)
        _remove_host_dir(self.sandbox_dir)

    async def _launch(self) -> None:
        """Start a holder and wait until its sandbox runs. bwrap's info, the holder's "ready" line
        and, on failure, bwrap's stderr are read by one blocking read off the event loop: a start
        waits for the loop twice (the spawn, the result), not once per pipe event, which under a
        busy loop (a replica running many trials) is most of a start's time."""
        info_r, info_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        filter_fd = None
        if self.options.seccomp:
            filter_fd = os.memfd_create("rl360-seccomp")
            os.write(filter_fd, seccomp.program())
            os.lseek(filter_fd, 0, os.SEEK_SET)
        passed = (info_w,) if filter_fd is None else (info_w, filter_fd)
        # ours until the holder is gone (a late write by bwrap never meets a closed pipe)
        self._holder_pipes = (out_r, err_r)
        try:
            self._holder = await asyncio.create_subprocess_exec(
                *self._limits.wrap(self._bwrap_argv(info_w, filter_fd)),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                pass_fds=passed,
                start_new_session=True,
                env={"PATH": SANDBOX_PATH},
                cwd="/",
            )
        except BaseException:
            os.close(info_r)
            raise
        finally:
            for fd in (*passed, out_w, err_w):
                os.close(fd)
        # the thread owns (and closes) its descriptors: one still blocked in it after a
        # cancelled start never reads a number this process reused
        info_raw, ready, stderr = await asyncio.to_thread(
            read_handshake, info_r, os.dup(out_r), os.dup(err_r), _READY_TIMEOUT_S
        )
        if ready.strip() != b"ready" or not info_raw:
            raise SandboxBuildFailedError(
                f"bubblewrap failed to start: {stderr.decode(errors='replace').strip()}"
            )
        started = json.loads(info_raw)
        self._init_pid = int(started["child-pid"])
        self._pidns = int(started["pid-namespace"])
        self._pin_pidns()
        self._limits.attach(self._pidns)
        if self.network_enabled:
            await self._start_slirp()
        self.logger.debug(
            "sandbox %s up: pid %s, limits %s, pids %s, network %s, node %s",
            self.session_id,
            self._init_pid,
            self._limits.mode,
            self._limits.pids_mode,
            "slirp4netns" if self.network_enabled else "none",
            self.options.node_label,
        )

    async def _start_slirp(self) -> None:
        """NAT egress for the sandbox's own network namespace: slirp4netns, run as the sandbox's
        unprivileged host uid inside the user namespace that owns the network namespace, with
        host loopback refused; then unreachable routes for link-local and the host's own
        addresses. It exits when `_slirp_exit_fd` closes (or this process dies)."""
        uid = self.options.sandbox_uid
        try:
            blocked_networks = self._blocked_networks()
        except (OSError, ValueError) as exc:
            raise SandboxBuildFailedError(f"cannot list the host's addresses to block: {exc}") from exc
        net_fd = os.open(f"/proc/{self._init_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        ready_r, ready_w = os.pipe()
        exit_r, exit_w = os.pipe()
        self._slirp_log = log = _Capture(8192)
        try:
            user_fd = fcntl.ioctl(net_fd, _NS_GET_USERNS)
            try:
                self._slirp = await asyncio.create_subprocess_exec(
                    "/usr/bin/setpriv",
                    f"--reuid={uid}",
                    f"--regid={uid}",
                    "--clear-groups",
                    "--",
                    slirp4netns_executable() or "slirp4netns",
                    "--configure",
                    "--mtu=65520",
                    "--disable-host-loopback",
                    f"--ready-fd={ready_w}",
                    f"--exit-fd={exit_r}",
                    f"--userns-path=/proc/self/fd/{user_fd}",
                    "--netns-type=path",
                    f"/proc/self/fd/{net_fd}",
                    "tap0",
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=log.write_fd,
                    pass_fds=(ready_w, exit_r, user_fd, net_fd),
                    env={"PATH": SANDBOX_PATH},
                    cwd="/",
                    start_new_session=True,
                )
            finally:
                os.close(user_fd)
        except BaseException:
            os.close(exit_w)
            raise
        finally:
            log.started()
            for fd in (net_fd, ready_w, exit_r):
                os.close(fd)
        self._slirp_exit_fd = exit_w
        try:
            ready = await _read_one_byte(ready_r, _READY_TIMEOUT_S)
        finally:
            os.close(ready_r)
        if ready != b"1":
            await self._stop_slirp()
            raise SandboxBuildFailedError(f"slirp4netns failed: {log.text().strip()}")
        routes = "".join(f"route add unreachable {net}\n" for net in blocked_networks)
        blocked = await asyncio.create_subprocess_exec(
            _NSENTER,
            f"--net=/proc/{self._init_pid}/ns/net",
            "--",
            _IP,
            "-batch",
            "-",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env={"PATH": SANDBOX_PATH},
            cwd="/",
        )
        _, err = await blocked.communicate(routes.encode())
        if blocked.returncode != 0:
            await self._stop_slirp()
            raise SandboxBuildFailedError(
                f"cannot block link-local and host addresses: {err.decode(errors='replace')[-500:]}"
            )

    @staticmethod
    def _blocked_networks() -> list[str]:
        """Link-local, and every IPv4 address of the host's own interfaces (slirp4netns would
        otherwise connect to them from the host's namespace)."""
        return [*_LINK_LOCAL, *(f"{address}/32" for address in sorted(_host_addresses()))]

    async def _stop_slirp(self) -> None:
        if self._slirp_exit_fd is not None:
            os.close(self._slirp_exit_fd)
            self._slirp_exit_fd = None
        if self._slirp is not None:
            try:
                await asyncio.wait_for(self._slirp.wait(), timeout=2.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self._slirp.kill()
                await self._slirp.wait()
            self._slirp = None
        if self._slirp_log is not None:
            self._slirp_log.close()
            self._slirp_log = None

    def _pin_pidns(self) -> None:
        """Hold the new sandbox's PID namespace open, then let go of the previous one's.

        Everything that finds a sandbox's processes (`pids_in_namespace`, the limits watchdog)
        knows its namespace by inode number, and the kernel reuses the number of a namespace
        that is gone: without the pin, a later sandbox (this one after `end_phase`, or another
        trial's) could get the number and be taken for this one."""
        previous, pid = self._pidns_fd, self._init_pid or 0
        try:  # the pidfd first: the namespace check below then vouches for the process it names
            self._init_pidfd = os.pidfd_open(pid)
            fd = os.open(f"/proc/{pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise SandboxBuildFailedError(f"the sandbox's init exited as it started: {exc}") from exc
        if os.fstat(fd).st_ino != self._pidns:
            os.close(fd)
            raise SandboxBuildFailedError("the sandbox's init is not in the PID namespace bubblewrap named")
        self._pidns_fd = fd
        if previous is not None:
            os.close(previous)

    def _unpin_pidns(self) -> None:
        if self._pidns_fd is not None:
            os.close(self._pidns_fd)
            self._pidns_fd = None

    async def _kill_sandbox(self) -> None:
        """SIGKILL the sandbox's PID 1 (the kernel then kills its whole PID namespace, and no
        process in it can fork any more) and wait until none is left."""
        if self._init_pidfd is not None:  # never a pid: the init may be gone and its pid reused
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._init_pidfd, signal.SIGKILL)
            os.close(self._init_pidfd)
            self._init_pidfd = None
        if self._holder is not None:
            try:  # bwrap reaps its sandbox init and exits by itself
                await asyncio.wait_for(self._holder.wait(), timeout=2.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._holder.pid, signal.SIGKILL)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._holder.wait(), timeout=10.0)
        for fd in self._holder_pipes:
            os.close(fd)
        self._holder_pipes = ()
        await asyncio.to_thread(self._reap)
        await self._stop_slirp()
        self._init_pid = self._holder = None

    def _release(self, delete: bool) -> None:
        """`stop`'s blocking part, in one trip off the event loop: remove the cgroup (retried
        while the kernel still counts the killed processes in it) and, with `delete`, the
        sandbox's tmpfs and directories."""
        self._limits.close()
        if delete:
            self._remove_dirs()

    def _reap(self) -> None:
        self._limits.kill_all()
        if self._pidns is not None:
            for _ in range(250):
                if not pids_in_namespace(self._pidns):
                    break
                time.sleep(0.02)


class WarmSpare(_Sandbox):
    """A started sandbox no trial has taken yet (`rl360_ext.harbor.envs.warm` keeps it): its
    tmpfs with the empty writable directories, its cgroup and its holder, nothing else run."""

    def __init__(self, options: BwrapOptions, workdir: str) -> None:
        self.logger = _log
        self._handed = False
        self._init_sandbox(options, f"warm-{uuid.uuid4().hex[:12]}", workdir)

    @classmethod
    async def started(
        cls, options: BwrapOptions, workdir: str, cpus: float | None, memory_mb: int | None
    ) -> WarmSpare:
        """A spare of this shape, started; a start that fails or is cancelled leaves nothing."""
        spare = cls(options, workdir)
        try:
            await spare._create(cpus, memory_mb)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(spare.discard())
            raise
        return spare

    def hand_to(self, taker: _Sandbox) -> None:
        """Give the started sandbox to `taker` (a trial's environment of the same shape)."""
        for name in self._STATE:
            setattr(taker, name, getattr(self, name))
        self._handed = True

    async def discard(self) -> None:
        if self._handed:
            return
        self._handed = True
        await self._kill_sandbox()
        await self._remove(delete=True)


class BwrapEnvironment(_Sandbox, BaseEnvironment):
    options_model: ClassVar[type[EnvironmentOptions]] = BwrapOptions
    options: BwrapOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._stopped = False
        self._grading = False
        self._holder_due = False  # a phase ended: the next command starts a fresh holder first
        self._holder_lock = asyncio.Lock()
        self._phase = Phase.ENVIRONMENT_SETUP
        self._hits: list[LimitHit] = []
        self._oom_base = 0  # the limits' OOM kill count when this phase started
        self._pids_base = 0  # the limits' refused-fork count when this phase started
        super().__init__(*args, **kwargs)
        if self._host_mounts:
            raise ValueError("the bwrap environment binds no host directories; remove the mounts")
        self._init_sandbox(self.options, self.session_id, self.task_env_config.workdir or "/app")

    @staticmethod
    def type() -> str:
        return "bwrap"

    @classmethod
    def check_server_options(cls, kwargs: dict[str, Any]) -> None:
        """Refuse, when a server starts, options no trial could run with: a ValueError naming
        the option (a bad value, or network allowed where slirp4netns is missing)."""
        options = cls.parse_options(kwargs)
        if isinstance(options, BwrapOptions) and options.allow_network and slirp4netns_executable() is None:
            raise ValueError(
                "--env-kwarg allow_network=true needs slirp4netns (apt-get install slirp4netns): "
                "the bwrap environment never gives a sandbox the host's network namespace"
            )

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        # mounted=False: nothing of the trial directory is visible in the sandbox; Harbor copies
        # the log directories out through download_dir.
        return EnvironmentCapabilities(disable_internet=True, mounted=False)

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True, fractional_cpus=True)

    def _validate_definition(self) -> None:
        try:
            info = os.lstat(self.environment_dir)
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"task environment directory not found: {self.environment_dir}") from exc
        if not stat.S_ISDIR(info.st_mode):
            raise FileNotFoundError(f"{self.environment_dir} is not a directory")
        setup = self.environment_dir / "setup.sh"
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISREG(os.lstat(setup).st_mode):
                raise FileNotFoundError(f"{setup} is not a regular file")

    @property
    def limits_mode(self) -> str:
        return self._limits.mode

    @property
    def pids_mode(self) -> str:
        """How the process limit applies: "cgroup+rlimit" or "rlimit" (see limits.py)."""
        return self._limits.pids_mode

    @property
    def network_enabled(self) -> bool:
        return self.options.allow_network and self.network_policy.network_mode == NetworkMode.PUBLIC

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, force_build: bool) -> None:
        """Start the sandbox; a start that fails tears down what it made (the tmpfs, the cgroup,
        any process) before it raises."""
        try:
            await self._start()
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.stop(delete=True))
            raise
        self._observe()
        self._enter_phase(Phase.AGENT)

    async def _start(self) -> None:
        if bwrap_executable() is None:
            raise SandboxBuildFailedError("bubblewrap is not installed (apt-get install bubblewrap)")
        if os.geteuid() != 0:
            raise SandboxBuildFailedError(
                "the bwrap environment runs as root: it maps the sandbox to an unprivileged uid"
            )
        if self.network_enabled and slirp4netns_executable() is None:
            raise SandboxBuildFailedError(
                "this task asks for network (network_mode public) and the server allows it, but "
                "slirp4netns is not installed (apt-get install slirp4netns): the bwrap environment "
                "never gives a sandbox the host's network namespace"
            )
        if self.options.seccomp:
            try:
                seccomp.prepare()
            except seccomp.SeccompUnsupported as exc:
                raise SandboxBuildFailedError(f"{exc}; run with --env-kwarg seccomp=false") from exc
        await self._sandbox_up()
        app_seed = self.environment_dir / "app"
        if app_seed.is_dir() and not app_seed.is_symlink():
            with nofollow.opened_dir(self.files_dir, PurePosixPath("app")) as app_fd:
                await asyncio.to_thread(nofollow.copy_tree_in, app_seed, app_fd, owner=self.owner)
        setup = self.environment_dir / "setup.sh"
        try:
            script = nofollow.read_regular(setup, _SETUP_SCRIPT_CAP)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise SandboxBuildFailedError(f"environment/setup.sh cannot be read: {exc}") from exc
        result = await self._run(
            ["/bin/bash", "-s"], stdin=script, cwd=self.workdir, env=self._merge_env(None)
        )
        if result.return_code != 0:
            tail = (result.stderr or result.stdout or "")[-1000:]
            raise SandboxBuildFailedError(f"environment/setup.sh exited {result.return_code}: {tail}")

    async def _sandbox_up(self) -> None:
        """Take a warm spare of this sandbox's shape if the loop's pool holds one, else start the
        sandbox here; then have the pool make a spare for the next trial of this shape. A task
        with network is never warm: its slirp4netns starts with its holder."""
        cpus, memory_mb = self.task_env_config.cpus, self.task_env_config.memory_mb
        if self.options.warm_sandboxes == 0 or self.network_enabled:
            await self._create(cpus, memory_mb)
            return
        pool = warm.pool(self.options.warm_sandboxes, self.options.warm_max_age_s)
        shape = (self.options.model_dump_json(), self.workdir, cpus, memory_mb)
        spare = pool.take(shape)
        if isinstance(spare, WarmSpare):
            spare.hand_to(self)
            self.logger.debug("sandbox %s: took warm sandbox %s", self.session_id, self.sandbox_dir.name)
        else:
            await self._create(cpus, memory_mb)
        pool.refill(shape, functools.partial(WarmSpare.started, self.options, self.workdir, cpus, memory_mb))

    async def end_phase(self, clear: Sequence[str] = (), *, grading: bool = False) -> None:
        """Kill every process the sandbox runs, empty the sandbox directories in `clear`, and have
        the next command start a fresh holder (fresh namespaces) over the same files first: what
        one phase left running (an agent's background writer) or left behind in the next phase's
        directories cannot reach it. With `grading` (the verifier is next, `Phase.VERIFIER`
        begins): the tmpfs grows by the verifier's reserve (`verifier_disk_mb`,
        `verifier_inodes`), HOME and tmp (/tmp, but for a workdir inside it) are emptied as
        well, the workdir, /tests and /logs get their owner and owner permissions back
        (`nofollow.reset_tree`), and every later command runs with PYTHONNOUSERSITE=1.
        Back-to-back phase ends start one holder, at the next command. Raises
        `nofollow.SandboxTreeError` for a tree past the walks' caps."""
        if self._stopped or (self._init_pid is None and not self._holder_due):
            return
        async with self._holder_lock:
            await self._end_processes()
            if grading and not self._grading:
                self._grading = True
                self._enter_phase(Phase.VERIFIER)
            await asyncio.to_thread(self._empty_all, tuple(clear), grading)

    async def kill_processes(self) -> None:
        """Kill every process the sandbox runs now (its PID namespace), files untouched; the next
        command starts a fresh holder (`exec_and_end` ends with it)."""
        if self._stopped:
            return
        async with self._holder_lock:
            await self._end_processes()

    async def _end_processes(self) -> None:
        """(Holding the holder lock.) Kill the holder's PID namespace, if one runs, and note what
        limits the phase hit."""
        if self._init_pid is not None:
            await self._kill_sandbox()
            self._limits.detach()
        self._holder_due = True
        self._observe()

    def limit_hits(self) -> list[LimitHit]:
        """Every limit the sandbox's own processes hit in this trial, in the order it was seen,
        once per phase and resource: `Phase.ENVIRONMENT_SETUP` (start and setup.sh),
        `Phase.AGENT` (until grading starts) or `Phase.VERIFIER` (after `end_phase(grading=True)`);
        `Resource.MEMORY` (an OOM kill, or the watchdog's), `Resource.PIDS` (a fork the cgroup's
        pids.max refused; none is seen under RLIMIT_NPROC alone), `Resource.DISK` or
        `Resource.INODES` (the tmpfs was full after a command or at a phase's end),
        `Resource.OUTPUT` (a command's output was cut to `max_output_kb`). Kept after `stop`."""
        return list(self._hits)

    def _hit(self, resource: Resource, detail: str) -> None:
        if not any(hit.phase == self._phase and hit.resource == resource for hit in self._hits):
            self._hits.append(LimitHit(self._phase, resource, detail))

    def _enter_phase(self, phase: Phase) -> None:
        self._phase = phase
        self._oom_base = self._limits.oom_kills()
        self._pids_base = self._limits.pids_refusals()

    def _memory_exceeded(self) -> bool:
        """Whether a process of this phase was killed for the memory limit."""
        return self._limits.oom_kills() > self._oom_base

    def _observe(self) -> None:
        """Note the limits the sandbox's processes hit in this phase so far (`limit_hits`)."""
        if (killed := self._limits.oom_kills() - self._oom_base) > 0:
            self._hit(Resource.MEMORY, f"{killed} killed at {self.task_env_config.memory_mb} MB")
        if (refused := self._limits.pids_refusals() - self._pids_base) > 0:
            self._hit(Resource.PIDS, f"{refused} forks refused at pids.max {self.options.max_pids}")
        try:
            disk = os.statvfs(self.files_dir)
        except OSError:
            return
        if disk.f_blocks and disk.f_bavail * disk.f_frsize < _FULL_BYTES:
            self._hit(Resource.DISK, f"{disk.f_bavail * disk.f_frsize} bytes free")
        if disk.f_files and disk.f_favail == 0:
            self._hit(Resource.INODES, f"0 of {disk.f_files} inodes free")

    async def start_due_holder(self) -> None:
        """Start the holder a phase end left due, if any (once, whichever comes first: this or a
        command); a start that fails or is cancelled leaves no process behind."""
        if not self._holder_due:
            return
        async with self._holder_lock:
            if not self._holder_due or self._stopped:
                return
            try:
                await self._launch()
            except BaseException:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._kill_sandbox())
                raise
            self._holder_due = False

    def _empty_all(self, clear: Sequence[str], grading: bool) -> None:
        """`end_phase`'s host work, in one trip off the event loop: empty each of `clear`; with
        `grading`, give the tmpfs the verifier's reserve, empty HOME and tmp but for a workdir
        inside it, give the graded directories back to the sandbox user and the memory the
        files hold back to the verifier."""
        if grading:
            remount_tmpfs(
                self.files_dir,
                (self.options.disk_mb + self.options.verifier_disk_mb) * 2**20,
                self._walk_cap(),
            )
        for sandbox_path in clear:
            self._empty(sandbox_path)
        if grading:
            self._empty(SCRATCH_DIR, self._work_in_scratch())
            self._reset_graded()
            # the files left on the tmpfs are memory charged to the sandbox's cgroup: the
            # verifier gets its reservation on top of them (and of its own disk reserve)
            disk = os.statvfs(self.files_dir)
            used = (disk.f_blocks - disk.f_bfree) * disk.f_frsize
            self._limits.grow_memory(used + self.options.verifier_disk_mb * 2**20)

    def _walk_cap(self) -> int:
        """Inodes the sandbox's tmpfs holds at most while grading: no walk of it visits more."""
        return self.options.max_inodes + self.options.verifier_inodes

    def _reset_graded(self) -> None:
        """Owner and owner permissions back on the workdir, /tests and /logs (whole trees), the
        writable mount roots and the workdir's parents, and /tmp 1777 again: a phase's chmod 000
        cannot lock the verifier (the sandbox user) out of them."""
        for _, source in self._writable_mounts():
            with nofollow.opened_dir(source) as fd:
                nofollow.reset_owner(fd, self.owner)
        with nofollow.opened_dir(self.files_dir, PurePosixPath(SCRATCH_DIR.strip("/"))) as fd:
            os.fchmod(fd, 0o1777)
        root, relative = self._host_path(self.workdir)
        for depth in range(1, len(relative.parts)):
            parent = PurePosixPath(*relative.parts[:depth])
            with nofollow.opened_dir(root, parent, create=True, owner=self.owner) as fd:
                nofollow.reset_owner(fd, self.owner)
        for sandbox_path in (self.workdir, *_GRADED_DIRS):
            root, relative = self._host_path(sandbox_path)
            with nofollow.opened_dir(root, relative, create=True, owner=self.owner) as fd:
                nofollow.reset_tree(fd, self.owner, self._walk_cap())

    def _work_in_scratch(self) -> str | None:
        """The top-level name under /tmp that holds the workdir, if the workdir is inside /tmp."""
        relative = PurePosixPath(self.workdir).relative_to("/")
        scratch = PurePosixPath(SCRATCH_DIR).relative_to("/")
        if scratch in relative.parents:
            return relative.relative_to(scratch).parts[0]
        return None

    def _empty(self, sandbox_path: str, keep: str | None = None) -> None:
        root, relative = self._host_path(sandbox_path)
        with nofollow.opened_dir(root, relative, create=True, owner=self.owner) as fd:
            for name in os.listdir(fd):
                if name != keep:
                    nofollow.remove_entry(fd, name)

    async def stop(self, delete: bool) -> None:
        if self._stopped:
            return
        self._stopped = True
        async with self._holder_lock:  # a holder being started is waited for, then killed
            await self._kill_sandbox()
        self._observe()
        await self._remove(delete)

    # -- commands -------------------------------------------------------------------------------

    def _enter_argv(
        self, inner: Sequence[str], cwd: str, env_fd: int, prefix: Sequence[str] = ()
    ) -> list[str]:
        """argv that runs `inner` in the sandbox as its user, in `cwd`, with exactly the
        environment in `env_fd` (NUL-separated KEY=VALUE entries, applied only inside); `prefix`
        runs first, on the host side (the seccomp loader)."""
        if self._init_pid is None or self._stopped:
            raise RuntimeError(f"sandbox {self.session_id} is not running")
        uid = self.options.sandbox_uid
        return self._limits.wrap(
            [
                *prefix,
                "/usr/bin/nsenter",
                f"--target={self._init_pid}",
                "--mount",
                "--uts",
                "--ipc",
                "--net",
                "--pid",
                "--root",
                "--wd",
                "--",
                "/usr/bin/setpriv",
                f"--reuid={uid}",
                f"--regid={uid}",
                "--clear-groups",
                "--",
                "/usr/bin/nsenter",
                "--target=1",
                "--user",
                "--preserve-credentials",
                "--",
                *rlimit_argv(self._nproc(), self.options.disk_mb * 2**20),
                "/usr/bin/setpriv",
                "--no-new-privs",
                "--",
                "/usr/bin/env",
                "-i",
                "-C",
                cwd,
                f"PATH={SANDBOX_PATH}",
                "/bin/bash",
                "-c",
                _ENV_LOADER,
                "rl360-env",
                str(env_fd),
                *inner,
            ]
        )

    def _nproc(self) -> int:
        """RLIMIT_NPROC of a command: `max_pids`, or above it where the cgroup's pids.max applies
        (the cgroup then refuses first, and counts the refusal for `limit_hits`)."""
        return self.options.max_pids + (_PIDS_SLACK if self._limits.pids_cgroup else 0)

    def _process_env(self, env: dict[str, str] | None) -> dict[str, str]:
        """The environment a command sees inside the sandbox (never that of the host-side
        processes that enter it: those run with PATH only, so no task env reaches root)."""
        grading = {"PYTHONNOUSERSITE": "1"} if self._grading else {}
        return {
            "PATH": SANDBOX_PATH,
            "HOME": SCRATCH_DIR,
            "LANG": "C.UTF-8",
            "TERM": "xterm-256color",
            **grading,
            **(env or {}),
        }

    async def _run(
        self,
        inner: Sequence[str],
        *,
        cwd: str,
        env: dict[str, str] | None,
        stdin: bytes | None = None,
        timeout_sec: float | None = None,
    ) -> ExecResult:
        """Run `inner` in the sandbox. stdout and stderr are pipes read while the command runs,
        at most `max_output_kb` kept of each; the command returns when it exits, even if a
        daemon it left still holds its output (as `docker exec` does)."""
        await self.start_due_holder()
        entries = b"".join(f"{key}={value}".encode() + b"\0" for key, value in self._process_env(env).items())
        cap = self.options.max_output_kb * 1024
        loader = seccomp.exec_prefix() if self.options.seccomp else None
        with _env_file(entries) as env_fd, _Capture(cap) as out, _Capture(cap) as err:
            try:
                process = await asyncio.create_subprocess_exec(
                    *self._enter_argv(inner, cwd, env_fd, loader or ()),
                    stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                    stdout=out.write_fd,
                    stderr=err.write_fd,
                    env={"PATH": SANDBOX_PATH},  # root runs nsenter: no task-chosen PATH, LD_PRELOAD, ...
                    cwd="/",  # the server's cwd would reach the sandbox as PWD
                    pass_fds=(env_fd,),
                    start_new_session=True,
                    # the host-side process loads the filter before it execs nsenter (the loader
                    # prefix, else this hook): the command and everything it starts inherit it
                    preexec_fn=seccomp.install if self.options.seccomp and loader is None else None,
                )
            finally:
                out.started()
                err.started()
            try:
                await asyncio.wait_for(self._feed_and_wait(process, stdin), timeout=timeout_sec)
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                with contextlib.suppress(BaseException):
                    await asyncio.shield(process.wait())
                self._observe()
                raise
            stdout, stderr = out.text(), err.text()
            if out.kept.dropped or err.kept.dropped:
                self._hit(Resource.OUTPUT, f"{out.kept.dropped + err.kept.dropped} bytes dropped")
        self._observe()
        if self._memory_exceeded():
            raise MemoryLimitExceededError(
                f"sandbox {self.session_id} exceeded its memory reservation "
                f"of {self.task_env_config.memory_mb} MB"
            )
        return ExecResult(
            stdout=stdout,
            stderr=stderr,
            return_code=process.returncode if process.returncode is not None else -1,
        )

    @staticmethod
    async def _feed_and_wait(process: asyncio.subprocess.Process, stdin: bytes | None) -> None:
        if stdin is not None and process.stdin is not None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                process.stdin.write(stdin)
                await process.stdin.drain()
            process.stdin.close()
        await process.wait()

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """Run `command` with bash in the sandbox as the sandbox user (`user` is not honoured:
        there is one unprivileged user)."""
        try:
            return await self._run(
                ["/bin/bash", "-c", command],
                cwd=cwd or self.workdir,
                env=self._merge_env(env),
                timeout_sec=timeout_sec,
            )
        except TimeoutError as exc:
            raise TimeoutError(f"Command timed out after {timeout_sec} seconds") from exc

    async def exec_and_end(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """Run `command` as `exec` does, and end every process of the sandbox as its shell exits:
        the shell runs traced, stopped as it begins to exit (before its descriptors close), and
        every process of the sandbox's user is killed then; the host then kills the sandbox's
        PID namespace (`kill_processes`), also when the command fails, times out or is
        cancelled. So nothing the command started acts after it exited, even one that watches
        it go. The verifier runs the test script this way (exec'd by the shell, so the script
        is the traced process). The return code is the command's own."""
        traced = os.path.exists(_PYTHON)
        inner = [_PYTHON, "-I", "-S", "-c", _TRACER, EXIT_TAG] if traced else []
        try:
            result = await self._run(
                [*inner, "/bin/bash", "-c", command],
                cwd=cwd or self.workdir,
                env=self._merge_env(env),
                timeout_sec=timeout_sec,
            )
        except TimeoutError as exc:
            raise TimeoutError(f"Command timed out after {timeout_sec} seconds") from exc
        finally:
            await asyncio.shield(self.kill_processes())
        return reported_exit(result) if traced else result

    # -- files ----------------------------------------------------------------------------------

    def _budget(self) -> nofollow.CopyBudget:
        return nofollow.CopyBudget(
            max_file_bytes=self.options.max_file_mb * 2**20,
            max_total_bytes=self.options.max_copy_mb * 2**20,
            max_inodes=self.options.max_copy_inodes,
            max_seconds=self.options.max_copy_s,
        )

    def _kind(self, sandbox_path: str) -> int | None:
        """The file type (`stat.S_IFMT`) of a path in a writable sandbox directory, read on the
        host one component at a time without following a link (a link is a link, whatever it
        points to); None when it is missing or under a link. Raises PermissionError (from
        `_host_path`) for a path outside the writable directories."""
        root, relative = self._host_path(sandbox_path)
        if not relative.parts:
            return stat.S_IFDIR
        try:
            with nofollow.opened_dir(root, relative.parent) as fd:
                return stat.S_IFMT(os.stat(relative.name, dir_fd=fd, follow_symlinks=False).st_mode)
        except (FileNotFoundError, NotADirectoryError, nofollow.UnsafePath):
            return None

    async def is_dir(self, path: str, user: str | int | None = None) -> bool:
        """Whether `path` is a directory. In the writable directories (where Harbor looks for
        artifacts between the phases) it is answered on the host, without a command, so no
        holder starts for it; a link counts as no directory (what is then copied out never
        follows one either). Elsewhere (/usr, /etc) it is `test -d` in the sandbox."""
        try:
            return self._kind(path) == stat.S_IFDIR
        except PermissionError:
            return await super().is_dir(path, user=user)

    async def is_file(self, path: str, user: str | int | None = None) -> bool:
        """Whether `path` is a regular file, answered as `is_dir` is (a link counts as none)."""
        try:
            return self._kind(path) == stat.S_IFREG
        except PermissionError:
            return await super().is_file(path, user=user)

    async def remove_files(self, paths: Sequence[str]) -> None:
        """Remove each of `paths` (whatever it is, a directory with its contents) from the
        writable sandbox directories, on the host and without following a link, as `is_dir`
        reads them: no command, no holder. A path whose parent is missing or a link has nothing
        to remove. Raises PermissionError for a path outside the writable directories."""
        for sandbox_path in paths:
            root, relative = self._host_path(sandbox_path)
            if not relative.parts:
                raise IsADirectoryError(f"{sandbox_path} is a sandbox directory, not a file path")
            missing = (FileNotFoundError, NotADirectoryError, nofollow.UnsafePath)
            with contextlib.suppress(*missing), nofollow.opened_dir(root, relative.parent) as fd:
                nofollow.remove_entry(fd, relative.name)

    def _upload_file(self, source: Path, target_path: str) -> None:
        root, relative = self._host_path(target_path)
        if not relative.parts:
            raise IsADirectoryError(f"{target_path} is a sandbox directory, not a file path")
        with nofollow.opened_dir(root, relative.parent, create=True, owner=self.owner) as fd:
            nofollow.copy_file_in(source, fd, relative.name, owner=self.owner)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        await asyncio.to_thread(self._upload_file, Path(source_path), target_path)

    def _upload_dir(self, source: Path, target_dir: str) -> None:
        root, relative = self._host_path(target_dir)
        with nofollow.opened_dir(root, relative, create=True, owner=self.owner) as fd:
            nofollow.copy_tree_in(source, fd, owner=self.owner)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await asyncio.to_thread(self._upload_dir, Path(source_dir), target_dir)

    def _download_file(self, source_path: str, target: Path) -> None:
        root, relative = self._host_path(source_path)
        if not relative.parts:
            raise IsADirectoryError(f"{source_path} is a sandbox directory, not a file")
        with nofollow.opened_dir(root, relative.parent) as fd:
            nofollow.copy_file_out(fd, relative.name, target, self.options.max_file_mb * 2**20)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        await asyncio.to_thread(self._download_file, source_path, Path(target_path))

    def _download_dir(self, source_dir: str, target: Path, keep: Any = None) -> None:
        root, relative = self._host_path(source_dir)
        budget = self._budget()
        with nofollow.opened_dir(root, relative) as fd:
            nofollow.copy_tree_out(fd, target, budget, keep)
        if budget.skipped:
            _log.warning(
                "sandbox %s: not copied out of %s: %s", self.session_id, source_dir, budget.skipped[:20]
            )

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        await asyncio.to_thread(self._download_dir, source_dir, Path(target_dir))

    async def download_dir_filtered(
        self,
        *,
        source_dir: str,
        target_dir: Path | str,
        include: Sequence[str] | None = None,
        exclude: Sequence[str] | None = None,
        protect: Sequence[str] | None = None,
    ) -> None:
        protected = set(protect or ())

        def keep(relative: PurePosixPath) -> bool:
            name = relative.as_posix()
            return name in protected or bool(
                filter_paths_by_patterns([name], include=include, exclude=exclude)
            )

        await asyncio.to_thread(self._download_dir, source_dir, Path(target_dir), keep)


def reported_exit(result: ExecResult) -> ExecResult:
    """`result` with the exit code its last `EXIT_TAG` line reports as its return code (what
    printed it may have gone with the kill it sent next), that line removed from stdout; as it
    is without such a line."""
    stdout = result.stdout or ""
    head, tag, code = stdout.rpartition(EXIT_TAG)
    if not tag or not code.rstrip("\n").isdigit() or (head and not head.endswith("\n")):
        return result
    return ExecResult(stdout=head, stderr=result.stderr, return_code=int(code))


@contextlib.contextmanager
def _env_file(entries: bytes) -> Iterator[int]:
    """A command's environment as an anonymous in-memory file (memfd: no inode on the host's
    disk to create and journal per command), at offset 0, closed on exit."""
    fd = os.memfd_create("rl360-env", os.MFD_CLOEXEC)
    try:
        view = memoryview(entries)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
        yield fd
    finally:
        os.close(fd)


class HeadTail:
    """At most `cap` bytes of a stream: its first and last `cap / 2` bytes, and how many bytes
    between them were dropped."""

    def __init__(self, cap: int) -> None:
        self._half = max(1, cap // 2)
        self._head = bytearray()
        self._tail = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = self._half - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if len(chunk) >= self._half:
            self.dropped += len(self._tail) + len(chunk) - self._half
            self._tail = bytearray(chunk[-self._half :])
        elif chunk:
            self._tail += chunk
            if (excess := len(self._tail) - self._half) > 0:
                self.dropped += excess
                del self._tail[:excess]

    def text(self) -> str:
        gap = f"\n[... {self.dropped} bytes of output dropped ...]\n".encode() if self.dropped else b""
        return bytes(self._head + gap + self._tail).decode(errors="replace")


class _Capture:
    """One output pipe of a command, read as the command writes it into a `HeadTail`, so a
    command that prints gigabytes costs the host reading time, never memory. Used as a context
    manager around the command."""

    def __init__(self, cap: int) -> None:
        self.kept = HeadTail(cap)
        self._read_fd, self.write_fd = os.pipe()
        with contextlib.suppress(OSError):
            fcntl.fcntl(self._read_fd, _F_SETPIPE_SZ, _PIPE_BYTES)
        os.set_blocking(self._read_fd, False)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._read_fd, self._on_readable)
        self._open = True

    def __enter__(self) -> _Capture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def started(self) -> None:
        """The command has its copy of the write end (or failed to start): close ours, so the
        pipe ends when the command and what it started close theirs."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def _on_readable(self) -> None:
        try:
            chunk = os.read(self._read_fd, _PIPE_BYTES)
        except BlockingIOError:
            return
        if chunk:
            self.kept.add(chunk)
        else:
            self._loop.remove_reader(self._read_fd)

    def text(self) -> str:
        """What was kept, after reading what the command left in the pipe when it exited (a few
        buffers at most: a daemon that still writes is not waited for)."""
        for _ in range(4 if self._open else 0):
            try:
                chunk = os.read(self._read_fd, _PIPE_BYTES)
            except OSError:  # BlockingIOError: nothing left now
                break
            if not chunk:
                break
            self.kept.add(chunk)
        return self.kept.text()

    def close(self) -> None:
        self.started()
        if self._open:
            self._open = False
            self._loop.remove_reader(self._read_fd)
            os.close(self._read_fd)


def read_handshake(info_fd: int, out_fd: int, err_fd: int, timeout_s: float) -> tuple[bytes, bytes, bytes]:
    """(bwrap's info JSON, to its end; the holder's first line; bwrap's stderr, read only when
    either of those is missing, at most `_HANDSHAKE_CAP` bytes and 2 s): a blocking read of a
    holder's start, meant for a thread. `timeout_s` bounds the first two together. It closes
    all three descriptors."""
    info, line = bytearray(), bytearray()
    try:
        pending = _read_until({info_fd: info, out_fd: line}, time.monotonic() + timeout_s, {out_fd: b"\n"})
        if pending or not info or not line.endswith(b"\n"):
            stderr = bytearray()
            _read_until({err_fd: stderr}, time.monotonic() + 2.0, {})
            return bytes(info), bytes(line), bytes(stderr)
        return bytes(info), bytes(line), b""
    finally:
        for fd in (info_fd, out_fd, err_fd):
            os.close(fd)


def _read_until(buffers: dict[int, bytearray], deadline: float, ends: dict[int, bytes]) -> set[int]:
    """Read each fd into its buffer until its end of file, its `ends` byte, `_HANDSHAKE_CAP`
    bytes or `deadline`; returns the fds not finished by then."""
    pending = set(buffers)
    poller = select.poll()
    for fd in pending:
        poller.register(fd, select.POLLIN)
    while pending and (left := deadline - time.monotonic()) > 0:
        for fd, _ in poller.poll(max(1, int(left * 1000))):
            chunk = os.read(fd, _HANDSHAKE_CAP)
            buffer = buffers[fd]
            buffer += chunk
            end = ends.get(fd)
            if not chunk or len(buffer) >= _HANDSHAKE_CAP or (end is not None and end in chunk):
                if end is not None and end in buffer:
                    del buffer[buffer.index(end) + 1 :]
                poller.unregister(fd)
                pending.discard(fd)
    return pending


async def _read_one_byte(fd: int, timeout_s: float) -> bytes:
    """One byte from a pipe, b"" at end of file or after `timeout_s` (without a thread that
    could stay blocked on it)."""
    loop = asyncio.get_running_loop()
    readable = loop.create_future()
    os.set_blocking(fd, False)
    loop.add_reader(fd, lambda: readable.done() or readable.set_result(None))
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(readable, timeout=timeout_s)
    finally:
        loop.remove_reader(fd)
    try:
        return os.read(fd, 1)
    except BlockingIOError:
        return b""


def _host_addresses() -> set[str]:
    """Every non-loopback IPv4 address of this host's interfaces: the LOCAL /32 entries of its
    routing trie (/proc/net/fib_trie, this process's network namespace)."""
    found: set[str] = set()
    previous = ""
    for line in Path("/proc/net/fib_trie").read_text().splitlines():
        text = line.strip()
        if text.startswith("|-- "):
            previous = text[4:]
        elif text == "/32 host LOCAL" and previous:
            found.add(previous)
    return {address for address in found if not ipaddress.ip_address(address).is_loopback}
