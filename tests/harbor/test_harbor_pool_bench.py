"""`rl360 bench harbor`'s measuring helpers: CPU from /proc, a process tree's sandboxes and memory."""

from __future__ import annotations

import os
import subprocess
import time

from rl360_ext.local.bench import harbor as bench


def test_cpu_seconds_grow_with_work() -> None:
    own, children = bench._cpu_s(os.getpid())
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    own_after, children_after = bench._cpu_s(os.getpid())
    assert own_after - own >= 0.1 and children_after >= children


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
