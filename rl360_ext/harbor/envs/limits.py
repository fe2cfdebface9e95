"""Resource limits for one local sandbox: a cgroup when this process may create one, else a watchdog.

Owns enforcing a trial's reservation (cpus, memory) and the sandbox's process and disk limits on
one bubblewrap sandbox, noticing when the memory limit was hit, and killing every process of
the sandbox. Two modes for cpus and memory:

- cgroup (v1 or v2): a child cgroup of this process's own cgroup (never a sibling, so the
  limits of whoever runs rl360 still apply) with a hard memory limit (swap included), a CPU
  quota of `cpus` cores and, where the pids controller is available, `pids.max`. Processes
  join it before they exec (`wrap`), so every process of the sandbox, including commands
  entered later, is counted. The kernel's OOM kill count says whether the limit was hit.
- watchdog (no writable cgroup, e.g. an unprivileged container): CPU affinity to ceil(cpus)
  cores (`taskset`), and a poller that sums the resident memory of every process in the
  sandbox's PID namespace every `poll_s` and kills them all once the sum exceeds the limit.
  A fast allocation can overshoot the limit for up to one poll interval.

Processes: every command also runs under RLIMIT_NPROC (`rlimit_argv`), set inside the
sandbox's own user namespace. Since Linux 5.14 the kernel counts that limit per user namespace
and uid, so it bounds each sandbox on its own (all sandboxes share one host uid), with or
without a cgroup; `pids_mode` says whether the cgroup's `pids.max` applies as well.
Disk: the sandbox's writable directories live on one size- and inode-capped tmpfs
(`mount_tmpfs`), and every command runs under RLIMIT_FSIZE.

Each sandbox cgroup is named `rl360-sbx.<server pid>.<server start time>.<sandbox>`, so a server
that starts after another was SIGKILLed removes that server's leftovers (`clean_stale_cgroups`:
its cgroups, and a sandbox that its death left half set up) and never a live server's. It does
not own starting the sandbox or deciding what a hit limit means for the trial.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import functools
import itertools
import math
import os
import signal
import time
from pathlib import Path

from rl360_ext.util.proc_stat import PARENT, START_TIME, STATE, stat_fields

CGROUP_ROOT = Path("/sys/fs/cgroup")
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
_JOIN_SCRIPT = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n-1)); done; exec "$@"'
)
PRLIMIT = "/usr/bin/prlimit"
_MNT_DETACH = 2
_MS_NOSUID, _MS_NODEV, _MS_REMOUNT = 2, 4, 32
CGROUP_PREFIX = "rl360-sbx."  # + owner tag + "." + sandbox name: what clean_stale_cgroups looks for
_cpu_cursor = itertools.count()
_ANCESTRY_DEPTH = 64  # parent links followed from a left-over process


def _start_time(pid: int) -> str | None:
    fields = stat_fields(pid)
    return fields[START_TIME] if fields is not None else None


def owner_tag(pid: int | None = None) -> str:
    """`pid.starttime` of a process (default: this one): names what it owns, reusable-pid safe."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}.{_start_time(pid)}"


def owner_alive(tag: str) -> bool:
    """Whether the process a tag names still runs (a malformed tag counts as alive: keep it)."""
    pid, _, start = tag.partition(".")
    if not pid.isdigit() or not start:
        return True
    return _start_time(int(pid)) == start


def _is_live(pid: str) -> bool:
    fields = stat_fields(pid)
    return fields is not None and fields[STATE] != "Z"


def pids_in_namespace(pidns_inode: int) -> list[int]:
    """Host PIDs of every live (not zombie) process whose PID namespace has this inode."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            if os.stat(f"/proc/{entry.name}/ns/pid").st_ino == pidns_inode and _is_live(entry.name):
                pids.append(int(entry.name))
    return pids


def resident_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE_SIZE
    return total


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _own_cgroup_paths() -> dict[str, str]:
    """controller -> this process's cgroup path ("" key for the v2 unified hierarchy)."""
    paths: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller] = path
    return paths


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _counter(path: Path, key: str) -> int:
    """The value of `key` in a cgroup `key value` lines file (memory.events, pids.events), 0 when
    it cannot be read."""
    with contextlib.suppress(OSError, ValueError):
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    return 0


