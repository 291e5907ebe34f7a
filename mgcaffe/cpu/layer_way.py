"""Run each layer call on all of this process's threads or on one, whichever pays now.

Why: on a busy node a multi-threaded GEMM or chunk split waits at every synchronisation for
a scheduler slice on a core another process holds, and OpenBLAS's waiting threads spin,
burning the CPU time the work needed (LeNet b64 with a busy second core: 2 BLAS threads took
3-5x the wall time and 3x the CPU time of 1). On an idle node the threads pay for the large
layers. Which way wins depends on the layer's size and on the load, which changes; so each
layer call site (a layer's forward or backward) is timed both ways, as `parallel.ChunkRunner`
times its chunk call sites (the same trial and retry rule: `parallel.TRIALS`,
`RETRY_EVERY` and `RETRY_SOONEST`), and run the faster way.

"One thread" means the BLAS limited to one thread (through threadpoolctl's controllers, a
~5 us call) and the chunk runner running serially. The chunk runner's results do not depend
on the way (same chunk boundaries); a GEMM's last bits can (OpenBLAS's edge kernels cover
other elements when its output is split over threads). So a net times its calls only where
its `CpuEngine` is adaptive: when the user asked with `--threads adaptive` (and set no count
of their own); by default, for a count the user set and for library use, the net's LayerWay
has one thread (plain calls) and results repeat bit for bit.
Elsewhere, and for any array module other than numpy (a GPU), layers are called directly.

Each net has its own LayerWay (`cpu.engine.CpuEngine.layer_way`). The BLAS's thread count is
the process's: a call run on one BLAS thread restores the counts it found, so a net with
another thread setting in the same process finds its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from . import parallel

_local = threading.local()


class LayerWay:
    """Times layer call sites with `threads` threads and with one, and runs the faster way."""

    def __init__(self, threads: int, blas=None, clock: Callable[[], float] = time.perf_counter):
        self.threads = int(threads)
        #: threadpoolctl library controllers of the BLAS (None: looked up on first use).
        self._blas = blas
        self._clock = clock
        self._sites: dict = {}

    def _blas_controllers(self) -> list:
        if self._blas is None:
            self._blas = parallel.blas_controllers()
        return self._blas

    def _set_blas(self, threads: int) -> None:
        for lib in self._blas_controllers():
            lib.set_num_threads(threads)

    def call(self, key, fn: Callable, *args):
        """fn(*args), timed and run all-threaded or single-threaded by `key`'s record."""
        if self.threads <= 1 or getattr(_local, "active", False):
            return fn(*args)
        site = self._sites.get(key)
        if site is None:
            site = self._sites.setdefault(key, parallel.CallSite(len(self._sites) * 7))
        threaded = site.pick()
        _local.active = True
        found = None
        start = self._clock()
        try:
            if threaded:
                return fn(*args)
            found = [lib.num_threads for lib in self._blas_controllers()]
            self._set_blas(1)
            with parallel.serial_chunks():
                return fn(*args)
        finally:
            if found is not None:
                for lib, threads in zip(self._blas_controllers(), found):
                    lib.set_num_threads(threads)
            site.record(threaded, self._clock() - start)
            _local.active = False

    def way(self, key) -> bool | None:
        """True: `key` runs threaded now; False: on one thread; None: not settled yet."""
        site = self._sites.get(key)
        if site is None or not site.settled():
            return None
        return site.threaded_wins()


def call_layer(xp, way: LayerWay, key, fn: Callable, *args):
    """fn(*args) the faster way for `key` by the net's `way` on the CPU (numpy), its chunk
    runs timed as `key`'s own call sites (parallel.call_site); a plain call otherwise."""
    if xp is not np:
        return fn(*args)
    with parallel.call_site(key):
        return way.call(key, fn, *args)
