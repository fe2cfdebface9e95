"""A process's `/proc/<pid>/stat`, parsed once for every reader in the package.

The command name (field 2) may hold spaces and parentheses, so the fields are split after its last
`)`. In what `stat_fields` returns, `[0]` is the state (`Z`: a zombie), `[1]` the parent's pid,
`[11]`/`[12]` the process's user and system clock ticks, `[13]`/`[14]` those of its reaped
children, `[19]` its start time in clock ticks since boot (what tells a reused pid apart).
"""

from __future__ import annotations

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
