"""A task's private snapshot: its files copied out of the tasks root by descriptor, never through a link.

Owns turning a task name under the tasks root into a copy that nobody else can change, which is
what the server validates and what Harbor and the sandbox read (task.toml, instruction, tests,
solution, environment). The tasks root may be changed by others while a task loads (a task dir
swapped for a symlink, a file for a link to a host file), so:
- every segment of the task's name is opened with `O_NOFOLLOW | O_DIRECTORY` relative to its
  parent's descriptor (`rl360_ext.harbor.envs.nofollow.open_dir`): a link in any segment is
  refused, never followed;
- the tree is walked from that one descriptor: directories are opened with `O_NOFOLLOW`, files
  with `nofollow.open_regular` (a regular file by `fstat` of the opened descriptor, never
  through a link); whatever is swapped between the listing and the open is refused, so a copy
  holds only bytes read from the task's own tree;
- a link inside the task is kept as a relative link in the snapshot, and only if it stays in
  the task: its target must be inside the task (lexically when read, and resolved inside the
  snapshot, which nobody else can change); a link that loops (ELOOP, or a directory link to a
  directory that holds it) is refused; FIFOs, devices and sockets are refused;
- the copy is capped (entries, bytes, depth), and digested while it is made (every entry's kind,
  path, mode, bytes or link target): two snapshots with one digest are the same tree, so what
  the catalog derived from one holds for the other.
Sharing: attempts that load the same tree at the same time share one snapshot. A load first
walks and digests the task without writing anything; when a live snapshot of that task name has
the digest, the load takes a reference to it (the digest covers every byte, so it is the tree the
load just read); otherwise it copies the tree (digesting it again, as it is written). A snapshot
is removed when its last reference is released. So a group of attempts of one task costs one
copy, one parse and one removal, not one each; nothing writes into a snapshot once taken.
Refusals are `TaskSnapshotRefused(relative path, reason)`; the catalog names the task in them.
It does not own which names are tasks or what a task declares (`rl360_ext.harbor.catalog`).
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import socket
import stat
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from rl360_ext.errors import Rl360Error
from rl360_ext.harbor.envs import nofollow
from rl360_ext.harbor.envs.limits import owner_alive, owner_tag

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20
_OWNER_FILE = "owner"  # its server's host name and `owner_tag` (pid.starttime), for cleaning after a crash


class TaskSnapshotRefused(Rl360Error):
    """The task cannot be snapshotted; `path` is relative to the task ("" for the task itself)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path} {reason}" if path else reason)
        self.path = path


class TaskNameIsALink(TaskSnapshotRefused):
    """A segment of the task's name is a link or not a directory."""


@dataclass(frozen=True)
class SnapshotLimits:
    """Caps on one task's snapshot."""

    max_entries: int = 20_000
    """Files, directories and links, all together."""
    max_bytes: int = 512 * 2**20
    """Bytes of all files together."""
    max_depth: int = 32
    """Directories below the task's own."""


@dataclass
class _Count:
    entries: int = 0
    bytes: int = 0
    digest: Any = field(default_factory=hashlib.sha256)

    def add(self, kind: bytes, rel: PurePosixPath, *parts: bytes) -> None:
        for part in (kind, rel.as_posix().encode(), *parts):
            self.digest.update(len(part).to_bytes(8, "little") + part)


@dataclass(frozen=True)
class Snapshot:
    """A task's snapshot: its directory (named like the task) and the digest of its tree."""

    path: Path
    digest: str


@dataclass
class _Shared:
    snapshot: Snapshot
    references: int = 1


