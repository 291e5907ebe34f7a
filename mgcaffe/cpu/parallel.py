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

Each net has its own runner (`cpu.engine.CpuEngine`, passed to its layers' contexts), with as
many threads as the command's `--threads` choice or, for library use, `cores.choose` gives (the
user's OPENBLAS/MKL/OMP_NUM_THREADS, else the usable cores, after affinity and cgroup quota,
divided by the ranks on this node). There is no process-wide runner: a call given none runs on
the calling thread alone.

Fall back to one thread when it does not pay. A hand-off to helper threads pays on an idle
machine for long passes, but on a busy one each helper may wait a scheduler slice for a core
while the caller waits for the helper. So a runner times each call site (the body's code and
the sizes): its first call is not timed (it pays the one-time costs: buffers allocated and
first touched, compiled loops loaded, helper threads started; timed, they made the threads
lose their first trial by 30x on GoogleNet's first pooling and settle on one thread). Its next
calls alternate between the threads and the calling thread alone; then
it runs the threads only where they took at most `THREADED_MARGIN` of the serial time (the
trials end after one call each way when one took `DECISIVE` times the other), and
tries the other way again now and then so that it follows the load as it changes: every
`RETRY_EVERY` calls where one way won by `DECISIVE` or more, sooner where they were close
(down to every `RETRY_SOONEST` calls), since a retry then costs little and a trial that a
moment of noise decided is corrected soon. Both ways run the same chunks with the same
boundaries, so the results are identical; only who runs them differs.

A call site is the body's code and sizes within the layer call that runs it (`call_site`,
which the net sets around each layer's forward and backward), so that layers whose work
looks alike to the runner keep separate records: every convolution on the per-sample
columns hands out the same code over the same 16 chunks.

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
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np
from threadpoolctl import ThreadpoolController

from . import cores

#: Elements per chunk: the operands of a few passes fit in a 1-2 MB L2 cache (measured:
#: 32K-128K-element blocks are 2x faster than whole-array passes; 256K is past the cache).
CHUNK_ELEMENTS = 1 << 16
#: Below this many elements in all, one thread does it (a thread hand-off costs ~20-50 us).
SERIAL_BELOW = 1 << 15

#: Calls per way (threaded, serial) timed before a call site settles on the faster one.
TRIALS = 2
#: Calls of a new call site run (threaded) without being timed, before the trials.
WARMUP = 1
#: Calls of a new call site until its trials are over (at most: they may end earlier).
CALLS_TO_SETTLE = WARMUP + 2 * TRIALS
#: ... unless the first call of each way already differs this much (either way): a trial of
#: the slow way costs a whole call (LeNet in `mgcaffe time --threads adaptive` on a busy
#: machine: the second threaded trial pass took 111 ms against 27 ms settled).
DECISIVE = 2.0
#: A settled call site times the other way again once in this many calls ...
RETRY_EVERY = 32
#: ... or as often as this where the two ways' estimates are close: the interval grows with
#: the gap, so a retry's expected cost stays about 1/RETRY_EVERY of a call. On a node whose
#: second core comes and goes, ResNet-50's layers settled on one thread after two disturbed
#: threaded trials (res3c_branch2b backward: 10.5 ms threaded, 10.6 serial, where the
#: threads take about 6) and kept it for 32 calls.
RETRY_SOONEST = 4
#: Weight of the newest timing in a way's running estimate.
SMOOTHING = 0.3
#: The threads must be this much faster to be used: they take more CPU time (a second core
#: that other work could use) and their time varies more with the load.
THREADED_MARGIN = 0.9

_in_chunk = threading.local()
_site = threading.local()


def site_scope():
    """The layer call whose chunk runs are being timed on this thread (None outside one)."""
    return getattr(_site, "key", None)


@contextmanager
def _thread_setting(local: threading.local, name: str, value):
    """Within this block, `local.name` is `value` on this thread (restored after)."""
    before = getattr(local, name, None)
    setattr(local, name, value)
    try:
        yield
    finally:
        setattr(local, name, before)


def call_site(key):
    """Within this block, this thread's chunk runs are timed as call sites of `key` (a
    layer's forward or backward): two layers whose bodies share code and sizes keep
    separate records."""
    return _thread_setting(_site, "key", key)


class CallSite:
    """Running time estimates of one call site's two ways, threaded (True) and serial
    (False), and which to run next: the trial and retry rule above. A caller choosing
    between two other ways passes True for the one that must win by THREADED_MARGIN."""

    __slots__ = ("estimate", "trials", "calls", "warmups")

    def __init__(self, offset: int = 0):
        self.estimate = {True: None, False: None}
        self.trials = {True: 0, False: 0}
        self.warmups = 0
        # Sites created together retry in different calls, not all in the same iteration.
        self.calls = offset % RETRY_EVERY

    def pick(self) -> bool:
        """True: run this call on the threads."""
        self.calls += 1
        if self.warmups < WARMUP:
            return True
        if min(self.trials.values()) < TRIALS:
            # Trials alternate, threaded first (it starts the helpers once).
            return self.trials[True] <= self.trials[False]
        best = self.threaded_wins()
        return (not best) if self.calls % self.retry_every() == 0 else best

    def retry_every(self) -> int:
        """Calls between retries of the losing way: RETRY_SOONEST where the estimates (the
        threads' against THREADED_MARGIN times the serial) are close, up to RETRY_EVERY
        where they are DECISIVE apart or more."""
        threaded, serial = self.estimate[True], THREADED_MARGIN * self.estimate[False]
        fast, slow = min(threaded, serial), max(threaded, serial)
        if fast <= 0:
            return RETRY_EVERY
        interval = round(RETRY_EVERY * (slow / fast - 1) / (DECISIVE - 1))
        return max(RETRY_SOONEST, min(RETRY_EVERY, interval))

    def settled(self) -> bool:
        """Whether the trials are over (every way timed TRIALS times, or decided early)."""
        return min(self.trials.values()) >= TRIALS

    def threaded_wins(self) -> bool:
        return self.estimate[True] <= THREADED_MARGIN * self.estimate[False]

    def record(self, threaded: bool, seconds: float) -> None:
        if self.warmups < WARMUP:  # start-up costs, not this way's speed
            self.warmups += 1
            return
        old = self.estimate[threaded]
        if self.trials[threaded] < TRIALS:  # trials: keep the best (the least disturbed)
            self.estimate[threaded] = seconds if old is None else min(old, seconds)
        else:
            self.estimate[threaded] = (1 - SMOOTHING) * old + SMOOTHING * seconds
        self.trials[threaded] += 1
        if self.trials == {True: 1, False: 1}:
            fast, slow = sorted(self.estimate.values())
            if slow >= DECISIVE * fast:  # no second trial of a way that lost by that much
                self.trials = {True: TRIALS, False: TRIALS}


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
                 serial_below: int = SERIAL_BELOW, adaptive: bool = True,
                 clock: Callable[[], float] = time.perf_counter):
        if int(threads) < 1 or int(chunk_elements) < 1:
            raise ValueError(f"ChunkRunner: threads and chunk_elements must be >= 1, got "
                             f"threads={threads}, chunk_elements={chunk_elements}")
        self.threads = int(threads)
        #: About how many elements a chunk (or a cache block inside one) should hold.
        self.chunk_elements = int(chunk_elements)
        #: Work of fewer elements than this runs on the calling thread alone.
        self.serial_below = int(serial_below)
        #: Time each call site both ways and run it the faster way (see the module docstring).
        self.adaptive = bool(adaptive)
        self._clock = clock
        self._sites: dict = {}
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
        if chunks <= 1 or self.threads == 1 or getattr(_in_chunk, "active", False) or \
                getattr(_in_chunk, "serial", False):
            self._serial(count, body, grain)
            return
        if not self.adaptive:
            self._threaded(count, body, grain, chunks)
            return
        key = (site_scope(), getattr(body, "__code__", type(body)), count, grain)
        site = self._sites.get(key)
        if site is None:
            site = self._sites.setdefault(key, CallSite(len(self._sites) * 7))
        threaded = site.pick()
        start = self._clock()
        if threaded:
            self._threaded(count, body, grain, chunks)
        else:
            self._serial(count, body, grain)
        site.record(threaded, self._clock() - start)

    def way(self, body: Callable, count: int, grain: int, scope=None) -> bool | None:
        """How a call site (of the layer call `scope`, see `call_site`) runs now (True:
        threaded, False: serial; None: not settled)."""
        site = self._sites.get((scope, getattr(body, "__code__", type(body)), count, grain))
        if site is None or not site.settled():
            return None
        return site.threaded_wins()

    @staticmethod
    def _serial(count: int, body: Callable[[int, int], None], grain: int) -> None:
        for start in range(0, count, grain):
            body(start, min(count, start + grain))

    def _threaded(self, count: int, body: Callable[[int, int], None], grain: int,
                  chunks: int) -> None:
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


