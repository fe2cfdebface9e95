"""Host-side file access under directories a sandbox can write, without following links.

Owns every read, write and copy the host does inside a sandbox-visible directory. The sandbox
runs concurrently and may swap any entry for a symlink, a FIFO or a huge file at any moment, so
path strings are never resolved: each step opens one component relative to its parent's file
descriptor with `O_NOFOLLOW` (directories also `O_DIRECTORY`), files are created with
`O_CREAT | O_EXCL | O_NOFOLLOW` after whatever was in the way is removed (a planted link is
replaced, never written through), and files are read only when `fstat` on the opened descriptor
says they are regular, at most a byte cap. Copies out of a sandbox skip links, devices, FIFOs
and sockets, and stop at an inode (files and directories alike), byte, depth and time budget.
Every walk of a sandbox tree (removal, emptying, the owner and mode reset before grading, copies
out) is iterative and capped in entries and depth: whatever tree the sandbox left, the host
either walks it or raises `SandboxTreeError`, never RecursionError. It does not own which
sandbox paths exist or who may use them (`rl360_ext.harbor.envs.bwrap`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from rl360_ext.errors import Rl360Error

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20
_CREATE_ATTEMPTS = 8

Owner = tuple[int, int]


class UnsafePath(Rl360Error, PermissionError):
    """A path component is a link or not the kind of file expected; nothing was followed."""


class TooLarge(Rl360Error, ValueError):
    """A file is larger than the cap it is read with."""


class SandboxTreeError(Rl360Error, RuntimeError):
    """A tree a sandbox left cannot be walked within the host's caps (more entries or levels than
    allowed, or one that moved under the walk): the doing of the sandbox phase that left it."""


MAX_WALK_ENTRIES = 1 << 20  # default cap of one walk: entries visited (a level counts as one)


@dataclass
class CopyBudget:
    """Caps for one copy out of a sandbox; what is over a cap is skipped and listed in `skipped`.
    Every inode the copy creates on the host (files and directories) counts against
    `max_inodes`; past `max_seconds` on `clock` (from the budget's creation) nothing more is
    copied."""

    max_file_bytes: int = 64 * 2**20
    max_total_bytes: int = 256 * 2**20
    max_inodes: int = 10_000
    max_depth: int = 32
    max_seconds: float = 10.0
    copied_bytes: int = 0
    copied_inodes: int = 0
    skipped: list[str] = field(default_factory=list)
    clock: Callable[[], float] = time.monotonic
    started: float = field(init=False)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def out_of_time(self) -> bool:
        return self.clock() - self.started > self.max_seconds

    def take_inode(self, rel: PurePosixPath, what: str) -> bool:
        """Count one host inode for `rel`; False (and `rel` listed as skipped) past a cap."""
        if self.out_of_time():
            self.skipped.append(f"{rel}{what} (the copy's {self.max_seconds:g}s time budget is spent)")
            return False
        if self.copied_inodes >= self.max_inodes:
            self.skipped.append(f"{rel}{what} (more than {self.max_inodes} files and directories)")
            return False
        self.copied_inodes += 1
        return True


def _parts(relative: PurePosixPath) -> list[str]:
    parts = [part for part in relative.parts if part not in ("", ".")]
    for part in parts:
        if part == ".." or "/" in part or "\0" in part:
            raise UnsafePath(f"path component {part!r} is not allowed")
    return parts


def _chown(fd: int, owner: Owner | None) -> None:
    if owner is not None:
        os.fchown(fd, *owner)


def remove_entry(dir_fd: int, name: str, max_entries: int = MAX_WALK_ENTRIES) -> None:
    """Remove `name` in the directory `dir_fd`, whatever it is; a directory is removed with its
    contents without following links inside it, iteratively (`walk`: any depth, two descriptors
    open). Raises SandboxTreeError past `max_entries`."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)
        return
    try:
        child = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    try:
        walk(child, on_file=_unlink, on_leave=_rmdir, max_entries=max_entries)
    finally:
        os.close(child)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(name, dir_fd=dir_fd)


def _unlink(parent_fd: int, name: str, info: os.stat_result) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=parent_fd)


