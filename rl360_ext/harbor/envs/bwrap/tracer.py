"""The verifier's traced exit: `exec_and_end` runs its command under `_TRACER` (the host's python,
as the sandbox user), which stops the command as it begins to exit, prints its exit code after
`EXIT_TAG` and kills every process of the sandbox user; `reported_exit` reads that code back."""

from __future__ import annotations

from harbor.environments.base import ExecResult

_PYTHON = "/usr/bin/python3"  # the host's, which every sandbox sees (/usr is the image)
EXIT_TAG = "rl360-exit="  # a line `<tag><exit code>`: a command's exit code, told before its kill
# `exec_and_end`'s tracer, run in the sandbox as its user: runs argv[2:] traced with
# PTRACE_O_TRACEEXIT, so it stops as it begins to exit (before its descriptors close: nothing it
# left can have seen it go); prints `<tag><exit code>` and kills every process it may signal
# (never as uid 0: the sandbox's user is not root). Signals are delivered to it as usual.
_TRACER = r"""
import os, signal, sys
try:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
except Exception:  # no tracing here: run the command untraced (the host still kills after it)
    os.execv(sys.argv[2], sys.argv[2:])
def end(status):
    code = os.waitstatus_to_exitcode(status)
    print(f"{sys.argv[1]}{code if code >= 0 else 128 - code}", flush=True)
    if os.getuid() != 0:
        os.kill(-1, signal.SIGKILL)
    os._exit(0)
pid = os.fork()
if pid == 0:
    libc.ptrace(0, 0, None, None)  # PTRACE_TRACEME; untraced if refused: the tracer only ends later
    try:
        os.execv(sys.argv[2], sys.argv[2:])
    finally:
        os._exit(127)
_, status = os.waitpid(pid, 0)
if os.WIFSTOPPED(status):  # at its exec: PTRACE_O_TRACEEXIT | PTRACE_O_TRACEEXEC | PTRACE_O_EXITKILL
    libc.ptrace(0x4200, pid, None, ctypes.c_void_p(0x40 | 0x10 | 0x100000))
    libc.ptrace(7, pid, None, None)
info = ctypes.create_string_buffer(128)
message = ctypes.c_ulong()
while not os.WIFEXITED(status) and not os.WIFSIGNALED(status):
    _, status = os.waitpid(pid, 0)
    if os.WIFSTOPPED(status):
        event = status >> 16
        if event == 6:  # PTRACE_EVENT_EXIT: its exit status
            libc.ptrace(0x4201, pid, None, ctypes.byref(message))
            end(message.value)
        signalled = not event and libc.ptrace(0x4202, pid, None, info) == 0  # not an event, nor a group-stop
        libc.ptrace(7, pid, None, ctypes.c_void_p(os.WSTOPSIG(status) if signalled else 0))
end(status)
"""


def reported_exit(result: ExecResult) -> ExecResult:
    """`result` with the exit code its last `EXIT_TAG` line reports as its return code (what
    printed it may have gone with the kill it sent next), that line removed from stdout; as it
    is without such a line."""
    stdout = result.stdout or ""
    head, tag, code = stdout.rpartition(EXIT_TAG)
    if not tag or not code.rstrip("\n").isdigit() or (head and not head.endswith("\n")):
        return result
    return ExecResult(stdout=head, stderr=result.stderr, return_code=int(code))
