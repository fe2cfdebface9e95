"""One bwrap sandbox's host side: its directories and tmpfs, its cgroup, its holder (the process
that keeps its namespaces alive), its start and its teardown; and `WarmSpare`, a started sandbox
no trial has taken yet. Entering it (commands, files) is `environment.py`'s."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import stat
import time
import uuid
from pathlib import Path, PurePosixPath

from harbor.environments.base import SandboxBuildFailedError

from rl360_ext.harbor.envs import nofollow, seccomp
from rl360_ext.harbor.envs.bwrap.capture import read_handshake
from rl360_ext.harbor.envs.bwrap.layout import (
    _LOG_DIRS,
    _READY_TIMEOUT_S,
    _WRITABLE_DIRS,
    FILES_DIR,
    OWNER_FILE,
    SANDBOX_PATH,
    SANDBOX_UID,
    SCRATCH_DIR,
    default_sandbox_root,
)
from rl360_ext.harbor.envs.bwrap.network import Slirp
from rl360_ext.harbor.envs.bwrap.options import BwrapConfig
from rl360_ext.harbor.envs.limits import (
    SandboxLimits,
    make_limits,
    mount_tmpfs,
    owner_tag,
    pids_in_namespace,
    unmount,
)

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
_log = logging.getLogger(__name__)


def bwrap_executable() -> str | None:
    return shutil.which("bwrap")


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
    options: BwrapConfig
    session_id: str
    workdir: str
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger]

    def _init_sandbox(self, options: BwrapConfig, session_id: str, workdir: str) -> None:
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
        self._slirp = Slirp()
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
            await self._slirp.start(self._init_pid, self.options.sandbox_uid)
        self.logger.debug(
            "sandbox %s up: pid %s, limits %s, pids %s, network %s, node %s",
            self.session_id,
            self._init_pid,
            self._limits.mode,
            self._limits.pids_mode,
            "slirp4netns" if self.network_enabled else "none",
            self.options.node_label,
        )

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
        await self._slirp.stop()
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

    def __init__(self, options: BwrapConfig, workdir: str) -> None:
        self.logger = _log
        self._handed = False
        self._init_sandbox(options, f"warm-{uuid.uuid4().hex[:12]}", workdir)

    @classmethod
    async def started(
        cls, options: BwrapConfig, workdir: str, cpus: float | None, memory_mb: int | None
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
