"""Independent GEMMs (one per sample, or per block of output rows) spread over the chunk
runner's threads, each GEMM on a single BLAS thread.

Why: a convolution's per-sample layouts make one GEMM call per sample (and group). With a
multi-threaded BLAS each call splits its work statically over the BLAS threads and waits for
the slowest; on a node where another process holds a core, every call then waits for a
scheduler slice. Handing whole GEMMs to the chunk runner's threads instead (one BLAS thread
each, chunks handed out to whichever thread is free) needs no synchronisation inside a GEMM,
and a thread that gets less CPU simply takes fewer samples. Measured on a 2-core machine with
one core busy elsewhere, forward of one layer, ms: GoogleNet inception_4a/1x1 at batch 8
116 -> 2.6, ResNet-50 res2a_branch2c at batch 4 28 -> 5.1, AlexNet conv1 71 -> 24.

Each sample's GEMM runs on one BLAS thread whichever runner thread takes it (and in the
runner's serial fallback), so the results do not depend on the load or the thread count.

The BLAS thread count is process-wide, so the split runs only on the main thread (where a
process's net runs): layers run on other threads (in-process ranks in tests, a user's worker
threads) make plain calls, and never see the count change under them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager

import numpy as np

from ..cpu.parallel import blas_controllers, runner_or_default


@contextmanager
def one_blas_thread():
    """Within this block the BLAS runs each call on the calling thread alone (restored after,
    to the count it had)."""
    libs = blas_controllers()
    before = [lib.get_num_threads() for lib in libs]
    for lib in libs:
        lib.set_num_threads(1)
    try:
        yield
    finally:
        for lib, count in zip(libs, before):
            lib.set_num_threads(count)


def for_each_gemm(xp, count: int, body: Callable[[int, int], None], runner=None,
                  grain: int = 1) -> None:
    """Call `body(start, stop)` over chunks of `grain` items covering range(count), where
    each chunk makes GEMM calls independent of the other chunks' (its own outputs).

    On numpy, called from the main thread, with more than one chunk: the chunks run on the
    runner (spread over its threads, or one after another on a one-thread runner: the same
    chunks either way, since a GEMM's last bits can depend on its shape), each BLAS call on
    one thread. Otherwise (one chunk, another thread, CuPy) `body(0, count)`.
    """
    if count <= 0:
        return
    runner = runner_or_default(runner)
    grain = max(1, int(grain))
    if xp is not np or count <= grain or \
            threading.current_thread() is not threading.main_thread():
        body(0, count)
        return
    with one_blas_thread():
        runner.run(count, body, grain)