def serial_chunks():
    """Within this block, chunk runs on this thread run serially (`layer_way`'s one way)."""
    return _thread_setting(_in_chunk, "serial", True)


#: What a call given no runner runs on: the calling thread alone. One thread never times
#: call sites or starts helpers, so sharing it shares no state.
SERIAL = ChunkRunner(1)


def default_threads() -> int:
    """Threads of a library-default net's runner: what `cores.choose()` says for this
    process (the user's variables, else usable cores / ranks on this node)."""
    return cores.choose().threads


def runner_or_default(runner: ChunkRunner | None) -> ChunkRunner:
    """`runner`, or `SERIAL` when None (a layer context or kernel call without a runner:
    nets always pass their own)."""
    return runner if runner is not None else SERIAL


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
    calling thread alone. numpy only; any other xp: `body(0, count)`.
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


_blas_libraries: list | None = None


def blas_controllers() -> list:
    """threadpoolctl's controllers of the BLAS libraries loaded when first asked (numpy's
    among them: numpy loads it on import). One list for every
    caller, so the counts `sample_gemm.one_blas_thread` and `layer_way` set are the ones
    `blas_threads` reads, whatever library (scipy's, say) loads later."""
    global _blas_libraries
    if _blas_libraries is None:
        _blas_libraries = list(ThreadpoolController().select(user_api="blas")
                               .lib_controllers)
    return _blas_libraries


def blas_threads() -> int:
    """How many threads numpy's BLAS runs on now (threadpoolctl asks the library itself, a
    ~1.5 us call, so it follows `layer_way`'s one-thread calls); 1 when it cannot tell.
    Layers use it to take paths that pay only on one BLAS thread (many small GEMMs, each a
    synchronisation of the BLAS's threads)."""
    return max((lib.num_threads or 1 for lib in blas_controllers()), default=1)
