"""`stat_fields`: the fields after a command name that may hold spaces and parentheses; the CPU
seconds and RSS the benches read."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl360_ext.util.proc_stat import (
    PARENT,
    START_TIME,
    STATE,
    children_cpu_seconds,
    cpu_seconds,
    rss_mb,
    stat_fields,
)


def test_a_command_name_with_parentheses_and_spaces_does_not_shift_the_fields(tmp_path: Path) -> None:
    odd = tmp_path / "a) b ( c"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", odd)
    child = subprocess.Popen([str(odd), "30"])
    try:
        fields, own = stat_fields(child.pid), stat_fields(os.getpid())
        assert fields is not None and own is not None
        assert fields[STATE] in {"R", "S", "D"} and int(fields[PARENT]) == os.getpid()
        assert int(fields[START_TIME]) >= int(own[START_TIME])
    finally:
        child.kill()
        child.wait()


def test_a_process_that_is_gone_has_no_fields() -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    assert stat_fields(child.pid) is None


def test_cpu_seconds_and_rss_of_a_live_process_and_a_gone_one() -> None:
    assert cpu_seconds(os.getpid()) >= 0.0 and rss_mb(os.getpid()) > 0.0
    child = subprocess.Popen(["true"])
    child.wait()
    with pytest.raises(ProcessLookupError):
        cpu_seconds(child.pid)


def test_cpu_seconds_grow_with_work_and_reaped_children_count_apart() -> None:
    own, children = cpu_seconds(os.getpid()), children_cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    subprocess.run([sys.executable, "-c", "sum(range(3_000_000))"], check=True)  # a reaped child's work
    assert cpu_seconds(os.getpid()) - own >= 0.1
    assert children_cpu_seconds(os.getpid()) > children
