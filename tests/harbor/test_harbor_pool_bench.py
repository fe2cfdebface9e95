"""`rl360 bench harbor`'s measuring helpers: a process tree's sandboxes and memory,
the floors' commands and ratios, and adopting what a bare bwrap leaves unreaped."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl360_ext.local.bench import harbor as bench


def test_a_tree_without_bubblewrap_has_no_sandboxes_but_its_memory_counts() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        deadline = time.monotonic() + 5
        while bench.sandbox_sample(os.getpid())[1] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        live, mb = bench.sandbox_sample(os.getpid())
        assert live == 0 and mb > 0
    finally:
        child.kill()
        child.wait()


def test_memory_per_live_sandbox_is_the_median_over_samples_with_sandboxes() -> None:
    sampler = bench.Sampler(os.getpid())
    sampler.samples = [(0, 5.0), (2, 2.0), (4, 2.0), (1, 3.0)]
    assert sampler.per_sandbox_mb() == 1.0 and sampler.peak() == 4
    sampler.samples = [(0, 5.0)]
    assert sampler.per_sandbox_mb() is None and sampler.peak() == 0


def test_rebase_moves_sandbox_paths_under_a_root_and_nothing_else() -> None:
    text = 'python3 /app/f.py > /logs/verifier/r.txt; cat /tests/x /usr/app/y ./app/z "/solution/s"'
    assert bench.rebase(text, Path("/r")) == (
        'python3 /r/app/f.py > /r/logs/verifier/r.txt; cat /r/tests/x /usr/app/y ./app/z "/r/solution/s"'
    )


def test_the_bare_bwrap_floor_unshares_everything_and_binds_only_the_attempt() -> None:
    argv = bench.bare_bwrap_argv(Path("/r"), "bash /tests/test.sh")
    assert argv[:3] == ["bwrap", "--unshare-all", "--die-with-parent"]
    binds = [(argv[i + 1], argv[i + 2]) for i, value in enumerate(argv) if value == "--bind"]
    assert binds == [(f"/r{target}", target) for target in bench.SANDBOX_DIRS]
    assert argv[argv.index("--") + 1 :] == ["/bin/bash", "-c", "bash /tests/test.sh"]
    assert bench.bare_bwrap_argv(Path("/r"), None)[-1] == "/bin/true"
    assert "--seccomp" not in argv and "--uid" not in argv  # the floor: none of rl360's setup


def test_the_overhead_ratio_is_rl360s_setup_over_the_bare_floors_at_the_same_concurrency() -> None:
    floors = [
        {"kind": "rl360 sandbox", "max_concurrent": 8, "setup_teardown_p50_s": 0.09},
        {"kind": "bare bwrap", "max_concurrent": 8, "setup_teardown_p50_s": 0.03},
        {"kind": "host", "max_concurrent": 8, "setup_teardown_p50_s": None},
        {"kind": "bare bwrap", "max_concurrent": 16, "setup_teardown_p50_s": 0.06},
    ]
    assert bench.overhead_ratio(floors, 8) == pytest.approx(3.0)
    assert bench.overhead_ratio(floors, 16) is None  # no rl360 floor at 16
    assert bench.overhead_ratio(floors, 16, 0.3) == pytest.approx(5.0)
    assert bench.overhead_ratio(floors, 4) is None


def test_setup_share_is_setup_over_the_time_attempts_held_their_slots() -> None:
    timings = [
        {"environment_setup": 1.0, "total": 5.0, "queue": 1.0},
        {"environment_setup": 1.0, "total": 4.0, "queue": None},
    ]
    assert bench.setup_share(timings) == pytest.approx(0.25)
    assert bench.setup_share([]) is None


def test_an_orphan_adopted_while_measuring_is_reaped_and_its_cpu_counted() -> None:
    with bench.adopting_orphans():
        before = os.times()
        busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass"
        # the child exits at once; its own child (the busy grandchild) is orphaned, then adopted here
        subprocess.run(
            [
                sys.executable,
                "-c",
                f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {busy!r}])",
            ]
        )
    after = os.times()
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)
    assert after.children_user + after.children_system - before.children_user - before.children_system >= 0.1
