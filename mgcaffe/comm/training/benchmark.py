"""All-reduce benchmark: time T_ar(M) over message sizes and fit T_ar(M) = a + b*M (Eq. 9).

Every rank runs the same sizes in the same order (a collective). For each size, after warm-up
calls, `iterations` all-reduces are timed one by one, back to back after a barrier; each call's
time is the slowest rank's (what a synchronous step waits for), and a size's time is the
median over its calls, with the 10th-90th percentile range as its spread. The fit minimises
the relative error (`cost.fit_relative`): a plain least-squares fit is dominated by the large
messages and can miss a 5 us small message by 100 us, which is what decides merging. The fit's
worst relative error is reported beside a and b, and `poor` says when it exceeds
POOR_FIT_ERROR (a straight line a + b*M does not describe this network: e.g. a protocol
switch between eager and rendezvous sends). `network_json` writes the planner's network format
(`fits: {"<N>": {"a": .., "b": ..}}`), the data of the paper's Figure 5(b).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...errors import CommError
from ..backends.communicator import Communicator
from ..model.cost import CostModel, fit_relative

__all__ = ["DEFAULT_SIZES", "POOR_FIT_ERROR", "AllreduceBenchmark", "default_sizes",
           "measure_allreduce"]


def default_sizes(smallest: int = 4, largest: int = 32 << 20, factor: int = 4) -> list[int]:
    """Message sizes in bytes, from a few bytes to tens of MB (multiples of 4: float32)."""
    sizes, m = [], smallest
    while m <= largest:
        sizes.append(m)
        m *= factor
    return sizes


DEFAULT_SIZES = default_sizes()
POOR_FIT_ERROR = 0.25  # worst relative error of the fit above which it is called poor


@dataclass
class AllreduceBenchmark:
    """Measured points (bytes, seconds per all-reduce) and their linear fit."""

    nodes: int
    sizes: list[int]
    times: list[float]
    fit: CostModel
    rms: float
    spreads: list[tuple[float, float]] | None = None  # per size, 10th and 90th percentile
    worst_error: float = 0.0  # max over sizes of |fit - measured| / measured

    @property
    def poor(self) -> bool:
        """Whether the line a + b*M misses some size by more than POOR_FIT_ERROR."""
        return self.worst_error > POOR_FIT_ERROR

    def outside_spread(self) -> list[int]:
        """Sizes whose prediction lies outside their measured 10th-90th percentile range."""
        if not self.spreads:
            return []
        return [m for m, (lo, hi) in zip(self.sizes, self.spreads)
                if not lo <= self.fit.time(m) <= hi]

    def describe_fit(self) -> str:
        """One line: a, b and the fit's error beside them."""
        bw = f"{1 / self.fit.b / 1e9:.3f} GB/s" if self.fit.b > 0 else "inf GB/s"
        outside = self.outside_spread()
        return (f"a = {self.fit.a * 1e6:.3f} us, b = {self.fit.b * 1e9:.4f} ns/byte ({bw}); "
                f"fit error: worst {self.worst_error * 100:.1f}%, rms {self.rms * 1e6:.2f} us, "
                f"{len(outside)} of {len(self.sizes)} size(s) predicted outside their "
                f"measured spread")

    def warning(self) -> str | None:
        """A warning line when the fit is poor, else None."""
        if not self.poor:
            return None
        i = max(range(len(self.sizes)), key=lambda k: abs(self.fit.time(self.sizes[k])
                                                          - self.times[k]) / self.times[k])
        return (f"the all-reduce fit is poor: at {self.sizes[i]} B it predicts "
                f"{self.fit.time(self.sizes[i]) * 1e6:.1f} us where {self.times[i] * 1e6:.1f} "
                f"us was measured ({self.worst_error * 100:.0f}% off, more than "
                f"{POOR_FIT_ERROR * 100:.0f}%): plans made from it may be far from the best; "
                f"give a --network file measured with more iterations, or check the network")

    def network_json(self, source: str = "mgcaffe bench-comm") -> dict:
        """The planner's network description, with the raw points kept for plotting."""
        return {"source": source, "units": "seconds, seconds per byte",
                "fits": {str(self.nodes): {"a": self.fit.a, "b": self.fit.b,
                                           "rms_s": self.rms,
                                           "worst_relative_error": self.worst_error}},
                "measurements": {str(self.nodes): [[m, t] for m, t in
                                                   zip(self.sizes, self.times)]}}

    def table(self) -> str:
        lines = [f"{'bytes':>12} {'measured us':>12} {'p10-p90 us':>21} {'fit us':>10}"]
        spreads = self.spreads or [(t, t) for t in self.times]
        for m, t, (lo, hi) in zip(self.sizes, self.times, spreads):
            lines.append(f"{m:12d} {t * 1e6:12.2f} {lo * 1e6:10.2f}-{hi * 1e6:<10.2f} "
                         f"{self.fit.time(m) * 1e6:10.2f}")
        return "\n".join(lines)


def _iterations_for(nbytes: int, iterations: int) -> int:
    # Large messages take long and vary little: fewer repetitions (at least 3).
    return max(3, min(iterations, int(iterations * (1 << 20) / max(nbytes, 1 << 20))))


def measure_allreduce(comm: Communicator, sizes: Sequence[int] = DEFAULT_SIZES,
                      iterations: int = 20, warmup: int = 2, xp=np) -> AllreduceBenchmark:
    """Time `comm.allreduce_sum` for every size (bytes) and fit a + b*M; a collective.
    `xp`: the array module of the buffer (CuPy to time NCCL on device memory)."""
    sizes = [int(s) for s in sizes]
    if len(set(sizes)) < 2:
        raise CommError(f"rank {comm.rank}: the all-reduce benchmark needs at least two "
                        f"distinct sizes, got {sizes}")
    if any(s < 4 or s % 4 for s in sizes):
        raise CommError(f"rank {comm.rank}: benchmark sizes must be positive multiples of 4 "
                        f"bytes (float32), got {sizes}")
    buf = xp.zeros(max(sizes) // 4, dtype=np.float32)
    times, spreads = [], []
    clock = time.perf_counter
    for m in sizes:
        piece = buf[:m // 4]
        for _ in range(warmup):
            comm.allreduce_sum(piece)
        reps = _iterations_for(m, iterations)
        mine = [0.0] * reps
        comm.barrier()
        for i in range(reps):
            t0 = clock()
            comm.allreduce_sum(piece)
            mine[i] = clock() - t0
        per_call = np.max(np.array(comm.allgather(mine)), axis=0)  # the slowest rank's
        times.append(float(np.median(per_call)))
        spreads.append((float(np.percentile(per_call, 10)), float(np.percentile(per_call, 90))))
    fit, worst = fit_relative(sizes, times)
    rms = float(np.sqrt(np.mean([(fit.time(m) - t) ** 2 for m, t in zip(sizes, times)])))
    return AllreduceBenchmark(comm.size, sizes, times,
                              CostModel(fit.a, fit.b, nodes=comm.size, origin="measured fit"),
                              rms, spreads, worst)