def _rmdir(parent_fd: int, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(name, dir_fd=parent_fd)


def _identity(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


def _names(fd: int, room: int) -> list[str]:
    """The names in the directory `fd`, read lazily; SandboxTreeError past `room` of them."""
    with os.scandir(fd) as entries:
        names = [entry.name for _, entry in zip(range(room + 1), entries, strict=False)]
    if len(names) > room:
        raise SandboxTreeError(f"a sandbox tree holds more entries than the walk's cap ({room} left)")
    return names


def walk(
    root_fd: int,
    *,
    on_file: Callable[[int, str, os.stat_result], None] | None = None,
    on_dir: Callable[[int], None] | None = None,
    on_leave: Callable[[int, str], None] | None = None,
    max_entries: int = MAX_WALK_ENTRIES,
    max_depth: int | None = None,
) -> int:
    """Visit the tree under the directory `root_fd` depth-first, without recursion and without
    following a link: `on_file(parent_fd, name, lstat)` for each entry that is not a directory,
    `on_dir(fd)` for each directory below the root once it is opened (O_NOFOLLOW), and
    `on_leave(parent_fd, name)` after its contents. At most two descriptors are open whatever
    the depth: the walk goes back up through "..", checked against the parent it came from.
    Returns the number of entries visited; raises SandboxTreeError past `max_entries` entries
    or `max_depth` levels (default: as deep as the entries allow), or when a directory moved
    under the walk. Meant for trees no process writes to while they are walked."""
    depth_cap = max_entries if max_depth is None else max_depth
    fd = os.dup(root_fd)
    stack: list[tuple[list[str], tuple[int, int], str]] = []  # each ancestor: names left, identity, child
    try:
        names = _names(fd, max_entries)
        seen = len(names)
        identity = _identity(fd)
        while True:
            if not names:
                if not stack:
                    return seen
                parent_names, parent_identity, name = stack.pop()
                parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = parent
                if _identity(fd) != parent_identity:
                    raise SandboxTreeError("a directory of a sandbox tree moved while it was walked")
                names, identity = parent_names, parent_identity
                if on_leave is not None:
                    on_leave(fd, name)
                continue
            name = names.pop()
            try:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not stat.S_ISDIR(info.st_mode):
                if on_file is not None:
                    on_file(fd, name, info)
                continue
            if len(stack) >= depth_cap:
                raise SandboxTreeError(f"a sandbox tree is deeper than the walk's cap ({depth_cap} levels)")
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except (FileNotFoundError, NotADirectoryError):
                continue
            if _identity(child) != (info.st_dev, info.st_ino):
                os.close(child)
                raise SandboxTreeError(f"{name!r} in a sandbox tree changed while it was walked")
            stack.append((names, identity, name))
            os.close(fd)
            fd = child
            identity = (info.st_dev, info.st_ino)
            if on_dir is not None:
                on_dir(fd)
            names = _names(fd, max_entries - seen)
            seen += len(names)
    finally:
        os.close(fd)


def reset_owner(fd: int, owner: Owner, bits: int = 0o700) -> None:
    """Give the file `fd` the owner `owner` and at least the permission `bits` (others kept)."""
    info = os.fstat(fd)
    if (info.st_uid, info.st_gid) != owner:
        os.fchown(fd, *owner)
    mode = stat.S_IMODE(info.st_mode)
    if mode & bits != bits:
        os.fchmod(fd, mode | bits)


def reset_tree(root_fd: int, owner: Owner, max_entries: int = MAX_WALK_ENTRIES) -> int:
    """Give every directory and regular file under (and including) the directory `root_fd` the
    owner `owner` and owner permissions (directories u+rwx, files u+rw; other bits are kept):
    what a sandbox's chmod took from its own user is back. Links and special files are left as
    they are; nothing is followed. Returns the entries visited (SandboxTreeError past
    `max_entries`)."""

    def on_file(parent_fd: int, name: str, info: os.stat_result) -> None:
        if not stat.S_ISREG(info.st_mode):
            return
        if (info.st_uid, info.st_gid) == owner and info.st_mode & 0o600 == 0o600:
            return  # nothing to give back: not opened
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=parent_fd)
        except (FileNotFoundError, NotADirectoryError):
            return
        try:
            if _identity(fd) == (info.st_dev, info.st_ino):
                reset_owner(fd, owner, 0o600)
        finally:
            os.close(fd)

    reset_owner(root_fd, owner)
    return walk(root_fd, on_file=on_file, on_dir=lambda fd: reset_owner(fd, owner), max_entries=max_entries)


def _open_child_dir(parent_fd: int, name: str, create: bool, owner: Owner | None) -> int:
    for _ in range(_CREATE_ATTEMPTS):
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except FileNotFoundError:
            if not create:
                raise
        except (NotADirectoryError, OSError) as exc:
            if isinstance(exc, NotADirectoryError) or exc.errno == errno.ELOOP:
                if not create:
                    raise UnsafePath(f"{name!r} is a link or not a directory") from exc
                remove_entry(parent_fd, name)
            else:
                raise
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=parent_fd)
            if owner is not None:
                os.chown(name, *owner, dir_fd=parent_fd, follow_symlinks=False)
    raise UnsafePath(f"{name!r} keeps changing while it is opened")


