"""Split memory-bound array work into chunks run on the CPU cores; on a GPU, one plain call.

Why: numpy runs a copy or a ufunc on one core while the BLAS uses all of them, so on the CPU
the copies and element-wise loops around the GEMMs (im2col, col2im, pooling, LRN, ReLU) ran
at one core's speed. numpy releases the GIL inside those loops, so threads that work on
different samples use every core. Chunks of about `CHUNK_ELEMENTS` elements also keep a
chunk's temporaries in the L2 cache while a layer makes several passes over them (a
9-offset max pooling over 1.8M cells: 11.8 ms in whole-array passes, 5.5 ms in 64K-cell
blocks, on one core of the reference machine).

The one entry point is `for_each_chunk(xp, count, body, ...)`: it calls `body(start, stop)`
over consecutive chunks covering range(count) and returns when all are done. With numpy the
chunks are run by a `ChunkRunner`'s threads (the calling thread is one of them); with any
other array module (CuPy) it calls `body(0, count)` once: the device parallelises each call
itself. So a layer writes its loop once, over a range of samples, and the same body runs on
both backends. A body may only write the part of the outputs that belongs to its range.

The default runner has as many threads as the first of OPENBLAS_NUM_THREADS or
OMP_NUM_THREADS says (the convention the BLAS follows; distributed runs with one rank per core
set them to 1), else one per CPU this process may run on.

Two limits, measured on the 2-core reference machine. (1) The GIL: a thread holds it between
numpy calls, so calls shorter than ~20 us (32K-element passes) do not overlap at all; only
long passes (copies of whole samples) scale, 1.6-2x. Bodies that loop over cache-sized blocks
therefore gain from the blocking, not from the threads. (2) OpenBLAS: after each GEMM its idle
threads busy-wait for ~0.1 s (2^28 cycles) on the other cores, so a chunk thread gets no core
and the split gains nothing (GoogleNet: 785 ms on one chunk thread, 796 on two).
OPENBLAS_THREAD_TIMEOUT=18 (2^18 cycles, ~0.1 ms), set before numpy is imported, parks them
in time: 661 ms. benchmarks/bench_engine.py sets it; so should a launcher.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

#: Elements per chunk: the operands of a few passes fit in a 1-2 MB L2 cache (measured:
#: 32K-128K-element blocks are 2x faster than whole-array passes; 256K is past the cache).
CHUNK_ELEMENTS = 1 << 16
#: Below this many elements in all, one thread does it (a thread hand-off costs ~20-50 us).
SERIAL_BELOW = 1 << 15

_in_chunk = threading.local()


class ChunkRunner:
    """Runs `body(start, stop)` over chunks of a range on `threads` threads (caller included).

    `chunk_elements` and `serial_below` size the chunks (see `for_each_chunk`); tests make
    them tiny to run the threaded path on small arrays.

    Chunks are handed out in order, one at a time, to whichever thread is free. An exception
    in any chunk stops the hand-out and is re-raised in the caller once every thread is done.
    A `run` from inside a chunk (on any thread) runs its chunks serially, as does a runner
    with one thread.
    """

    def __init__(self, threads: int, chunk_elements: int = CHUNK_ELEMENTS,
                 serial_below: int = SERIAL_BELOW):
        if int(threads) < 1 or int(chunk_elements) < 1:
            raise ValueError(f"ChunkRunner: threads and chunk_elements must be >= 1, got "
                             f"threads={threads}, chunk_elements={chunk_elements}")
        self.threads = int(threads)
        #: About how many elements a chunk (or a cache block inside one) should hold.
        self.chunk_elements = int(chunk_elements)
        #: Work of fewer elements than this runs on the calling thread alone.
        self.serial_below = int(serial_below)
        self._executor = None
        self._pid = None
        self._start_lock = threading.Lock()

    def _helpers(self) -> ThreadPoolExecutor:
        """The helper threads, started on first use, and again in a forked child (which
        inherits the executor but not its threads)."""
        with self._start_lock:
            if self._executor is None or self._pid != os.getpid():
                self._executor = ThreadPoolExecutor(self.threads - 1,
                                                    thread_name_prefix="mgcaffe-chunks")
                self._pid = os.getpid()
            return self._executor

    def run(self, count: int, body: Callable[[int, int], None], grain: int) -> None:
        """Call body over [0, grain), [grain, 2*grain), ... covering range(count)."""
        chunks = -(-count // grain) if count > 0 else 0
        if chunks <= 1 or self.threads == 1 or getattr(_in_chunk, "active", False):
            for start in range(0, count, grain):
                body(start, min(count, start + grain))
            return
        lock = threading.Lock()
        state = {"next": 0, "errors": []}

        def drain():
            _in_chunk.active = True
            try:
                while True:
                    with lock:
                        index = state["next"]
                        if index >= chunks or state["errors"]:
                            return
                        state["next"] = index + 1
                    start = index * grain
                    body(start, min(count, start + grain))
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller below
                with lock:
                    state["errors"].append(exc)
            finally:
                _in_chunk.active = False

        executor = self._helpers()
        helpers = [executor.submit(drain) for _ in range(min(self.threads, chunks) - 1)]
        drain()
        for helper in helpers:
            helper.result()
        if state["errors"]:
            raise state["errors"][0]


def default_threads() -> int:
    """Threads for the default runner: OPENBLAS_NUM_THREADS or OMP_NUM_THREADS, else CPUs."""
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


_default_runner: ChunkRunner | None = None


def default_runner() -> ChunkRunner:
    """The process-wide runner (created on first use), like the BLAS's own thread pool."""
    global _default_runner
    if _default_runner is None:
        _default_runner = ChunkRunner(default_threads())
    return _default_runner


def runner_or_default(runner: ChunkRunner | None) -> ChunkRunner:
    """`runner`, or the default one when None (what LayerContext.chunk_runner holds)."""
    return runner if runner is not None else default_runner()


def for_each_chunk(xp, count: int, body: Callable[[int, int], None], *,
                   item_elements: int = 1, cache_sized: bool = True,
                   runner: ChunkRunner | None = None) -> None:
    """Call `body(start, stop)` over chunks covering range(count); see the module docstring.

    `item_elements`: about how many array elements one item (a sample) touches. With
    `cache_sized`, chunks hold about `runner.chunk_elements` elements (at least one item; at
    least as many chunks as threads when there are enough items): for bodies that make
    several passes over their chunk. Without, one chunk per thread: for bodies that make one
    long pass each (copies), where a thread's GIL-free stretch should be as long as possible
    (calls shorter than ~20 us do not run in parallel: measured). `runner`: None for the
    default. numpy only; any other xp: `body(0, count)`.
    """
    if count <= 0:
        return
    runner = runner_or_default(runner)
    if xp is not np or count * item_elements < runner.serial_below:
        body(0, count)
        return
    per_thread = -(-count // runner.threads)
    grain = per_thread
    if cache_sized:
        grain = max(1, min(runner.chunk_elements // max(1, item_elements), per_thread))
    runner.run(count, body, grain)
