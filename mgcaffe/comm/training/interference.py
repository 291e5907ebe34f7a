"""How much computation slows while an all-reduce is in flight: the cost model's rho(M).

On CPUs the TCP stack, MPI's copies and its progress polling run on the cores that compute
backward; on GPUs NCCL's kernels take SMs. The planner's extended model (docs/planner.md)
lets backward run at 1/(1 + rho(M)) of its speed while a message of M bytes is being
all-reduced. `measure_interference` (a collective) measures rho for a few sizes: the time of
a fixed unit of BLAS work (the GEMMs backward is made of), alone and while a thread of this
rank all-reduces M bytes back to back, the way the communication thread does during
training. Each rank measures its own slowdown; the largest is kept, as a synchronous step
waits for the slowest rank.

The same probe also times the other direction, sigma(M): how much longer than T(M) the
thread's all-reduces take while the GEMMs run (`measure_slowdowns`). Where communication
needs the cores that compute (TCP on a host's few cores), it is what makes overlapped
messages slower than the benchmark's, and a start-up plan without it predicts too little;
the re-plan window measures both again in situ, on backward itself.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence

import numpy as np

from ...errors import CommError
from ..backends.communicator import Communicator
from ..model.cost import CostModel
from .insitu import MAX_X

__all__ = ["interference_sizes", "measure_interference", "measure_slowdowns"]

MAX_SIGMA = 1 / (1 - MAX_X)  # the in-situ estimate's cap: a message at most 20x slower
UNITS_PER_PHASE = 8  # at least this many units of work in each timed phase


def interference_sizes(total_bytes: int) -> list[int]:
    """64 KB, 1 MB and the whole gradient (at most 16 MB): where small, medium and merged
    messages fall; fewer when the gradient is smaller."""
    largest = max(4, min(int(total_bytes), 16 << 20) // 4 * 4)
    return sorted({m for m in (64 << 10, 1 << 20) if m < largest} | {largest})


class _Work:
    """A fixed unit of float32 GEMM work, timed by repetition: on the host (numpy), or on
    the GPU (`xp` CuPy: a larger GEMM, waited for, so the time is the device's)."""

    def __init__(self, n: int | None = None, xp=np):
        n = n or (192 if xp is np else 2048)
        self.n = n
        rng = np.random.default_rng(0)
        self.xp = xp
        self.a = xp.asarray(rng.standard_normal((n, n), dtype=np.float32))
        self.b = xp.asarray(rng.standard_normal((n, n), dtype=np.float32))
        self.c = xp.empty((n, n), dtype=np.float32)
        self._wait = None if xp is np else xp.cuda.get_current_stream().synchronize

    def unit(self) -> None:
        self.xp.matmul(self.a, self.b, out=self.c)
        if self._wait is not None:
            self._wait()

    @classmethod
    def fine_grained(cls, duration: float, xp=np, smallest: int = 64) -> _Work:
        """The default unit, halved until one unit takes at most 1/UNITS_PER_PHASE of
        `duration`: a phase must count many units, or the probe measures how the last unit
        was cut off rather than a rate (a slow device: a GEMM of 2048 can take longer than
        the whole phase)."""
        work = cls(xp=xp)
        while work.n > smallest:
            work.unit()  # warm: the first call may set up the library
            if min(_timed(work.unit) for _ in range(2)) <= duration / UNITS_PER_PHASE:
                break
            work = cls(max(smallest, work.n // 2), xp)
        return work

    def seconds_per_unit(self, duration: float) -> float:
        self.unit()
        count, t0 = 0, time.perf_counter()
        deadline = t0 + duration
        while True:
            self.unit()
            count += 1
            now = time.perf_counter()
            if now >= deadline:
                return (now - t0) / count


def _timed(call) -> float:
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def measure_interference(comm: Communicator, cost: CostModel, sizes: Sequence[int],
                         duration: float = 0.06, rounds: int = 3, timeout: float = 60.0,
                         xp=np) -> list[tuple[int, float]]:
    """[(bytes, rho)] for each size: the slowdown of BLAS work while this rank's thread
    all-reduces that many bytes back to back, the median of `rounds` interleaved (alone,
    during) pairs, then the slowest rank's; a collective. With `xp` CuPy, the work is a GEMM
    on the GPU and the buffer device memory (what NCCL slows)."""
    return [(m, rho) for m, rho, _ in measure_slowdowns(comm, cost, sizes, duration, rounds,
                                                         timeout, xp)]


def measure_slowdowns(comm: Communicator, cost: CostModel, sizes: Sequence[int],
                      duration: float = 0.06, rounds: int = 3, timeout: float = 60.0,
                      xp=np) -> list[tuple[int, float, float]]:
    """[(bytes, rho, sigma)] for each size: rho as `measure_interference` says, and sigma
    (at least 1, at most MAX_SIGMA), the thread's all-reduce time while the work runs over
    `cost`'s T(M), the median of the rounds; each the slowest rank's. A collective."""
    work = _Work.fine_grained(duration / 2, xp)  # the shorter phase: alone, duration / 2
    points = []
    for m in sizes:
        m = int(m)
        buf = xp.zeros(max(1, m // 4), dtype=np.float32)
        comm.allreduce_sum(buf)  # warm: connections and buffers of this size
        modelled = max(cost.link_time(m), 1e-6)
        calls = _calls(duration, modelled)
        rhos, sigmas = [], []
        for round_ in range(rounds):
            comm.barrier()
            alone = work.seconds_per_unit(duration / 2)
            comm.barrier()
            per_unit, reducing = _during(comm, work, buf, calls, timeout)
            rhos.append(per_unit / alone - 1.0)
            sigmas.append(reducing / (calls * modelled))
            if round_ + 1 < rounds:
                # the next round's all-reduces last about `duration` even where they run many
                # times slower than T (every rank the same count: the slowest rank's sigma)
                calls = _calls(duration, modelled * max(1.0, max(comm.allgather(sigmas[-1]))))
        rho = max(0.0, float(np.median(rhos)))
        sigma = min(MAX_SIGMA, max(1.0, float(np.median(sigmas))))
        slowest = comm.allgather((rho, sigma))
        points.append((m, max(r for r, _ in slowest), max(s for _, s in slowest)))
    return points


def _calls(duration: float, seconds_each: float) -> int:
    """How many all-reduces of `seconds_each` fill `duration` (at least 2, at most 1000)."""
    return int(min(1000, max(2, math.ceil(duration / seconds_each))))


def _during(comm: Communicator, work: _Work, buf, calls: int,
            timeout: float) -> tuple[float, float]:
    """(seconds per unit of work, seconds of the all-reduces) while a thread all-reduces
    `buf` `calls` times."""
    failure: list[BaseException] = []
    reduced: list[float] = []

    def reduce_back_to_back():
        try:
            t0 = time.perf_counter()
            for _ in range(calls):
                comm.allreduce_sum(buf)
            reduced.append(time.perf_counter() - t0)
        except BaseException as exc:  # handed to the main thread, which raises it
            failure.append(exc)

    thread = threading.Thread(target=reduce_back_to_back, name="interference-probe",
                              daemon=True)
    count, t0 = 0, time.perf_counter()
    deadline = t0 + timeout
    thread.start()
    while thread.is_alive() and time.perf_counter() < deadline:
        work.unit()
        count += 1
    elapsed = time.perf_counter() - t0
    thread.join(max(0.0, deadline - time.perf_counter()))
    if thread.is_alive():
        raise CommError(f"rank {comm.rank}: the interference probe's {calls} all-reduces of "
                        f"{buf.nbytes} bytes did not finish within {timeout:.0f} s")
    if failure:
        raise failure[0]
    if count == 0:  # the all-reduces ended before one unit: nothing to compare
        work.unit()
        return time.perf_counter() - t0, reduced[0]
    return elapsed / count, reduced[0]