class SandboxLimits:
    """Base: no limits. Subclasses enforce; `mode` names what is enforced."""

    mode = "none"
    pids_cgroup = False

    @property
    def pids_mode(self) -> str:
        """How the process limit is enforced: "cgroup+rlimit" or "rlimit" (RLIMIT_NPROC only)."""
        return "cgroup+rlimit" if self.pids_cgroup else "rlimit"

    def wrap(self, argv: list[str]) -> list[str]:
        """argv that puts the process under the limits before it execs `argv`."""
        return argv

    def attach(self, pidns_inode: int) -> None:
        """The sandbox is up; its processes live in this PID namespace."""

    def oom_kills(self) -> int:
        """Processes of the sandbox killed for its memory limit so far (never decreases)."""
        return 0

    def pids_refusals(self) -> int:
        """Forks the process limit refused so far, as the host counts them (the cgroup's
        pids.events `max`; 0 where there is no pids controller: RLIMIT_NPROC keeps no count)."""
        return 0

    def grow_memory(self, extra_bytes: int) -> None:
        """Allow `extra_bytes` more than the memory reservation from now on (a cgroup's limit;
        the watchdog counts no tmpfs pages, so it needs none)."""

    def kill_all(self) -> None:
        """SIGKILL every process under these limits."""

    def detach(self) -> None:
        """The sandbox's processes are gone and a new holder will `attach`; limits stay."""

    def close(self) -> None:
        """Release what the limits created (after the sandbox is gone)."""


