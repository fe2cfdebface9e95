"""Bytes read back from a sandbox's pipes, capped while they are read: a command's output (its
head and tail, `HeadTail`, read as it comes by `_Capture`) and a holder's start handshake
(`read_handshake`)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import select
import time

_HANDSHAKE_CAP = 4000  # bytes read of a holder's info, first line and stderr at start
_PIPE_BYTES = 1 << 20  # asked-for pipe buffer of a command's stdout/stderr (fewer wake-ups)
_F_SETPIPE_SZ = 1031


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
