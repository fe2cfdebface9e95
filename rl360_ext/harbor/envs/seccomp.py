"""A seccomp filter for bubblewrap sandboxes: the kernel interfaces no task needs, refused.

Owns one classic-BPF program, assembled here without libseccomp, that makes `bpf`,
`perf_event_open`, `io_uring_setup`, `io_uring_enter` and `io_uring_register` fail with EPERM
(large, often-exploited kernel surfaces) and allows everything else. The program checks the
calling convention first: each architecture this machine can run (x86_64 with i386, aarch64
with arm) has its own syscall numbers, x32 calls on x86_64 are refused, and a call from any
other architecture is refused. The ways in: `program()` for bwrap's `--seccomp FD` (the
sandbox's holder); for commands, the host-side process that enters the sandbox loads it before
it execs (a filter survives exec and setns and cannot be removed, so every command and its
descendants inherit it): `exec_prefix()`, an argv prefix that has Perl (part of every Debian
base system) make the one prctl call and exec the rest (about 2 ms of the command's own
CPU), else `install()` as a preexec_fn (which makes Python fork the whole server instead of
vfork: a few ms of the server's CPU per command). It does not own when it is applied
(`rl360_ext.harbor.envs.bwrap`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import shutil
import struct
from typing import Any

from rl360_ext.errors import Rl360Error

# classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h)
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_OFFSET_NR, _OFFSET_ARCH = 0, 4  # struct seccomp_data
_X32_BIT = 0x40000000
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_PRCTL_NR = {"x86_64": 157, "aarch64": 167}
PERL = "/usr/bin/perl"
# argv: the filter in hex, then the command; one prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER,
# &sock_fprog) with sock_fprog = {u16 len, 6 bytes padding, pointer}, then exec without a shell
_PERL_LOADER = (
    'my $f = pack("H*", shift @ARGV); my $p = pack("S x6 P" . length($f), length($f) / 8, $f); '
    'syscall({nr}, {op}, {mode}, $p, 0, 0) == 0 or die "rl360 seccomp: $!\\n"; '
    'exec {{ $ARGV[0] }} @ARGV or die "rl360 seccomp: exec $ARGV[0]: $!\\n";'
)

# (audit arch, bpf, perf_event_open, io_uring_setup, io_uring_enter, io_uring_register)
_ARCHES: dict[str, list[tuple[int, tuple[int, ...]]]] = {
    "x86_64": [(0xC000003E, (321, 298, 425, 426, 427)), (0x40000003, (357, 336, 425, 426, 427))],
    "aarch64": [(0xC00000B7, (280, 241, 425, 426, 427)), (0x40000028, (386, 364, 425, 426, 427))],
}
REFUSED = ("bpf", "perf_event_open", "io_uring_setup", "io_uring_enter", "io_uring_register")


class SeccompUnsupported(Rl360Error, RuntimeError):
    """This machine's architecture has no syscall table here."""


def _instruction(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _assemble(machine: str) -> bytes:
    arches = _ARCHES.get(machine)
    if arches is None:
        raise SeccompUnsupported(f"no seccomp syscall table for machine {machine!r}")
    deny = _RET_ERRNO | errno.EPERM
    blocks: list[list[tuple[int, int, str | None]]] = []  # (code, k, label jumped to when true)
    for arch, numbers in arches:
        block: list[tuple[int, int, str | None]] = [(_LD_W_ABS, _OFFSET_NR, None)]
        if arch == 0xC000003E:
            block.append((_JGE_K, _X32_BIT, "deny"))
        block += [(_JEQ_K, number, "deny") for number in numbers]
        block.append((_RET_K, _RET_ALLOW, None))
        blocks.append(block)
    # layout: load arch; one jeq per arch into its block; deny the rest; the blocks; deny
    head = 1 + len(arches) + 1
    starts, position = [], head
    for block in blocks:
        starts.append(position)
        position += len(block)
    deny_at = position
    program = [_instruction(_LD_W_ABS, _OFFSET_ARCH)]
    for index, (arch, _) in enumerate(arches):
        here = 1 + index
        program.append(_instruction(_JEQ_K, arch, jt=starts[index] - here - 1))
    program.append(_instruction(_RET_K, deny))
    for block, start in zip(blocks, starts, strict=True):
        for offset, (code, k, target) in enumerate(block):
            here = start + offset
            program.append(_instruction(code, k, jt=deny_at - here - 1 if target else 0))
    program.append(_instruction(_RET_K, deny))
    return b"".join(program)


@functools.cache
def program(machine: str | None = None) -> bytes:
    """The filter as bwrap's `--seccomp` reads it: struct sock_filter entries, native order."""
    return _assemble(machine or os.uname().machine)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


@functools.cache
def _loader() -> tuple[Any, _SockFprog, Any]:
    code = program()
    buffer = ctypes.create_string_buffer(code, len(code))
    fprog = _SockFprog(len(code) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return libc.prctl, fprog, buffer


@functools.cache
def exec_prefix() -> tuple[str, ...] | None:
    """argv prefix that loads the filter and execs the rest, or None where Perl is missing (then
    use `install` as a preexec_fn)."""
    machine = os.uname().machine
    if shutil.which(PERL) is None:
        return None
    script = _PERL_LOADER.format(nr=_PRCTL_NR[machine], op=_PR_SET_SECCOMP, mode=_SECCOMP_MODE_FILTER)
    return (PERL, "-e", script, program(machine).hex())


def prepare() -> None:
    """Check that this machine has a syscall table here (SeccompUnsupported) and build what
    loading the filter needs, before any fork."""
    program()
    if exec_prefix() is None:
        _loader()


def install() -> None:
    """Load the filter into this process (root, or after no_new_privs). Meant as a preexec_fn:
    `prepare()` first, in the parent."""
    prctl, fprog, _ = _loader()
    if prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "cannot install the sandbox's seccomp filter")
