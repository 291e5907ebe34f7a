"""numba for the CPU code written as loops (kernels/loops/, the wire's casts in
comm/backends/wire_loops.py), in one place.

numba is optional at run time: `load` gives None where it cannot be imported, and the
callers keep their numpy paths; each module's `load()` is `loader(its compile_all)`. Each
module's `compile_all` runs once per process, whichever thread asks first (layer setups and
chunk-runner threads may ask at the same time; a second run would wrap its compiled helpers
again). `jit` compiles lazily, per argument types, without the GIL (the layers' chunk runner
calls the loops from several threads on disjoint data), into numba's on-disk cache where a
cache directory is writable and in memory in each process where none is.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

_lock = threading.Lock()
_done: dict = {}  # compile_all -> its result


def load(compile_all: Callable):
    """compile_all(numba), once per process, or None when numba cannot be imported."""
    try:
        import numba  # noqa: PLC0415 - optional at run time, and slow to import
    except ImportError:
        return None
    with _lock:
        if compile_all not in _done:
            with warnings.catch_warnings():
                # numba warns once when it cannot save to or read from a cache directory.
                warnings.simplefilter("ignore", numba.NumbaWarning)
                _done[compile_all] = compile_all(numba)
        return _done[compile_all]


def loader(compile_all: Callable, doc: str) -> Callable[[], Any]:
    """A module's `load()`: `load(compile_all)` on its first call, that result (the compiled
    functions, or None without numba) on every later one without taking the lock (the
    wire's casts ask once per message). Two threads may both make the first call:
    `load` compiles once."""
    result: list = []

    def load_once():
        if not result:
            result.append(load(compile_all))
        return result[0]

    load_once.__doc__ = doc
    return load_once


def jit(numba, fn: Callable, **options) -> Callable:
    """fn compiled on first call (nogil), cached on disk where numba can; `options` go to
    numba.njit (e.g. error_model="numpy": float division without a zero check, which
    otherwise keeps a loop that divides from being vectorised)."""
    try:
        return numba.njit(nogil=True, cache=True, **options)(fn)
    except RuntimeError:  # no writable cache directory: compile in each process
        return numba.njit(nogil=True, **options)(fn)