def open_dir(
    root: Path, relative: PurePosixPath = PurePosixPath(), *, create: bool = False, owner: Owner | None = None
) -> int:
    """A descriptor of `root/relative`, opened one component at a time without following links.
    `root` itself is host-owned; with `create`, missing directories are made (owned by `owner`)
    and links or files in the way are removed first."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in _parts(relative):
            child = _open_child_dir(fd, part, create, owner)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def opened_dir(
    root: Path, relative: PurePosixPath = PurePosixPath(), *, create: bool = False, owner: Owner | None = None
) -> Iterator[int]:
    fd = open_dir(root, relative, create=create, owner=owner)
    try:
        yield fd
    finally:
        os.close(fd)


def open_regular(dir_fd: int | None, name: str | Path) -> int:
    """A read descriptor of a regular file, never through a link (the last component is opened
    with O_NOFOLLOW; with `dir_fd`, relative to that directory)."""
    fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd) if dir_fd is not None else os.open(name, _READ_FLAGS)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePath(f"{name} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_capped(fd: int, limit: int, name: str | Path) -> bytes:
    chunks, total = [], 0
    while chunk := os.read(fd, min(_CHUNK, limit + 1 - total)):
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise TooLarge(f"{name} is larger than {limit} bytes")
    return b"".join(chunks)


def read_regular(path: Path, limit: int, dir_fd: int | None = None) -> bytes:
    """The bytes of a regular file, at most `limit` (TooLarge past it), never through a link in
    its last component; raises FileNotFoundError, UnsafePath or TooLarge."""
    try:
        fd = open_regular(dir_fd, path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"{path} is a symbolic link") from exc
        raise
    try:
        return _read_capped(fd, limit, path)
    finally:
        os.close(fd)


def _write_from(
    dir_fd: int, name: str, writer: Callable[[int], None], mode: int, owner: Owner | None
) -> None:
    for _ in range(_CREATE_ATTEMPTS):
        remove_entry(dir_fd, name)
        try:
            fd = os.open(name, _CREATE_FLAGS, mode, dir_fd=dir_fd)
        except FileExistsError:
            continue  # something was planted again between the removal and the open
        try:
            writer(fd)
            _chown(fd, owner)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        return
    raise UnsafePath(f"{name!r} keeps being replaced while it is written")


def write_bytes(
    dir_fd: int, name: str, data: bytes, *, mode: int = 0o644, owner: Owner | None = None
) -> None:
    """Create `name` in `dir_fd` with `data`, replacing whatever was there (a planted link is
    removed, never followed)."""

    def writer(fd: int) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    _write_from(dir_fd, name, writer, mode, owner)


class OutOfTime(Rl360Error, TimeoutError):
    """A copy ran past its time budget."""


def _copy_fd(source_fd: int, target_fd: int, limit: int | None, budget: CopyBudget | None = None) -> int:
    copied = 0
    while chunk := os.read(source_fd, _CHUNK):
        copied += len(chunk)
        if limit is not None and copied > limit:
            raise TooLarge(f"more than {limit} bytes")
        if budget is not None and budget.out_of_time():
            raise OutOfTime(f"the copy's {budget.max_seconds:g}s time budget is spent")
        view = memoryview(chunk)
        while view:
            view = view[os.write(target_fd, view) :]
    return copied


def copy_file_in(source: Path, dir_fd: int, name: str, *, owner: Owner | None = None) -> None:
    """Copy a host file into `dir_fd/name` (a sandbox directory), keeping its permission bits."""
    source_fd = open_regular(None, source)
    try:
        mode = stat.S_IMODE(os.fstat(source_fd).st_mode) | 0o600

        def writer(fd: int) -> None:
            _copy_fd(source_fd, fd, None)

        _write_from(dir_fd, name, writer, mode, owner)
    finally:
        os.close(source_fd)


def copy_tree_in(
    source: Path, dir_fd: int, *, owner: Owner | None = None, keep: Callable[[Path], bool] | None = None
) -> None:
    """Copy a host directory's files and directories into the sandbox directory `dir_fd`. Links
    and special files in the source are skipped; `keep` filters source paths."""
    for entry in sorted(os.scandir(source), key=lambda e: e.name):
        path = Path(entry.path)
        if keep is not None and not keep(path):
            continue
        if entry.is_dir(follow_symlinks=False):
            child = _open_child_dir(dir_fd, entry.name, True, owner)
            try:
                copy_tree_in(path, child, owner=owner, keep=keep)
            finally:
                os.close(child)
        elif entry.is_file(follow_symlinks=False):
            copy_file_in(path, dir_fd, entry.name, owner=owner)


def _host_dir(target: Path) -> int:
    target.mkdir(parents=True, exist_ok=True)
    return os.open(target, _DIR_FLAGS)


def copy_tree_out(
    dir_fd: int, target: Path, budget: CopyBudget, keep: Callable[[PurePosixPath], bool] | None = None
) -> None:
    """Copy the regular files and directories under the sandbox directory `dir_fd` to the host
    directory `target`. Links, devices, FIFOs and sockets are skipped; what is over the budget's
    caps (size, inodes, depth, time) is skipped and listed in `budget.skipped`; `keep` filters
    relative paths. Iterative: one source and one target descriptor open per level, at most
    `budget.max_depth` levels."""
    names = _listed(dir_fd, PurePosixPath(), budget)
    target_fd = _host_dir(target)
    try:
        source_fd = os.dup(dir_fd)
    except BaseException:
        os.close(target_fd)
        raise
    frames = [_CopyFrame(source_fd, target_fd, PurePosixPath(), names)]
    try:
        while frames:
            frame = frames[-1]
            if not frame.names or budget.out_of_time():
                if frame.names:
                    spent = f"the copy's {budget.max_seconds:g}s time budget is spent"
                    budget.skipped.append(f"{frame.relative}/ ({spent})")
                frames.pop().close()
                continue
            name = frame.names.pop()
            child = _copy_entry(frame, name, len(frames) - 1, budget, keep)
            if child is not None:
                frames.append(child)
    finally:
        for frame in frames:
            frame.close()


@dataclass
class _CopyFrame:
    """One directory of a copy out: its source and target descriptors, what is left to copy."""

    source_fd: int
    target_fd: int
    relative: PurePosixPath
    names: list[str]  # left to copy, the next one last

    def close(self) -> None:
        os.close(self.source_fd)
        os.close(self.target_fd)


def _listed(dir_fd: int, relative: PurePosixPath, budget: CopyBudget) -> list[str]:
    """A directory's names to copy, in reverse order (popped first to last), at most what is left
    of the inode budget."""
    room = budget.max_inodes - budget.copied_inodes
    with os.scandir(dir_fd) as entries:  # lazily: a directory of millions of names is not listed
        names = [entry.name for _, entry in zip(range(room + 1), entries, strict=False)]
    if len(names) > room:
        budget.skipped.append(f"{relative}/ (more than the {room} entries left of the inode budget)")
    return sorted(names[:room], reverse=True)


def _copy_entry(
    frame: _CopyFrame,
    name: str,
    depth: int,
    budget: CopyBudget,
    keep: Callable[[PurePosixPath], bool] | None,
) -> _CopyFrame | None:
    """Copy one entry of `frame`'s directory: a regular file now, a directory's frame returned."""
    rel = frame.relative / name
    try:
        info = os.stat(name, dir_fd=frame.source_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISREG(info.st_mode) and (keep is None or keep(rel)):
        _copy_file_out(frame.source_fd, name, frame.target_fd, rel, budget)
        return None
    if not stat.S_ISDIR(info.st_mode):
        return None
    if depth + 1 > budget.max_depth:
        budget.skipped.append(f"{rel}/ (deeper than {budget.max_depth})")
        return None
    if not budget.take_inode(rel, "/"):
        return None
    try:
        child = os.open(name, _DIR_FLAGS, dir_fd=frame.source_fd)
    except OSError:
        return None  # swapped for something else since the stat: skip it
    try:
        out = _open_child_dir(frame.target_fd, name, True, None)
    except BaseException:
        os.close(child)
        raise
    try:
        names = _listed(child, rel, budget)
    except BaseException:
        os.close(child)
        os.close(out)
        raise
    return _CopyFrame(child, out, rel, names)


def _copy_file_out(dir_fd: int, name: str, target_fd: int, rel: PurePosixPath, budget: CopyBudget) -> None:
    try:
        source_fd = open_regular(dir_fd, name)
    except OSError:
        return  # swapped for a link or removed since the stat: skip it
    try:
        size = os.fstat(source_fd).st_size
        limit = min(budget.max_file_bytes, budget.max_total_bytes - budget.copied_bytes)
        if size > limit:
            budget.skipped.append(f"{rel} ({size} bytes, over the cap)")
            return
        if not budget.take_inode(rel, ""):
            return
        copied: list[int] = []

        def writer(fd: int) -> None:
            copied.append(_copy_fd(source_fd, fd, limit, budget))

        try:
            _write_from(target_fd, name, writer, 0o644, None)
        except TooLarge:
            remove_entry(target_fd, name)
            budget.skipped.append(f"{rel} (grew past the cap while copied)")
            return
        except OutOfTime as exc:
            remove_entry(target_fd, name)
            budget.skipped.append(f"{rel} ({exc})")
            return
        budget.copied_bytes += sum(copied)
    finally:
        os.close(source_fd)


def copy_file_out(dir_fd: int, name: str, target: Path, limit: int) -> None:
    """Copy the regular file `dir_fd/name` (a sandbox directory) to the host path `target`, at
    most `limit` bytes (TooLarge past it); raises UnsafePath for a link or a special file."""
    try:
        source_fd = open_regular(dir_fd, name)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"{name} is a symbolic link") from exc
        raise
    try:
        if os.fstat(source_fd).st_size > limit:
            raise TooLarge(f"{name} is larger than {limit} bytes")
        target_fd = _host_dir(target.parent)
        try:

            def writer(fd: int) -> None:
                _copy_fd(source_fd, fd, limit)

            try:
                _write_from(target_fd, target.name, writer, 0o644, None)
            except TooLarge:
                remove_entry(target_fd, target.name)
                raise
        finally:
            os.close(target_fd)
    finally:
        os.close(source_fd)
