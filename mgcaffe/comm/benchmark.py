"""All-reduce benchmark: time T_ar(M) over message sizes and fit T_ar(M) = a + b*M (Eq. 9).

Every rank runs the same sizes in the same order (a collective). For each size, after warm-up
calls, `iterations` all-reduces are timed back to back between barriers; the time of one call
is the mean over them, taken as the slowest rank's (what a synchronous step waits for). The
fit is the planner's least squares (`cost.fit_linear`), and `network_json` writes the result
in the planner's network format (`fits: {"<N>": {"a": .., "b": ..}}`), the data of the
paper's Figure 5(b).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import CommError
from .communicator import Communicator
from .cost import CostModel, fit_linear

__all__ = ["DEFAULT_SIZES", "AllreduceBenchmark", "default_sizes", "measure_allreduce"]


def default_sizes(smallest: int = 4, largest: int = 32 << 20, factor: int = 4) -> list[int]:
    """Message sizes in bytes, from a few bytes to tens of MB (multiples of 4: float32)."""
    sizes, m = [], smallest
    while m <= largest:
        sizes.append(m)
        m *= factor
    return sizes


DEFAULT_SIZES = default_sizes()


@dataclass
class AllreduceBenchmark:
    """Measured points (bytes, seconds per all-reduce) and their linear fit."""

    nodes: int
    sizes: list[int]
    times: list[float]
    fit: CostModel
    rms: float

    def network_json(self, source: str = "mgcaffe bench-comm") -> dict:
        """The planner's network description, with the raw points kept for plotting."""
        return {"source": source, "units": "seconds, seconds per byte",
                "fits": {str(self.nodes): {"a": self.fit.a, "b": self.fit.b,
                                           "rms_s": self.rms}},
                "measurements": {str(self.nodes): [[m, t] for m, t in
                                                   zip(self.sizes, self.times)]}}

    def table(self) -> str:
        lines = [f"{'bytes':>12} {'measured us':>12} {'fit us':>10}"]
        for m, t in zip(self.sizes, self.times):
            lines.append(f"{m:12d} {t * 1e6:12.2f} {self.fit.time(m) * 1e6:10.2f}")
        return "\n".join(lines)


def _iterations_for(nbytes: int, iterations: int) -> int:
    # Large messages take long and vary little: fewer repetitions (at least 3).
    return max(3, min(iterations, int(iterations * (1 << 20) / max(nbytes, 1 << 20))))


def measure_allreduce(comm: Communicator, sizes: Sequence[int] = DEFAULT_SIZES,
                      iterations: int = 20, warmup: int = 2) -> AllreduceBenchmark:
    """Time `comm.allreduce_sum` for every size (bytes) and fit a + b*M; a collective."""
    sizes = [int(s) for s in sizes]
    if len(set(sizes)) < 2:
        raise CommError(f"rank {comm.rank}: the all-reduce benchmark needs at least two "
                        f"distinct sizes, got {sizes}")
    if any(s < 4 or s % 4 for s in sizes):
        raise CommError(f"rank {comm.rank}: benchmark sizes must be positive multiples of 4 "
                        f"bytes (float32), got {sizes}")
    buf = np.zeros(max(sizes) // 4, dtype=np.float32)
    times = []
    for m in sizes:
        piece = buf[:m // 4]
        for _ in range(warmup):
            comm.allreduce_sum(piece)
        reps = _iterations_for(m, iterations)
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            comm.allreduce_sum(piece)
        mine = (time.perf_counter() - t0) / reps
        times.append(max(comm.allgather(mine)))
    fit, rms = fit_linear(sizes, times)
    return AllreduceBenchmark(comm.size, sizes, times,
                              CostModel(fit.a, fit.b, nodes=comm.size, origin="measured fit"),
                              rms)
