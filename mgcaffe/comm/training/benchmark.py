"""All-reduce benchmark: time T_ar(M) over message sizes, and the cost model it gives.

Every rank runs the same sizes in the same order (a collective). Before the first size, the
link is warmed (`LINK_WARMUP` all-reduces of the smallest size: over TCP the first size
measured came out slow, 4 B at 47 us with a spread to 110 us against 37 us when measured again
after the others, outside the spread the curve could fit); then, for each size, after warm-up
calls, `iterations` all-reduces are timed one by one, back to back after a barrier; each call's
time is the slowest rank's (what a synchronous step waits for), and a size's time is the
median over its calls, with the 10th-90th percentile range as its spread.

The model (`cost_fit.fit_measured`) is the measured curve: piecewise linear through the
medians, so it predicts every measured size within its spread; its a and b are the line of
least relative error through the same points (the paper's Eq. 9, `cost.fit_relative`: a plain
least-squares line is dominated by the large messages and can miss a 5 us small message by
100 us). `model="paper"` makes that line the model. Over TCP the line misses the largest
messages by up to a third; the report gives both the model's fit and the line's, and `poor`
says when the model misses some size beyond its spread by more than 10%
(`cost_fit.POOR_MISS`). `network_json` writes the planner's network format
(`fits: {"<N>": {"a": .., "b": .., "times": [[bytes, seconds], ...]}}`), the data of the
paper's Figure 5(b).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...errors import CommError
from ..backends.communicator import Communicator
from ..model.cost import CostModel, canonical_cost_model
from ..model.cost_fit import FitCheck, check_fit, fit_measured

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
    """Measured points (bytes, median seconds per all-reduce, p10-p90 spread) and the model
    made from them: `fit` (the measured curve, or its line with `model="paper"`)."""

    nodes: int
    sizes: list[int]
    times: list[float]
    fit: CostModel
    spreads: list[tuple[float, float]] | None = None  # per size, 10th and 90th percentile

    @property
    def check(self) -> FitCheck:
        """How well `fit` predicts every measured size."""
        return check_fit(self.fit, self.sizes, self.times, self.spreads)

    @property
    def line_check(self) -> FitCheck:
        """How well the line a + b*M alone predicts every measured size."""
        return check_fit(self.fit.paper(), self.sizes, self.times, self.spreads)

    @property
    def rms(self) -> float:
        """The model's root-mean-square error over the sizes, seconds."""
        return self.check.rms

    @property
    def worst_error(self) -> float:
        """The model's worst relative error over the sizes."""
        return self.check.worst_error

    @property
    def poor(self) -> bool:
        """Whether the model misses some size beyond its spread by more than 10%."""
        return self.check.poor

    def outside_spread(self) -> list[int]:
        """Sizes whose prediction lies outside their measured 10th-90th percentile range."""
        return self.check.outside() if self.spreads else []

    def describe_fit(self) -> str:
        """One line: the model, its error, and the line's error beside it."""
        line = self.line_check
        text = f"{self.fit.describe()}; fit error: {self.check.summary()}"
        if self.fit.times:
            text += f"; the line alone: {line.summary()}"
        return text

    def warning(self) -> str | None:
        """A warning line when the model is poor, else None."""
        misses = self.check.misses()
        if not misses:
            return None
        m, err = misses[0]
        t = self.times[self.sizes.index(m)]
        return (f"the all-reduce model is poor: at {m} B it predicts "
                f"{self.fit.time(m) * 1e6:.1f} us where {t * 1e6:.1f} us was measured "
                f"({abs(err) * 100:.0f}% off, outside the measured spread; "
                f"{len(misses)} size(s) so): plans made from it may be far from the best; "
                f"give a --network file measured with more iterations, or check the network")

    def doubt(self) -> str:
        """Why plans from this model may be off, in a few words; "" when the model fits."""
        misses = self.check.misses()
        if not misses:
            return ""
        m, err = misses[0]
        return (f"the all-reduce model misses {len(misses)} measured size(s) beyond their "
                f"spread (at {m} B by {abs(err) * 100:.0f}%)")

    def network_json(self, source: str = "mgcaffe bench-comm") -> dict:
        """The planner's network description, with the raw points kept for plotting."""
        line = self.line_check
        fit = {"a": self.fit.a, "b": self.fit.b, "rms_s": line.rms,
               "worst_relative_error": line.worst_error}
        if self.fit.times:
            fit["times"] = [[m, t] for m, t in self.fit.times]
        doc = {"source": source, "units": "seconds, seconds per byte",
               "fits": {str(self.nodes): fit},
               "measurements": {str(self.nodes): [[m, t] for m, t in
                                                  zip(self.sizes, self.times)]}}
        if self.spreads:
            doc["spreads"] = {str(self.nodes): [[m, lo, hi] for m, (lo, hi) in
                                                zip(self.sizes, self.spreads)]}
        return doc

    def table(self) -> str:
        lines = [f"{'bytes':>12} {'measured us':>12} {'p10-p90 us':>21} {'model us':>10} "
                 f"{'line us':>10}"]
        spreads = self.spreads or [(t, t) for t in self.times]
        line = self.fit.paper()
        for m, t, (lo, hi) in zip(self.sizes, self.times, spreads):
            lines.append(f"{m:12d} {t * 1e6:12.2f} {lo * 1e6:10.2f}-{hi * 1e6:<10.2f} "
                         f"{self.fit.time(m) * 1e6:10.2f} {line.time(m) * 1e6:10.2f}")
        return "\n".join(lines)


LINK_WARMUP = 20  # all-reduces of the smallest size before anything is timed


def _iterations_for(nbytes: int, iterations: int) -> int:
    # Large messages take long and vary little: fewer repetitions (at least 3).
    return max(3, min(iterations, int(iterations * (1 << 20) / max(nbytes, 1 << 20))))


def measure_allreduce(comm: Communicator, sizes: Sequence[int] = DEFAULT_SIZES,
                      iterations: int = 20, warmup: int = 2, xp=np,
                      model: str | None = None) -> AllreduceBenchmark:
    """Time `comm.allreduce_sum` for every size (bytes) and make the cost model of the form
    `model` (COST_MODELS; default the measured curve); a collective. `xp`: the array module
    of the buffer (CuPy to time NCCL on device memory). `warmup` 0 warms nothing, neither the
    link nor any size."""
    model = canonical_cost_model(model)
    sizes = [int(s) for s in sizes]
    if len(set(sizes)) < 2:
        raise CommError(f"rank {comm.rank}: the all-reduce benchmark needs at least two "
                        f"distinct sizes, got {sizes}")
    twice = sorted({s for s in sizes if sizes.count(s) > 1})
    if twice:
        raise CommError(f"rank {comm.rank}: benchmark sizes must differ, got "
                        f"{', '.join(f'{s} B' for s in twice)} more than once in {sizes}")
    if any(s < 4 or s % 4 for s in sizes):
        raise CommError(f"rank {comm.rank}: benchmark sizes must be positive multiples of 4 "
                        f"bytes (float32), got {sizes}")
    buf = xp.zeros(max(sizes) // 4, dtype=np.float32)
    times, spreads = [], []
    clock = time.perf_counter
    smallest = buf[:min(sizes) // 4]
    for _ in range(LINK_WARMUP if warmup else 0):
        comm.allreduce_sum(smallest)
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
    curve = fit_measured(sizes, times, spreads)
    fit = CostModel(curve.a, curve.b, nodes=comm.size, origin="measured",
                    times=curve.times if model == "piecewise" else ())
    return AllreduceBenchmark(comm.size, sizes, times, fit, spreads)
