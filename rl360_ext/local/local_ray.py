"""Ray for a benchmark: a local instance this process starts, and stops when the benchmark ends.

Owns the one way the benches that run Ray actors (`rl360 bench harbor`, `rl360 bench sessions
--hosting actor`) get Ray: no dashboard, actors' logs not copied to the driver's terminal (they
would tear the progress display and the table), at least `num_cpus` CPUs so every actor asked for
is placed. A Ray this process is already connected to is used as it is and left running.

Also owns starting a local Ray at all (`init_local_ray`, the local stack's too): Ray waits a fixed
30 s for a new node's raylet to register and then raises; where several local clusters start at
once on two cores (the test suite's workers) that can pass, so that one failure is retried on a
fresh start, at most `START_ATTEMPTS` times.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

START_ATTEMPTS = 3
_NODE_START_TIMEOUT = "timed out during startup"  # ray._private.node.Node's message

logger = logging.getLogger(__name__)


def init_local_ray(**init_kwargs: Any) -> Any:
    """`ray.init(address="local", **init_kwargs)`, started again when the node timed out during
    startup; returns Ray's context. Any other error is raised at once."""
    import ray

    attempt = 1
    while True:
        try:
            return ray.init(address="local", **init_kwargs)
        except Exception as error:
            if attempt >= START_ATTEMPTS or _NODE_START_TIMEOUT not in str(error):
                raise
            logger.warning(
                "local Ray did not start (%s); starting it again (%d of %d)",
                error,
                attempt + 1,
                START_ATTEMPTS,
            )
            ray.shutdown()
            attempt += 1


@contextlib.contextmanager
def local_ray(num_cpus: int | None = None) -> Iterator[None]:
    """Connected to Ray inside; `num_cpus` Ray CPUs (default: this machine's cores)."""
    import ray

    if ray.is_initialized():
        yield
        return
    init_local_ray(
        num_cpus=num_cpus or os.cpu_count() or 1,
        include_dashboard=False,
        log_to_driver=False,
    )
    try:
        yield
    finally:
        ray.shutdown()