class SnapshotStore:
    """Where one server keeps its snapshots: a 0700 directory of its own, one subdirectory per
    snapshot, each shared by the loads of one task name and digest while any of them holds it.
    Thread-safe (loads run in threads)."""

    def __init__(self, parent: Path, limits: SnapshotLimits = SnapshotLimits()) -> None:
        self.limits = limits
        parent.mkdir(parents=True, exist_ok=True)
        self.removed_at_start = _remove_dead(parent)
        self.root = parent / f".rl360-task-snapshots-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.root.mkdir(mode=0o700)
        (self.root / _OWNER_FILE).write_text(f"{socket.gethostname()} {owner_tag()}")
        self._lock = threading.Lock()
        self._live: dict[tuple[str, str], _Shared] = {}  # (task dir name, digest) -> snapshot
        self._by_path: dict[Path, tuple[str, str]] = {}

    def take(self, tasks_root: Path, name: PurePosixPath) -> Snapshot:
        """A snapshot of the task `tasks_root/name`: a live one with the tree's digest, else a fresh
        copy; `release` it when done. Raises TaskSnapshotRefused, FileNotFoundError (no such task
        dir or no task.toml in it)."""
        dir_name = name.name or "task"
        digest = _snapshot(tasks_root, name, None, self.limits)
        if (shared := self._share((dir_name, digest))) is not None:
            return shared
        holder = self.root / uuid.uuid4().hex
        holder.mkdir(mode=0o700)
        target = holder / dir_name
        try:
            digest = _snapshot(tasks_root, name, target, self.limits)
        except BaseException:
            shutil.rmtree(holder, ignore_errors=True)
            raise
        fresh = Snapshot(target, digest)
        with self._lock:
            if (entry := self._live.get((dir_name, digest))) is None:
                self._live[(dir_name, digest)] = _Shared(fresh)
                self._by_path[target] = (dir_name, digest)
                return fresh
            entry.references += 1  # another load copied the same tree meanwhile: keep one copy
        shutil.rmtree(holder, ignore_errors=True)
        return entry.snapshot

    def _share(self, key: tuple[str, str]) -> Snapshot | None:
        with self._lock:
            if (entry := self._live.get(key)) is None:
                return None
            entry.references += 1
            return entry.snapshot

    def release(self, path: Path) -> bool:
        """Drop one reference to a snapshot `take` returned (its `path`); the last one removes it.
        Returns whether it was removed."""
        with self._lock:
            key = self._by_path.get(path)
            entry = self._live.get(key) if key is not None else None
            if entry is not None:
                entry.references -= 1
                if entry.references > 0:
                    return False
                del self._live[key], self._by_path[path]
        shutil.rmtree(path.parent, ignore_errors=True)
        return True

    def close(self) -> None:
        with self._lock:
            self._live.clear()
            self._by_path.clear()
        shutil.rmtree(self.root, ignore_errors=True)


def _remove_dead(parent: Path) -> int:
    """Remove the snapshot directories of servers on this host that are gone (SIGKILL leaves
    them); a directory of another host's server (a shared --trials-dir) is left alone."""
    removed = 0
    for entry in parent.glob(".rl360-task-snapshots-*"):
        try:
            host, tag = (entry / _OWNER_FILE).read_text().split()
        except (OSError, ValueError):
            continue
        if host == socket.gethostname() and not owner_alive(tag):
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
    return removed


def _open_task(tasks_root: Path, name: PurePosixPath) -> int:
    try:
        return nofollow.open_dir(tasks_root, name)
    except nofollow.UnsafePath as exc:
        raise TaskNameIsALink(
            "", f"a segment of the task's path is a link or not a directory ({exc})"
        ) from exc
    except NotADirectoryError as exc:
        raise TaskNameIsALink("", "a segment of the task's path is not a directory") from exc


def _snapshot(tasks_root: Path, name: PurePosixPath, target: Path | None, limits: SnapshotLimits) -> str:
    """The digest of the task's tree, copied into `target` as it is read (None: read only)."""
    source_fd = _open_task(tasks_root, name)
    links: list[PurePosixPath] = []
    try:
        try:
            toml = os.stat("task.toml", dir_fd=source_fd, follow_symlinks=False)
        except FileNotFoundError:
            raise FileNotFoundError(f"no task.toml in {name}") from None
        if not stat.S_ISREG(toml.st_mode):
            raise TaskSnapshotRefused("task.toml", "is not a regular file")
        target_fd = None
        if target is not None:
            os.mkdir(target, 0o700)
            target_fd = os.open(target, _DIR_FLAGS)
        count = _Count()
        try:
            _copy_dir(source_fd, target_fd, PurePosixPath(), count, limits, links, tasks_root / name)
        finally:
            if target_fd is not None:
                os.close(target_fd)
    finally:
        os.close(source_fd)
    if target is not None:  # a read-only pass is only ever shared with a copy that was checked
        for link in links:
            _check_link(target, link)
    return count.digest.hexdigest()