class CgroupLimits(SandboxLimits):
    """Memory, CPU and process limits through child cgroups (v1 memory+cpu+pids, or v2
    memory.max/cpu.max/pids.max)."""

    def __init__(
        self, name: str, cpus: float | None, memory_mb: int | None, pids_max: int | None = None
    ) -> None:
        self._dirs: list[Path] = []
        self._pids_events: Path | None = None
        self._memory_bytes = None if memory_mb is None else memory_mb * 2**20
        self._memory_granted = self._memory_bytes  # the limit now: the reservation, or grown for grading
        self._memory_limits: list[Path] = []  # the limit files, the one to raise first first
        own = _own_cgroup_paths()
        try:
            if (CGROUP_ROOT / "cgroup.controllers").exists() and "" in own:
                self._setup_v2(CGROUP_ROOT / own[""].lstrip("/") / name, cpus, memory_mb, pids_max)
            elif "memory" in own and (CGROUP_ROOT / "memory").is_dir():
                self._setup_v1(own, name, cpus, memory_mb, pids_max)
            else:
                raise OSError("no cgroup v2 hierarchy and no cgroup v1 memory controller")
        except BaseException:
            self.close()
            raise

    def _make(self, path: Path) -> Path:
        path.mkdir()
        self._dirs.append(path)
        return path

    def _setup_v2(self, path: Path, cpus: float | None, memory_mb: int | None, pids_max: int | None) -> None:
        parent_controls = (path.parent / "cgroup.subtree_control").read_text().split()
        if memory_mb is not None and "memory" not in parent_controls:
            raise OSError(f"the memory controller is not enabled for children of {path.parent}")
        group = self._make(path)
        self.mode = "cgroup-v2"
        self._events = group / "memory.events"
        self._pids_events = group / "pids.events"
        if memory_mb is not None:
            _write(group / "memory.max", str(memory_mb * 2**20))
            self._memory_limits = [group / "memory.max"]
            if (group / "memory.swap.max").exists():
                _write(group / "memory.swap.max", "0")
        if cpus is not None and "cpu" in parent_controls:
            _write(group / "cpu.max", f"{max(1000, int(cpus * 100_000))} 100000")
        if pids_max is not None and "pids" in parent_controls:
            _write(group / "pids.max", str(pids_max))
            self.pids_cgroup = True
        self._procs = [group / "cgroup.procs"]

    def _setup_v1(
        self, own: dict[str, str], name: str, cpus: float | None, memory_mb: int | None, pids_max: int | None
    ) -> None:
        memory = self._make(CGROUP_ROOT / "memory" / own["memory"].lstrip("/") / name)
        self.mode = "cgroup-v1"
        self._events = memory / "memory.oom_control"
        if memory_mb is not None:
            _write(memory / "memory.limit_in_bytes", str(memory_mb * 2**20))
            self._memory_limits = [memory / "memory.limit_in_bytes"]
            if (memory / "memory.memsw.limit_in_bytes").exists():
                _write(memory / "memory.memsw.limit_in_bytes", str(memory_mb * 2**20))
                self._memory_limits.insert(0, memory / "memory.memsw.limit_in_bytes")
        self._procs = [memory / "cgroup.procs"]
        cpu_controller = next((c for c in own if c == "cpu" or c.startswith("cpu,")), None)
        if cpus is not None and cpu_controller is not None and (CGROUP_ROOT / "cpu").is_dir():
            cpu = self._make(CGROUP_ROOT / "cpu" / own[cpu_controller].lstrip("/") / name)
            _write(cpu / "cpu.cfs_period_us", "100000")
            _write(cpu / "cpu.cfs_quota_us", str(max(1000, int(cpus * 100_000))))
            self._procs.append(cpu / "cgroup.procs")
        if pids_max is not None and "pids" in own and (CGROUP_ROOT / "pids").is_dir():
            pids = self._make(CGROUP_ROOT / "pids" / own["pids"].lstrip("/") / name)
            _write(pids / "pids.max", str(pids_max))
            self._pids_events = pids / "pids.events"
            self._procs.append(pids / "cgroup.procs")
            self.pids_cgroup = True

    def wrap(self, argv: list[str]) -> list[str]:
        return [
            "/bin/sh",
            "-c",
            _JOIN_SCRIPT,
            "rl360-join",
            str(len(self._procs)),
            *map(str, self._procs),
            *argv,
        ]

    def oom_kills(self) -> int:
        return _counter(self._events, "oom_kill")

    def grow_memory(self, extra_bytes: int) -> None:
        """Raise the memory limit to the reservation plus `extra_bytes`; never lowers it (a second
        grading of one sandbox keeps what the first was given: lowering v1's memsw below the limit
        is EINVAL, and what was granted is still the sandbox's own)."""
        if self._memory_bytes is None or self._memory_granted is None:
            return
        target = self._memory_bytes + max(0, extra_bytes)
        if target <= self._memory_granted:
            return
        self._memory_granted = target
        for path in self._memory_limits:  # memsw (v1) first: it may never be below the limit
            _write(path, str(target))

    def pids_refusals(self) -> int:
        return 0 if self._pids_events is None or not self.pids_cgroup else _counter(self._pids_events, "max")

    def _members(self) -> list[int]:
        pids: list[int] = []
        for procs in self._procs:
            with contextlib.suppress(OSError, ValueError):
                pids += [int(p) for p in procs.read_text().split()]
        return pids

    def kill_all(self) -> None:
        deadline = time.monotonic() + 5.0
        while (members := self._members()) and time.monotonic() < deadline:
            kill_pids(members)
            time.sleep(0.02)

    def close(self) -> None:
        for path in reversed(self._dirs):
            deadline = time.monotonic() + 5.0
            while path.exists():
                try:
                    path.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
        self._dirs.clear()


