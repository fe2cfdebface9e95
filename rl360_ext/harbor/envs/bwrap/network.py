"""Egress for a sandbox whose task asks for network: slirp4netns NATs the sandbox's own network
namespace (never the host's), and unreachable routes keep link-local and the host's own
addresses out of its reach."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import os
import shutil
from pathlib import Path

from harbor.environments.base import SandboxBuildFailedError

from rl360_ext.harbor.envs.bwrap.capture import _Capture
from rl360_ext.harbor.envs.bwrap.layout import _READY_TIMEOUT_S, SANDBOX_PATH

_NS_GET_USERNS = 0xB701  # ioctl on a namespace fd: the user namespace that owns it
_IP = "/usr/sbin/ip"
_NSENTER = "/usr/bin/nsenter"
_LINK_LOCAL = ("169.254.0.0/16",)


def slirp4netns_executable() -> str | None:
    return shutil.which("slirp4netns", path=SANDBOX_PATH)


class Slirp:
    """One sandbox's slirp4netns (started by `start`, gone after `stop`), with its stderr read as
    it comes (bounded)."""

    def __init__(self) -> None:
        self._process: asyncio.subprocess.Process | None = None
        self._exit_fd: int | None = None
        self._log: _Capture | None = None

    async def start(self, init_pid: int | None, uid: int) -> None:
        """NAT egress for the sandbox's own network namespace: slirp4netns, run as the sandbox's
        unprivileged host uid inside the user namespace that owns the network namespace, with
        host loopback refused; then unreachable routes for link-local and the host's own
        addresses. It exits when `_exit_fd` closes (or this process dies)."""
        try:
            blocked_networks = self.blocked_networks()
        except (OSError, ValueError) as exc:
            raise SandboxBuildFailedError(f"cannot list the host's addresses to block: {exc}") from exc
        net_fd = os.open(f"/proc/{init_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        ready_r, ready_w = os.pipe()
        exit_r, exit_w = os.pipe()
        self._log = log = _Capture(8192)
        try:
            user_fd = fcntl.ioctl(net_fd, _NS_GET_USERNS)
            try:
                self._process = await asyncio.create_subprocess_exec(
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
        self._exit_fd = exit_w
        try:
            ready = await _read_one_byte(ready_r, _READY_TIMEOUT_S)
        finally:
            os.close(ready_r)
        if ready != b"1":
            await self.stop()
            raise SandboxBuildFailedError(f"slirp4netns failed: {log.text().strip()}")
        routes = "".join(f"route add unreachable {net}\n" for net in blocked_networks)
        blocked = await asyncio.create_subprocess_exec(
            _NSENTER,
            f"--net=/proc/{init_pid}/ns/net",
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
            await self.stop()
            raise SandboxBuildFailedError(
                f"cannot block link-local and host addresses: {err.decode(errors='replace')[-500:]}"
            )

    @staticmethod
    def blocked_networks() -> list[str]:
        """Link-local, and every IPv4 address of the host's own interfaces (slirp4netns would
        otherwise connect to them from the host's namespace)."""
        return [*_LINK_LOCAL, *(f"{address}/32" for address in sorted(_host_addresses()))]

    async def stop(self) -> None:
        if self._exit_fd is not None:
            os.close(self._exit_fd)
            self._exit_fd = None
        if self._process is not None:
            try:
                await asyncio.wait_for(self._process.wait(), timeout=2.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self._process.kill()
                await self._process.wait()
            self._process = None
        if self._log is not None:
            self._log.close()
            self._log = None


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