def _copy_dir(
    source_fd: int,
    target_fd: int | None,
    relative: PurePosixPath,
    count: _Count,
    limits: SnapshotLimits,
    links: list[PurePosixPath],
    original: Path,
) -> None:
    if len(relative.parts) > limits.max_depth:
        raise TaskSnapshotRefused(
            relative.as_posix(), f"is nested deeper than {limits.max_depth} directories"
        )
    with os.scandir(source_fd) as entries:
        names = []
        for entry in entries:
            count.entries += 1
            if count.entries > limits.max_entries:
                raise TaskSnapshotRefused("", f"has more than {limits.max_entries} files and directories")
            names.append(entry.name)
    for name in sorted(names):
        rel = relative / name
        try:
            info = os.stat(name, dir_fd=source_fd, follow_symlinks=False)
        except FileNotFoundError as exc:
            raise TaskSnapshotRefused(rel.as_posix(), "changed while the task was read") from exc
        if stat.S_ISDIR(info.st_mode):
            count.add(b"d", rel)
            child = _open_child(source_fd, name, rel)
            try:
                out = None
                if target_fd is not None:
                    os.mkdir(name, 0o700, dir_fd=target_fd)
                    out = os.open(name, _DIR_FLAGS, dir_fd=target_fd)
                try:
                    _copy_dir(child, out, rel, count, limits, links, original)
                finally:
                    if out is not None:
                        os.close(out)
            finally:
                os.close(child)
        elif stat.S_ISREG(info.st_mode):
            _copy_file(source_fd, target_fd, name, rel, count, limits)
        elif stat.S_ISLNK(info.st_mode):
            target = _link_target(source_fd, name, rel, original)
            count.add(b"l", rel, target.encode())
            if target_fd is not None:
                os.symlink(target, name, dir_fd=target_fd)
            links.append(rel)
        else:
            raise TaskSnapshotRefused(rel.as_posix(), "is not a regular file or directory")


def _open_child(parent_fd: int, name: str, rel: PurePosixPath) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
            raise TaskSnapshotRefused(rel.as_posix(), "changed while the task was read") from exc
        raise


def _copy_file(
    source_fd: int,
    target_fd: int | None,
    name: str,
    rel: PurePosixPath,
    count: _Count,
    limits: SnapshotLimits,
) -> None:
    try:
        fd = nofollow.open_regular(source_fd, name)
    except OSError as exc:  # swapped for a link, a FIFO or nothing since it was listed
        raise TaskSnapshotRefused(rel.as_posix(), "changed while the task was read") from exc
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode) & 0o755 | 0o600
        count.add(b"f", rel, oct(mode).encode())
        out = os.open(name, _CREATE_FLAGS, mode, dir_fd=target_fd) if target_fd is not None else None
        try:
            while chunk := os.read(fd, _CHUNK):
                count.add(b"c", rel, chunk)
                count.bytes += len(chunk)
                if count.bytes > limits.max_bytes:
                    raise TaskSnapshotRefused("", f"is larger than {limits.max_bytes} bytes")
                view = memoryview(chunk)
                while out is not None and view:
                    view = view[os.write(out, view) :]
        finally:
            if out is not None:
                os.close(out)
    finally:
        os.close(fd)


def _leaves(rel: PurePosixPath) -> TaskSnapshotRefused:
    return TaskSnapshotRefused(rel.as_posix(), "is a link that leaves the task directory")


def _link_target(source_fd: int, name: str, rel: PurePosixPath, original: Path) -> str:
    """The link's target as a path relative to the link, when it stays lexically in the task."""
    try:
        target = os.readlink(name, dir_fd=source_fd)
    except OSError as exc:
        raise TaskSnapshotRefused(rel.as_posix(), "changed while the task was read") from exc
    if os.path.isabs(target):
        absolute = os.path.normpath(target)
        if absolute != str(original) and not absolute.startswith(str(original) + os.sep):
            raise _leaves(rel)
        target = os.path.relpath(absolute, original / rel.parent)
    inside = os.path.normpath(os.path.join(rel.parent.as_posix(), target))
    if inside == ".." or inside.startswith("../") or os.path.isabs(inside):
        raise _leaves(rel)
    return target


def _check_link(snapshot: Path, rel: PurePosixPath) -> None:
    """A kept link resolves inside the snapshot (nobody else can change it) and does not loop."""
    link = snapshot / rel
    resolved = Path(os.path.realpath(link))
    if resolved != snapshot and snapshot not in resolved.parents:
        raise _leaves(rel)
    try:
        info = os.stat(link)
    except FileNotFoundError:
        return  # dangling: nothing to read through it
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise TaskSnapshotRefused(rel.as_posix(), "is a link loop") from exc
        raise
    if stat.S_ISDIR(info.st_mode) and (resolved == link.parent or resolved in link.parent.parents):
        raise TaskSnapshotRefused(rel.as_posix(), "is a link loop (a link to a directory that holds it)")
