"""Ray for a benchmark: a local instance this process starts, and stops when the benchmark ends.

Owns the one way the benches that run Ray actors (`rl360 bench harbor`, `rl360 bench sessions
--hosting actor`) get Ray: no dashboard, actors' logs not copied to the driver's terminal (they
would tear the progress display and the table), at least `num_cpus` CPUs so every actor asked for
is placed. A Ray this process is already connected to is used as it is and left running.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def local_ray(num_cpus: int | None = None) -> Iterator[None]:
    """Connected to Ray inside; `num_cpus` Ray CPUs (default: this machine's cores)."""
    import ray

    if ray.is_initialized():
        yield
        return
    ray.init(
        address="local",
        num_cpus=num_cpus or os.cpu_count() or 1,
        include_dashboard=False,
        log_to_driver=False,
    )
    try:
        yield
    finally:
        ray.shutdown()
