"""Keep numpy's BLAS single-threaded in the tiny engine.

The tiny model's matrices are small; a multi-threaded OpenBLAS spends more time waking and
spinning threads than computing, and on a shared 2-core machine it collapses (40x slower
attention measured under load). Owns the OpenBLAS thread count of the numpy already loaded in
this process (found through /proc/self/maps; a no-op elsewhere): `limit_blas_threads` sets it for
the process (the engine, which owns its process), `single_blas_thread` for the duration of a
`with` block (the reference trainer, a guest in its caller's process: the first block to enter
saves the count, the last to leave restores it, so overlapping blocks in several threads stay
single-threaded together). It does not change anything else about numpy.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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


def _controls() -> list[tuple[Callable[[int], None], Callable[[], int]]]:
    """(set, get) of the thread count of every loaded OpenBLAS that has both."""
    import numpy  # noqa: F401  (make sure the BLAS numpy uses is loaded)

    controls = []
    for path in _loaded_openblas():
        with contextlib.suppress(OSError):
            library = ctypes.CDLL(path)
            for name in _SETTERS:
                setter = getattr(library, name, None)
                getter = getattr(library, name.replace("_set_", "_get_"), None)
                if setter is not None and getter is not None:
                    getter.restype = ctypes.c_int

                    def put(threads: int, setter: Any = setter) -> None:
                        setter(ctypes.c_int(threads))

                    controls.append((put, getter))
                    break
    return controls


def limit_blas_threads(threads: int = 1) -> bool:
    """Set OpenBLAS's thread count for this process; True if a loaded OpenBLAS accepted it."""
    controls = _controls()
    for put, _ in controls:
        put(threads)
    return bool(controls)


def blas_threads() -> list[int]:
    """The thread count of every loaded OpenBLAS (empty when none is found)."""
    return [int(get()) for _, get in _controls()]


_scope_lock = threading.Lock()
_scope_depth = 0
_scope_saved: list[tuple[Callable[[int], None], int]] = []


@contextlib.contextmanager
def single_blas_thread() -> Iterator[None]:
    """OpenBLAS single-threaded inside the block, the previous count restored when the last
    overlapping block leaves."""
    global _scope_depth
    with _scope_lock:
        if _scope_depth == 0:
            controls = _controls()
            _scope_saved[:] = [(put, int(get())) for put, get in controls]
            for put, _ in controls:
                put(1)
        _scope_depth += 1
    try:
        yield
    finally:
        with _scope_lock:
            _scope_depth -= 1
            if _scope_depth == 0:
                for put, threads in _scope_saved:
                    put(threads)
                _scope_saved.clear()
