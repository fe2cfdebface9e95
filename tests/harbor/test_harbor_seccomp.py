"""The sandbox's seccomp program, run through a small classic-BPF interpreter: refused calls get
EPERM on every architecture the machine runs, everything else is allowed, foreign calling
conventions and x32 are refused."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.harbor.envs import seccomp

ALLOW, EPERM = 0x7FFF0000, 0x00050001
X86_64, I386, AARCH64, ARM = 0xC000003E, 0x40000003, 0xC00000B7, 0x40000028
REFUSED = {
    X86_64: {321, 298, 425, 426, 427},
    I386: {357, 336, 425, 426, 427},
    AARCH64: {280, 241, 425, 426, 427},
    ARM: {386, 364, 425, 426, 427},
}
MACHINE_ARCHES = {"x86_64": (X86_64, I386), "aarch64": (AARCH64, ARM)}


def run(program: bytes, nr: int, arch: int) -> int:
    """Evaluate a classic BPF seccomp program on (nr, arch): only the opcodes it may use."""
    data = struct.pack("=iI", nr, arch) + bytes(56)
    code = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    pc, accumulator = 0, 0
    for _ in range(len(code)):
        op, jt, jf, k = code[pc]
        if op == 0x20:
            accumulator = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif op in (0x15, 0x35):
            taken = accumulator == k if op == 0x15 else accumulator >= k
            pc += 1 + (jt if taken else jf)
        elif op == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected opcode {op:#x}")
    raise AssertionError("fell off the program")


@pytest.mark.parametrize("machine", sorted(MACHINE_ARCHES))
@settings(max_examples=400, deadline=None)
@given(nr=st.one_of(st.integers(0, 600), st.sampled_from(sorted(set().union(*REFUSED.values())))))
def test_refused_calls_get_eperm_and_the_rest_is_allowed(machine: str, nr: int) -> None:
    program = seccomp.program(machine)
    for arch in MACHINE_ARCHES[machine]:
        assert run(program, nr, arch) == (EPERM if nr in REFUSED[arch] else ALLOW), (arch, nr)


@given(nr=st.integers(0, 2**31 - 1), arch=st.integers(0, 2**32 - 1))
def test_foreign_conventions_and_x32_are_refused(nr: int, arch: int) -> None:
    program = seccomp.program("x86_64")
    if arch in (X86_64, I386):
        return
    assert run(program, nr, arch) == EPERM
    assert run(program, nr | 0x40000000, X86_64) == EPERM


def test_an_unknown_machine_is_refused_clearly() -> None:
    with pytest.raises(seccomp.SeccompUnsupported, match="riscv64"):
        seccomp.program("riscv64")
