"""A process's `/proc/<pid>/stat`, parsed once for every reader in the package.

The command name (field 2) may hold spaces and parentheses, so the fields are split after its last
`)`. In what `stat_fields` returns, `[0]` is the state (`Z`: a zombie), `[1]` the parent's pid,
`[11]`/`[12]` the process's user and system clock ticks, `[13]`/`[14]` those of its reaped
children, `[19]` its start time in clock ticks since boot (what tells a reused pid apart).
`cpu_seconds`, `children_cpu_seconds` and `rss_mb` are what the benches measure a server process by.
"""

from __future__ import annotations

import os
from pathlib import Path

STATE, PARENT, START_TIME = 0, 1, 19
USER_TICKS, SYSTEM_TICKS, CHILDREN_USER_TICKS, CHILDREN_SYSTEM_TICKS = 11, 12, 13, 14


def stat_fields(pid: int | str) -> list[str] | None:
    """The fields after the command name, or None when the process is gone or unreadable."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _seconds(pid: int, user: int, system: int) -> float:
    fields = stat_fields(pid)
    if fields is None:
        raise ProcessLookupError(f"process {pid} is gone")
    return (int(fields[user]) + int(fields[system])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """The process's own user + system CPU seconds; ProcessLookupError when it is gone."""
    return _seconds(pid, USER_TICKS, SYSTEM_TICKS)


def children_cpu_seconds(pid: int) -> float:
    """The user + system CPU seconds of the process's reaped children; ProcessLookupError when it is gone."""
    return _seconds(pid, CHILDREN_USER_TICKS, CHILDREN_SYSTEM_TICKS)


def rss_mb(pid: int) -> float:
    """The process's resident set (`VmRSS` of `/proc/<pid>/status`) in MiB; 0 when it reports none."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0
