"""Files in and out of a bwrap sandbox, on the host side and without following anything the
sandbox planted (`rl360_ext.harbor.envs.nofollow`): uploads, capped downloads, and `is_dir`,
`is_file` and `remove_files` answered without a command in the writable directories."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.utils.path_filter import filter_paths_by_patterns

from rl360_ext.harbor.envs import nofollow
from rl360_ext.harbor.envs.bwrap.sandbox import _Sandbox

_log = logging.getLogger(__name__)


class SandboxFiles(_Sandbox):
    """The file half of Harbor's environment interface over a sandbox's writable directories;
    `BwrapEnvironment` puts it before Harbor's `BaseEnvironment` (whose `is_dir` and `is_file`
    answer paths outside them)."""

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
