"""Keep numpy's BLAS single-threaded in the tiny engine.

The tiny model's matrices are small; a multi-threaded OpenBLAS spends more time waking and
spinning threads than computing, and on a shared 2-core machine it collapses (40x slower
attention measured under load). Owns one process-wide setting: the OpenBLAS thread count of the
numpy already loaded in this process (found through /proc/self/maps; a no-op elsewhere).
It does not change anything else about numpy.
"""

from __future__ import annotations

import contextlib
import ctypes
from pathlib import Path

_SETTERS = (
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "openblas_set_num_threads",
)


def _loaded_openblas() -> list[str]:
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return []
    with contextlib.suppress(OSError):
        paths = {line.split()[-1] for line in maps.read_text().splitlines() if "openblas" in line.lower()}
        return sorted(p for p in paths if p.startswith("/"))
    return []


def limit_blas_threads(threads: int = 1) -> bool:
    """Set OpenBLAS's thread count for this process; True if a loaded OpenBLAS accepted it."""
    import numpy  # noqa: F401  (make sure the BLAS numpy uses is loaded)

    done = False
    for path in _loaded_openblas():
        with contextlib.suppress(OSError):
            library = ctypes.CDLL(path)
            for name in _SETTERS:
                setter = getattr(library, name, None)
                if setter is not None:
                    setter(ctypes.c_int(threads))
                    done = True
                    break
    return done
