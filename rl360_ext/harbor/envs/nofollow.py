"""Host-side file access under directories a sandbox can write, without following links.

Owns every read, write and copy the host does inside a sandbox-visible directory. The sandbox
runs concurrently and may swap any entry for a symlink, a FIFO or a huge file at any moment, so
path strings are never resolved: each step opens one component relative to its parent's file
descriptor with `O_NOFOLLOW` (directories also `O_DIRECTORY`), files are created with
`O_CREAT | O_EXCL | O_NOFOLLOW` after whatever was in the way is removed (a planted link is
replaced, never written through), and files are read only when `fstat` on the opened descriptor
says they are regular, at most a byte cap. Copies out of a sandbox skip links, devices, FIFOs
and sockets, and stop at an inode (files and directories alike), byte, depth and time budget.
It does not own which sandbox paths exist or who may use them (`rl360_ext.harbor.envs.bwrap`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20
_CREATE_ATTEMPTS = 8

Owner = tuple[int, int]


class UnsafePath(PermissionError):
    """A path component is a link or not the kind of file expected; nothing was followed."""


class TooLarge(ValueError):
    """A file is larger than the cap it is read with."""


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


def remove_entry(dir_fd: int, name: str) -> None:
    """Remove `name` in the directory `dir_fd`, whatever it is; a directory is removed with its
    contents without following links inside it."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)


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


class OutOfTime(TimeoutError):
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
    relative paths."""
    target_fd = _host_dir(target)
    try:
        _copy_out(dir_fd, target_fd, PurePosixPath(), budget, keep, 0)
    finally:
        os.close(target_fd)


def _copy_out(
    dir_fd: int,
    target_fd: int,
    relative: PurePosixPath,
    budget: CopyBudget,
    keep: Callable[[PurePosixPath], bool] | None,
    depth: int,
) -> None:
    room = budget.max_inodes - budget.copied_inodes
    with os.scandir(dir_fd) as entries:  # lazily: a directory of millions of names is not listed
        names = [entry.name for _, entry in zip(range(room + 1), entries, strict=False)]
    if len(names) > room:
        budget.skipped.append(f"{relative}/ (more than the {room} entries left of the inode budget)")
    for name in sorted(names[:room]):
        if budget.out_of_time():
            budget.skipped.append(f"{relative}/ (the copy's {budget.max_seconds:g}s time budget is spent)")
            return
        rel = relative / name
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(info.st_mode):
            if depth + 1 > budget.max_depth:
                budget.skipped.append(f"{rel}/ (deeper than {budget.max_depth})")
                continue
            if not budget.take_inode(rel, "/"):
                continue
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
            except OSError:
                continue  # swapped for something else since the stat: skip it
            try:
                out = _open_child_dir(target_fd, name, True, None)
                try:
                    _copy_out(child, out, rel, budget, keep, depth + 1)
                finally:
                    os.close(out)
            finally:
                os.close(child)
        elif stat.S_ISREG(info.st_mode) and (keep is None or keep(rel)):
            _copy_file_out(dir_fd, name, target_fd, rel, budget)


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