class WatchdogLimits(SandboxLimits):
    """CPU affinity plus a resident-memory poller over the sandbox's PID namespace."""

    mode = "watchdog"

    def __init__(self, cpus: float | None, memory_mb: int | None, poll_s: float = 0.1) -> None:
        self._memory_bytes = memory_mb * 2**20 if memory_mb is not None else None
        self._poll_s = poll_s
        self._cpu_list = self._pick_cpus(cpus)
        self._pidns: int | None = None
        self._kills = 0
        self._task: asyncio.Task[None] | None = None

    @staticmethod
    def _pick_cpus(cpus: float | None) -> list[int] | None:
        available = sorted(os.sched_getaffinity(0))
        if cpus is None or math.ceil(cpus) >= len(available):
            return None
        start = next(_cpu_cursor)
        return [available[(start + i) % len(available)] for i in range(math.ceil(cpus))]

    def wrap(self, argv: list[str]) -> list[str]:
        if self._cpu_list is None:
            return argv
        return ["/usr/bin/taskset", "-c", ",".join(map(str, self._cpu_list)), *argv]

    def attach(self, pidns_inode: int) -> None:
        self._pidns = pidns_inode
        if self._memory_bytes is not None:
            self._task = asyncio.get_running_loop().create_task(self._watch(pidns_inode, self._memory_bytes))

    async def _watch(self, pidns_inode: int, limit_bytes: int) -> None:
        while True:
            pids = pids_in_namespace(pidns_inode)
            if resident_bytes(pids) > limit_bytes:
                self._kills += 1
                kill_pids(pids)
                return
            await asyncio.sleep(self._poll_s)

    def oom_kills(self) -> int:
        return self._kills

    def kill_all(self) -> None:
        if self._pidns is None:
            return
        deadline = time.monotonic() + 5.0
        while (pids := pids_in_namespace(self._pidns)) and time.monotonic() < deadline:
            kill_pids(pids)
            time.sleep(0.02)

    def detach(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def close(self) -> None:
        self.detach()


def cgroups_usable() -> bool:
    """Whether this process can create a limited child cgroup right now."""
    probe_name = f"rl360-probe-{os.getpid()}-{next(_cpu_cursor)}"
    try:
        CgroupLimits(probe_name, cpus=1, memory_mb=64).close()
    except OSError:
        return False
    return True


def _cgroup_dirs() -> list[Path]:
    """This process's own cgroup directories (v2, or the v1 memory, cpu and pids controllers)."""
    own = _own_cgroup_paths()
    if (CGROUP_ROOT / "cgroup.controllers").exists() and "" in own:
        return [CGROUP_ROOT / own[""].lstrip("/")]
    dirs = []
    for controller, path in own.items():
        if controller in ("memory", "pids") or controller == "cpu" or controller.startswith("cpu,"):
            mount = CGROUP_ROOT / ("cpu" if controller.startswith("cpu") else controller)
            dirs.append(mount / path.lstrip("/"))
    return dirs


def sandbox_cgroups() -> list[Path]:
    """Every sandbox cgroup (any server's) under this process's own cgroup."""
    found = []
    for parent in _cgroup_dirs():
        with contextlib.suppress(OSError):
            found += [
                Path(entry.path)
                for entry in os.scandir(parent)
                if entry.name.startswith(CGROUP_PREFIX) and entry.is_dir(follow_symlinks=False)
            ]
    return found


def cgroup_owner(path: Path) -> str:
    """The owner tag in a sandbox cgroup's name (`rl360-sbx.<pid>.<start>.<sandbox>`)."""
    pid, _, rest = path.name[len(CGROUP_PREFIX) :].partition(".")
    return f"{pid}.{rest.partition('.')[0]}"


def _has_ancestor_started_at(pid: int, start: str) -> bool:
    """Whether a live ancestor of `pid` started at `start` (clock ticks since boot, as in an owner
    tag): a process the tag's server may still own, from a PID namespace where its pid differs.
    One read of /proc/<pid>/stat per process on the way up."""
    fields = stat_fields(pid)
    for _ in range(_ANCESTRY_DEPTH):
        if fields is None or int(fields[PARENT]) <= 1:
            return False
        fields = stat_fields(fields[PARENT])
        if fields is not None and fields[START_TIME] == start:
            return True
    return True  # deeper than any sandbox's chain: keep it


def _stale_members(path: Path, start: str) -> list[int]:
    """The processes left in a dead server's sandbox cgroup that no live process with the server's
    start time is an ancestor of: orphans of that server's sandboxes."""
    with contextlib.suppress(OSError, ValueError):
        members = [int(p) for p in (path / "cgroup.procs").read_text().split()]
        return [pid for pid in members if not _has_ancestor_started_at(pid, start)]
    return []


def clean_stale_cgroups(wait_s: float = 5.0) -> list[str]:
    """Remove the sandbox cgroups under this process's cgroup whose server (named by the owner
    tag in the cgroup's name) is gone; returns the removed paths.

    A dead server's sandboxes die with it (bwrap's --die-with-parent), except a sandbox whose
    outer bwrap died while it set the sandbox up: its inner bwrap (the sandbox's PID 1) waits
    forever for a user-namespace map that nobody will write. So the processes left in such a
    cgroup are killed first, unless a live process started at the server's start time is their
    ancestor (the server may live on in a PID namespace where its pid differs: never kill its
    sandboxes). A cgroup that still has processes when `wait_s` (for all of them together) ends
    is left alone."""
    stale = []
    for path in sandbox_cgroups():
        owner = cgroup_owner(path)
        if not owner_alive(owner):
            stale.append(path)
            kill_pids(_stale_members(path, owner.partition(".")[2]))
    removed = []
    deadline = time.monotonic() + wait_s
    while stale:
        left = []
        for path in stale:
            try:
                path.rmdir()
            except OSError:
                left.append(path)
            else:
                removed.append(str(path))
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
        stale = left
    return removed


def make_limits(
    mode: str, name: str, cpus: float | None, memory_mb: int | None, pids_max: int | None = None
) -> SandboxLimits:
    """Limits for one sandbox; `mode` is "auto", "cgroup" or "watchdog" (no cgroup: the process
    limit is then RLIMIT_NPROC alone)."""
    if mode not in ("auto", "cgroup", "watchdog"):
        raise ValueError(f"limits must be auto, cgroup or watchdog, got {mode!r}")
    if mode == "watchdog" or (cpus is None and memory_mb is None and pids_max is None):
        return WatchdogLimits(cpus, memory_mb)
    try:
        return CgroupLimits(f"{CGROUP_PREFIX}{name}"[:200], cpus, memory_mb, pids_max)
    except OSError:
        if mode == "cgroup":
            raise
        return WatchdogLimits(cpus, memory_mb)


def rlimit_argv(pids_max: int, file_bytes: int) -> list[str]:
    """argv prefix that execs the rest under RLIMIT_NPROC `pids_max` and RLIMIT_FSIZE `file_bytes`
    (soft = hard: the sandbox cannot raise them). Run it inside the sandbox's user namespace,
    where the kernel counts processes for this sandbox alone."""
    return [PRLIMIT, f"--nproc={pids_max}:{pids_max}", f"--fsize={file_bytes}:{file_bytes}", "--"]


@functools.cache
def _libc() -> ctypes.CDLL:
    """libc, looked up once per process (`find_library` runs `ldconfig -p`: ~3 ms a call)."""
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def mount_tmpfs(path: Path, size_bytes: int, inodes: int) -> None:
    """Mount a tmpfs of at most `size_bytes` and `inodes` (files and directories) at `path`,
    nosuid and nodev, its root owned by root with mode 0711 (others may pass, not list).
    Raises OSError."""
    options = f"size={size_bytes},nr_inodes={inodes},mode=0711,uid=0,gid=0"
    if _libc().mount(b"tmpfs", os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV, options.encode()) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"cannot mount a size-capped tmpfs at {path}: {os.strerror(errno)}")


def remount_tmpfs(path: Path, size_bytes: int, inodes: int) -> None:
    """Change the size and inode caps of the tmpfs mounted at `path` (by `mount_tmpfs`) in place:
    its files stay, every mount of it (a sandbox's binds included) sees the new caps. Raises
    OSError."""
    options = f"size={size_bytes},nr_inodes={inodes}"
    flags = _MS_REMOUNT | _MS_NOSUID | _MS_NODEV
    if _libc().mount(b"tmpfs", os.fsencode(path), b"tmpfs", flags, options.encode()) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"cannot resize the tmpfs at {path}: {os.strerror(errno)}")


def is_mount_point(path: Path) -> bool:
    try:
        return os.path.ismount(path) and not path.is_symlink()
    except OSError:
        return False


def unmount(path: Path) -> None:
    """Detach the file system mounted at `path` (lazily: still-open files keep it until closed);
    nothing happens when nothing is mounted there."""
    if is_mount_point(path) and _libc().umount2(os.fsencode(path), _MNT_DETACH) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"cannot unmount {path}: {os.strerror(errno)}")
