"""rho measured in situ: how much the net's own backward slows beside its real all-reduces.

The start-up probe (interference.py) times a GEMM while a thread all-reduces; the real
backward (im2col copies, small GEMMs, interpreter overhead) can be slowed more, or less.
During the re-plan window the trainer alternates two kinds of iterations: undisturbed ones
(every gradient in one all-reduce after backward) and overlapped ones (one all-reduce per
layer, started as soon as the layer's gradient is ready, while backward goes on). In the
extended model (docs/planner.md) backward runs at 1/(1 + rho(M)) of its speed while a message
of M bytes is in flight, so for each learnable layer l of an overlapped iteration

    t_over(l) - t_alone(l) = sum over messages m of busy(l, m) * rho(M_m) / (1 + rho(M_m))

where busy(l, m) is how long message m was in flight during layer l's backward and
t_alone(l) the layer's median undisturbed time. `estimate` solves that by least squares for
x = rho / (1 + rho), once for a single rho and once per size class (the start-up probe's
sizes, each message in the nearest class in log2), with a bootstrap over iterations for
the spread of each class. One rho is reported when it lies inside every well-measured
class's 10-90% bootstrap range (a single number fits within noise), else rho per size.
The other direction, sigma (a message progresses at 1/sigma while backward runs, at full
speed after), comes from the same overlapped iterations: a message of M bytes that was in
flight for d seconds, o of them during backward, took

    d - T(M) = o * z,   z = 1 - 1 / sigma(M)

longer than the cost model's T(M) = a + b*M. `estimate_comm` fits z like x above (one z and
per size class, bootstrap, one sigma when it fits every class within noise).
The estimates are pure functions: every rank computes the same result from the gathered rows.

`InSituWindow` gathers those rows during the re-plan window, and with them the window's
iterations that ran the start-up plan as training runs it (interleaved with the profile, so
both see the same machine); `adopt_in_situ` turns the rows into the cost model's rho and
sigma, and `calibrate` scales that interference so that the model predicts those iterations:
what the model then predicts is calibrated on iterations run as the steady state runs.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backends.communicator import Communicator
from ..model.cost import CostModel
from .gradient_comm import Guard
from .notices import in_situ_summary

__all__ = ["CommInSitu", "InSitu", "InSituResult", "InSituWindow", "adopt_in_situ", "calibrate",
           "estimate", "estimate_comm", "last_arrivals", "layer_overlaps"]

log = logging.getLogger("mgcaffe.comm")

MAX_X = 0.95  # x = rho / (1 + rho) < 1: rho at most 19 (a layer 20x slower)
MIN_BUSY_SHARE = 0.10  # a size class needs this share of the in-flight time to be judged
BOOTSTRAP = 200
K_MAX = 4.0  # the calibration scales the measured interference by at most this much


@dataclass(frozen=True)
class InSitu:
    """The in-situ estimate: `points` [(bytes, rho)] for the cost model, `single` (one rho
    for every size), `per_size` [(bytes, rho, p10, p90)] of the classes measured, `one` is
    whether the single rho was used, and the amount of evidence behind it."""

    points: tuple[tuple[int, float], ...]
    single: float
    per_size: tuple[tuple[int, float, float, float], ...]
    one: bool
    overlapped_iterations: int
    undisturbed_iterations: int
    busy_seconds: float
    whole: float = 0.0  # the same from whole backward spans (extra time / time in flight)

    def describe(self) -> str:
        classes = ", ".join(f"{m / 1e6:.3g} MB +{r * 100:.0f}% (p10-p90 {lo * 100:.0f}-"
                            f"{hi * 100:.0f}%)" for m, r, lo, hi in self.per_size)
        how = ("one rho fits every size within noise" if self.one else
               "rho differs by size beyond noise: per-size points used")
        return (f"in-situ slowdown of backward beside its all-reduces: +{self.single * 100:.0f}%"
                f" for one rho; per size {classes or 'none measured'}; {how} "
                f"({self.overlapped_iterations} overlapped / {self.undisturbed_iterations} "
                f"undisturbed iteration(s), {self.busy_seconds * 1e3:.1f} ms in flight "
                f"during backward; from whole backward spans +{self.whole * 100:.0f}%)")


def layer_overlaps(forward_end: float, ready: dict[int, float],
                   intervals: Sequence[tuple[float, float, int]], num_layers: int
                   ) -> list[tuple[float, list[tuple[int, float]]]]:
    """Per learnable layer l = 1..L (index l - 1): (its backward time, [(message bytes,
    seconds that message was in flight during the layer's backward)]). Layer L's backward
    runs from the end of forward to its gradient, layer l's from layer l+1's gradient."""
    out: list[tuple[float, list[tuple[int, float]]]] = [(0.0, [])] * num_layers
    previous = forward_end
    for k in range(num_layers, 0, -1):
        start, end = previous, ready[k]
        busy = []
        for t0, t1, nbytes in intervals:
            overlap = min(end, t1) - max(start, t0)
            if overlap > 0:
                busy.append((int(nbytes), overlap))
        out[k - 1] = (max(0.0, end - start), busy)
        previous = end
    return out


def _nearest(nbytes: int, classes: Sequence[int]) -> int:
    x = math.log2(max(1, nbytes))
    return min(range(len(classes)), key=lambda i: abs(math.log2(classes[i]) - x))


def _solve(rows: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares x >= 0 (each at most MAX_X) for y = rows @ x; classes without busy time
    stay 0. Few classes: clipping the unconstrained solution and refitting the rest is
    enough (an exact NNLS for 1-3 columns)."""
    active = [j for j in range(rows.shape[1]) if rows[:, j].any()]
    x = np.zeros(rows.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(rows[:, active], y, rcond=None)
        if (sol >= 0).all():
            x[active] = np.minimum(sol, MAX_X)
            break
        active = [j for j, s in zip(active, sol) if s > 0]  # drop the negative ones, refit
    return x


def _rho(x: float) -> float:
    return float(x / (1.0 - x))


def _sigma(z: float) -> float:
    return float(1.0 / (1.0 - z))


def _fit_classes(R: np.ndarray, Y: np.ndarray, owner: Sequence[int]):
    """Least squares of Y = R @ x (one column per size class) and of Y = (row sums) * x1,
    with each judged class's bootstrap (over iterations) 10-90% range. Returns (x1, x per
    class, [(class index, lo, hi)] of the judged classes, one): one is whether x1 lies inside
    every judged class's range (then one number fits every size within noise)."""
    total = R.sum()
    single_x = float(_solve(R.sum(axis=1, keepdims=True), Y)[0])
    per_x = _solve(R, Y)
    share = R.sum(axis=0) / total
    judged = [j for j in range(R.shape[1]) if share[j] >= MIN_BUSY_SHARE]
    owner_arr = np.array(owner)
    rng = np.random.default_rng(0)  # deterministic: every rank computes the same numbers
    iters = sorted(set(owner))
    boots = []
    for _ in range(BOOTSTRAP if len(iters) > 1 else 0):
        pick = rng.choice(iters, size=len(iters), replace=True)
        idx = np.concatenate([np.flatnonzero(owner_arr == i) for i in pick])
        boots.append(_solve(R[idx], Y[idx]))
    ranges = []
    one = True
    for j in judged:
        if boots:
            lo, hi = (float(v) for v in np.percentile([b[j] for b in boots], [10, 90]))
        else:
            lo = hi = float(per_x[j])
        ranges.append((j, lo, hi))
        one &= lo <= single_x <= hi
    if len(judged) < 2:
        one = True
    return single_x, per_x, ranges, one


def estimate(undisturbed: Sequence[Sequence[float]],
             overlapped: Sequence[Sequence[tuple[float, Sequence[tuple[int, float]]]]],
             classes: Sequence[int]) -> InSitu | None:
    """rho from `undisturbed` iterations ([t_b per layer], input side first) and
    `overlapped` ones (`layer_overlaps` of each), message sizes grouped into `classes`
    (bytes, e.g. the start-up probe's sizes). None when nothing was in flight during
    backward (nothing to measure: one layer, or no overlapped iteration)."""
    if not undisturbed or not overlapped:
        return None
    classes = sorted({int(c) for c in classes} or {1})
    L = len(undisturbed[0])
    alone = [statistics.median(s[l] for s in undisturbed) for l in range(L)]
    rows, y, owner = [], [], []  # one row per (iteration, layer) with a message in flight
    for i, sample in enumerate(overlapped):
        for l, (t, busy) in enumerate(sample):
            if not busy:
                continue
            row = [0.0] * len(classes)
            for nbytes, seconds in busy:
                row[_nearest(nbytes, classes)] += seconds
            rows.append(row)
            y.append(t - alone[l])
            owner.append(i)
    if not rows:
        return None
    # diagnostic: the extra time of the whole backward (every layer, also those with nothing
    # in flight: a slowdown that outlasts the messages) per second in flight
    extra = sum(t - alone[l] for sample in overlapped for l, (t, _) in enumerate(sample))
    R, Y = np.array(rows), np.array(y)
    total = R.sum()
    if total <= 0:
        return None
    single_x, per_x, ranges, one = _fit_classes(R, Y, owner)
    per_size = [(classes[j], _rho(per_x[j]), _rho(lo), _rho(hi)) for j, lo, hi in ranges]
    if one:
        points = tuple((c, _rho(single_x)) for c in classes)
    else:
        points = tuple((classes[j], _rho(per_x[j])) for j, _, _ in ranges)
    whole = _rho(min(MAX_X, max(0.0, extra / total)))
    return InSitu(points, _rho(single_x), tuple(per_size), one, len(overlapped),
                  len(undisturbed), float(total), whole)


@dataclass(frozen=True)
class CommInSitu:
    """The in-situ sigma: `points` [(bytes, sigma)] for the cost model, `single` (one sigma
    for every size), `per_size` [(bytes, sigma, p10, p90)] of the classes measured, `one`
    whether the single sigma was used; the evidence: messages that overlapped backward, the
    seconds they did so, and the measured / modelled time of the messages sent after backward
    (`after`: how well a + b*M itself fits, 0 when there were none)."""

    points: tuple[tuple[int, float], ...]
    single: float
    per_size: tuple[tuple[int, float, float, float], ...]
    one: bool
    messages: int
    overlap_seconds: float
    after: float = 0.0

    def describe(self) -> str:
        classes = ", ".join(f"{m / 1e6:.3g} MB x{r:.2f} (p10-p90 {lo:.2f}-{hi:.2f})"
                            for m, r, lo, hi in self.per_size)
        how = ("one sigma fits every size within noise" if self.one else
               "sigma differs by size beyond noise: per-size points used")
        after = (f"; messages sent after backward took {self.after:.2f}x a + b*M"
                 if self.after else "")
        return (f"in-situ slowdown of all-reduces while backward runs: x{self.single:.2f} for "
                f"one sigma; per size {classes or 'none measured'}; {how} ({self.messages} "
                f"message(s), {self.overlap_seconds * 1e3:.1f} ms of them during backward"
                f"{after})")


def last_arrivals(per_rank: Sequence[Sequence[Sequence[tuple]]]) -> list[list[tuple]]:
    """Each message as seen by the rank that entered it last: the one with the least time in
    the call. An all-reduce ends at about the same moment everywhere, so the other ranks' extra
    time is waiting for that rank (a skew the model has already, in the slowest rank's ready
    times), not the message's own slowdown. `per_rank[r][i][m]` is rank r's row (bytes,
    seconds, ...) of message m of overlapped iteration i; ranks whose iterations or messages
    do not line up (a rank skipped an incomplete iteration) are left out."""
    ranks = [r for r in per_rank if r]
    if not ranks:
        return []
    shape = [len(it) for it in ranks[0]]
    same = [r for r in ranks if [len(it) for it in r] == shape
            and all(a[0] == b[0] for x, y in zip(r, ranks[0]) for a, b in zip(x, y))]
    return [[min((r[i][m] for r in same), key=lambda row: row[1]) for m in range(n)]
            for i, n in enumerate(shape)]


def estimate_comm(overlapped: Sequence[Sequence[tuple[int, float, float, float]]],
                  classes: Sequence[int]) -> CommInSitu | None:
    """sigma from the overlapped iterations' messages: per iteration, [(bytes, seconds in
    flight, seconds of that during backward, the cost model's T(bytes))], sizes grouped into
    `classes`. None when no message was in flight during backward."""
    classes = sorted({int(c) for c in classes} or {1})
    rows, y, owner = [], [], []
    after_measured = after_modelled = 0.0
    for i, messages in enumerate(overlapped):
        for nbytes, seconds, during, modelled in messages:
            if during <= 0:
                after_measured += seconds
                after_modelled += modelled
                continue
            row = [0.0] * len(classes)
            row[_nearest(nbytes, classes)] = during
            rows.append(row)
            y.append(seconds - modelled)
            owner.append(i)
    if not rows:
        return None
    R, Y = np.array(rows), np.array(y)
    single_z, per_z, ranges, one = _fit_classes(R, Y, owner)
    per_size = [(classes[j], _sigma(per_z[j]), _sigma(lo), _sigma(hi)) for j, lo, hi in ranges]
    if one:
        points = tuple((c, _sigma(single_z)) for c in classes)
    else:
        points = tuple((classes[j], _sigma(per_z[j])) for j, _, _ in ranges)
    after = after_measured / after_modelled if after_modelled > 0 else 0.0
    return CommInSitu(points, _sigma(single_z), tuple(per_size), one, len(rows),
                      float(R.sum()), after)


# ----------------------------------------------------------------------------- the window
@dataclass
class InSituWindow:
    """The re-plan window beside its profile (the undisturbed iterations, every gradient in
    one all-reduce after backward): overlapped iterations, which measure rho and sigma, and
    the closing-line time of every iteration that ran the start-up plan as training runs it
    (`plan_times`; the undisturbed ones for a plan of one message)."""

    #: the group lists the overlapped iterations take turns with (per layer; the plan's)
    overlapped: list
    #: the start-up plan's groups, where its iterations here run as training runs them
    plan_groups: Any = None
    #: per overlapped iteration: each layer's backward time and what was in flight meanwhile
    rows: list = field(default_factory=list)
    #: per overlapped iteration: (bytes, time in flight, of it during backward, a + b*M)
    messages: list = field(default_factory=list)
    seen: int = 0  # overlapped iterations so far (the first warms and is not counted)
    comm_measured: float = 0.0  # time in flight of the messages sent during backward
    comm_modelled: float = 0.0  # what a + b*M predicts for the same messages
    plan_times: list = field(default_factory=list)
    running: Any = None  # the groups of the iteration under way

    def groups_for(self, n: int, whole: Any) -> Any:
        """What window iteration n (from 0) runs: `whole` (a plan of one all-reduce after
        backward) for even n, for odd n the overlapped group lists in turn."""
        chosen = self.overlapped[(n // 2) % len(self.overlapped)] if n % 2 == 1 else whole
        self.running = [list(g) for g in getattr(chosen, "groups", chosen)]
        return chosen

    def add_time(self, seconds: float | None) -> None:
        """The closing-line time of the iteration just run (None: not counted, as the
        window's first, which warms)."""
        if seconds is not None and self.plan_groups is not None and \
                self.running == [list(g) for g in self.plan_groups]:
            self.plan_times.append(seconds)

    def add_overlapped(self, forward_end: float, ready: dict[int, float], intervals: list,
                       cost: CostModel, layers: int) -> None:
        """One overlapped iteration: each layer's backward time and what was in flight
        meanwhile, and each message's time in flight, how much of it during backward and
        what a + b*M predicts for it (the first such iteration warms and is not counted)."""
        self.seen += 1
        if self.seen <= 1 or len(ready) != layers:
            return
        self.rows.append(layer_overlaps(forward_end, ready, intervals, layers))
        start, end = forward_end, ready[1]
        self.messages.append(
            [(m, t1 - t0, max(0.0, min(t1, end) - max(t0, start)), cost.link_time(m))
             for t0, t1, m in intervals])
        for t0, t1, m in intervals:
            if t0 < end:
                self.comm_measured += t1 - t0
                self.comm_modelled += cost.link_time(m)


@dataclass(frozen=True)
class InSituResult:
    """What the window measured in situ: the cost model with it (`cost`), rho (`rho`, None
    when nothing was in flight during backward), sigma (`sigma`), the all-reduces' measured
    over modelled time during backward (`comm_slowdown`), the start-up probe's rho points."""

    cost: CostModel
    rho: InSitu | None = None
    sigma: CommInSitu | None = None
    comm_slowdown: float | None = None
    probe: tuple = ()


def adopt_in_situ(comm: Communicator, guard: Guard, cost: CostModel, window: InSituWindow,
                  undisturbed: list) -> InSituResult:
    """rho and sigma from the window on every rank (the slowest rank's rho; sigma from each
    message as the rank that entered it last saw it), in `cost` for the re-plan and the
    rest of the run: a collective, every rank adopting the same points. `undisturbed`: this
    rank's profiled iterations' [t_b per layer]."""
    probe = tuple(cost.interference)
    classes = [m for m, _ in probe]
    mine = estimate(undisturbed, window.rows, classes)
    with guard("gathering the in-situ interference estimates"):
        gathered = comm.allgather((mine, window.messages))
    found = [e for e, _ in gathered if e is not None]
    comm_est = estimate_comm(last_arrivals([m for _, m in gathered]), classes)
    if comm_est is not None:
        cost = cost.with_comm_slowdown(comm_est.points)
        if comm.rank == 0:
            log.debug("Communication slows beside backward, measured in situ (each message "
                      "as the last of %d rank(s) to enter it saw it): %s; the model now uses "
                      "%s", comm.size, comm_est.describe(),
                      ", ".join(f"{m / 1e6:.3g} MB x{v:.2f}" for m, v in comm_est.points))
    probe_text = ", ".join(f"{m / 1e6:.3g} MB +{r * 100:.0f}%" for m, r in probe)
    if not found:
        if comm.rank == 0:
            log.info("Interference in situ: no all-reduce was in flight during backward in the "
                     "window; keeping the start-up probe's rho (%s)", probe_text)
            if comm_est is not None:
                log.info("%s", in_situ_summary(None, comm_est.single, comm.size))
        return InSituResult(cost, None, comm_est, None, probe)
    est: InSitu = max(found, key=lambda e: e.single)  # the step waits for the slowest
    with guard("gathering the in-situ all-reduce times"):
        slowest = max(m / p if p > 0 else 1.0 for m, p in
                      comm.allgather((window.comm_measured, window.comm_modelled)))
    if comm.rank == 0:
        log.info("%s", in_situ_summary(est.single, getattr(comm_est, "single", None),
                                       comm.size))
        log.debug("All-reduces sent while backward ran took %.2fx their a + b*M (slowest rank; "
                  "whole messages, also their part after backward)", slowest)
        log.debug("Computation slows beside the all-reduces, measured in situ on the slowest "
                  "of %d rank(s): %s; the model now uses %s (start-up GEMM probe: %s)",
                  comm.size, est.describe(),
                  ", ".join(f"{m / 1e6:.3g} MB +{r * 100:.0f}%" for m, r in est.points),
                  probe_text)
    return InSituResult(cost.with_interference(est.points), est, comm_est, slowest, probe)


def calibrate(predict: Callable[[float], float], measured: float, lo: float = 0.0,
              hi: float = K_MAX, rel: float = 1e-4) -> float:
    """The x in [lo, hi] at which `predict(x)` (an iteration's predicted seconds, never
    less for a larger x) equals `measured`: lo where even lo predicts more, hi where even hi
    predicts less; by bisection to `rel` of `measured`. x is a scale of the model: of the
    measured interference by default (`CostModel.scaled_interference`), 0 none, 1 as
    measured, at most K_MAX. 1 where the prediction does not depend on x (for the
    interference: nothing overlaps backward, as one all-reduce after it): then those
    iterations say nothing about it."""
    low, high = predict(lo), predict(hi)
    if high - low <= rel * measured:
        return 1.0
    if low >= measured:
        return lo
    if high <= measured:
        return hi
    for _ in range(60):
        mid = (lo + hi) / 2
        t = predict(mid)
        if abs(t - measured) <= rel * measured:
            return mid
        lo, hi = (mid, hi) if t < measured else (lo, mid)
    return (lo + hi) / 2
