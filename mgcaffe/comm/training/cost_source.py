"""The all-reduce cost model T(M) a run plans with, and where it came from.

In order: `--network` (a fit or a formula for N nodes), else the emulated network, else
nothing to pay with one rank, else nothing when a `--plan` is given (the plan carries its own
cost), else measured at start-up: an all-reduce benchmark over sizes from 4 bytes to the
whole gradient, kept as the measured curve (piecewise linear through each size's median,
with the line of least relative error beside it), plus the interference probe (how much computation
slows while an all-reduce is in flight, and the all-reduce while computation runs). A
collective when it measures.

`SentMessages` checks T once more in training: the re-plan window's messages sent after
backward, and T corrected at the sizes where it lies outside the middle half of them.
"""

from __future__ import annotations

import dataclasses
import logging
import socket

import numpy as np

from ...errors import CommError, PlanError
from ..backends.communicator import Communicator
from ..backends.wire import cast_cost, cast_path
from ..model.cost import CostModel, compress_wires, cost_for, load_network
from ..model.cost_fit import MIN_SAMPLES, SizeTimes, correct, summarise
from .benchmark import measure_allreduce
from .gradient_comm import Guard
from .insitu import last_arrivals
from .interference import interference_sizes, measure_slowdowns
from .notices import fit_notices
from .options import Options
from .startup import benchmark_sizes

log = logging.getLogger("mgcaffe.comm")


def run_cost(options: Options, comm: Communicator, gradient_bytes: int, guard: Guard,
             emulated_cost: CostModel | None = None, xp=np) -> CostModel | None:
    """T_ar for this run (see the module docstring), logged once on rank 0; None when a
    `--plan` brings its own. `comm` is the communicator the gradients go through (NCCL on
    GPUs, with `xp` CuPy: measured on device memory), `gradient_bytes` the size of the
    whole gradient."""
    nodes = options.emulate_nodes or comm.size
    if options.network:
        cost = cost_for(load_network(options.network), nodes)
        origin = f"{options.network} ({cost.origin}, N={nodes})"
    elif options.emulate_network:
        cost, origin = emulated_cost, f"emulated {options.emulate_network} (N={nodes})"
    elif comm.size == 1:
        cost, origin = CostModel(0.0, 0.0, nodes=1), "one rank: no communication"
    elif options.plan:
        return None  # the plan carries its own a and b
    else:
        cost, origin = _measured(comm, gradient_bytes, guard, xp)
        cost = with_interference(cost, comm, gradient_bytes, guard, options.timeout, xp)
    if comm.rank == 0:
        log.info("All-reduce cost %s [%s]", cost.describe(), origin)
    return with_compression(cost, options, comm, xp)


def with_compression(cost: CostModel, options: Options, comm: Communicator, xp=np
                     ) -> CostModel:
    """`cost` with the wire formats --compress offers (among those `comm` reduces) and
    their cast costs measured on this rank's device (rank 0's, so every rank plans alike);
    unchanged for none or one rank."""
    if options.compress == "none" or comm.size == 1:
        return cost
    try:
        wires = compress_wires(options.compress, comm.wires)
    except PlanError as exc:
        raise CommError(f"rank {comm.rank}: {exc}") from None
    # a host communicator sums the payloads itself: that sum is part of a message's cost
    host = xp is np
    cast = comm.broadcast(cast_cost(wires, xp, sum_parts=comm.size if host else 0), root=0)
    if comm.rank == 0:
        log.info("Compression %s: formats %s; casts%s %s per MB (%s, measured on this "
                 "device)", options.compress, ", ".join(wires), " and sum" if host else "",
                 ", ".join(f"{w} {c * 1e9:.3g} ms" for w, c in sorted(cast.items()))
                 or "none", cast_path() if host else "device kernels")
    return dataclasses.replace(cost, wires=wires, cast=tuple(cast.items()))


def _measured(comm: Communicator, gradient_bytes: int, guard: Guard,
              xp=np) -> tuple[CostModel, str]:
    sizes = benchmark_sizes(gradient_bytes)
    with guard("all-reduce benchmark"):
        bench = measure_allreduce(comm, sizes, iterations=10, xp=xp)
    # the INFO line names the curve and where it was measured; the errors go to the verbose
    # level (a poor fit has its own line, fit_notices below)
    origin = (f"measured all-reduce among {comm.size} ranks ({comm.name}), "
              f"{len(bench.check.outside())} of {len(sizes)} sizes outside their spread")
    hosts = len(set(comm.allgather(socket.gethostname())))
    if comm.rank == 0:
        log.debug("All-reduce benchmark among %d ranks (%s):\n%s", comm.size, comm.name,
                  bench.table())
        log.debug("All-reduce fit: %s", bench.describe_fit())
        # a poor fit: a warning across hosts, expected on one host (notices.py)
        for level, line in fit_notices(bench.warning(), bench.worst_error, hosts):
            log.log(level, "%s", line)
    return dataclasses.replace(bench.fit, doubt=bench.doubt()), origin


def with_interference(cost: CostModel, comm: Communicator, gradient_bytes: int, guard: Guard,
                      timeout: float, xp=np) -> CostModel:
    """`cost` with the measured slowdown of computation while an all-reduce is in flight,
    and of the all-reduce while computation runs (the planner's extended model; see
    interference.py)."""
    points = []
    for m in interference_sizes(gradient_bytes):
        # a few fixed-length rounds per size: a deadline of its own, not the comm timeout
        with guard(f"interference measurement at {m} bytes", max(timeout, 20.0)):
            points += measure_slowdowns(comm, cost, [m], xp=xp)
    if comm.rank == 0:
        log.info("Computation slows while an all-reduce is in flight: %s; the all-reduce "
                 "slows while computation runs: %s",
                 ", ".join(f"{m / 1e6:.3g} MB +{rho * 100:.0f}%" for m, rho, _ in points),
                 ", ".join(f"{m / 1e6:.3g} MB x{sigma:.2f}" for m, _, sigma in points))
    return cost.with_interference([(m, rho) for m, rho, _ in points],
                                  comm_slowdown=[(m, sigma) for m, _, sigma in points])


class SentMessages:
    """The re-plan window's messages sent after backward ended (undisturbed by it), per
    iteration as (bytes, seconds), and T corrected where it lies outside the middle half of
    them (`correct`)."""

    def __init__(self):
        self.sent: list[list[tuple[int, float]]] = []
        self.seen = 0  # of the executor's intervals, those already read
        self.corrections: list[SizeTimes] = []  # sizes the re-plan corrected T at
        self.sizes: list[int] = []  # sizes with enough messages to judge T there

    def record(self, intervals: list, ready: dict[int, float], layers: int, counted: bool,
               keep: bool) -> None:
        """Read this iteration's new `intervals` ((start, end, bytes) of every all-reduce);
        keep those sent after layer 1's gradient was ready when `counted` and every one of
        the `layers` gradients was. `keep`: another reader still needs the intervals
        (else the list is emptied, to keep it short)."""
        new = intervals[self.seen:]
        if keep:
            self.seen = len(intervals)
        else:
            intervals.clear()
            self.seen = 0
        end = ready.get(1)
        if counted and end is not None and len(ready) == layers:
            self.sent.append([(m, t1 - t0) for t0, t1, m in new if t0 >= end])

    def correct(self, comm: Communicator, guard: Guard, cost: CostModel | None,
                largest: int) -> CostModel | None:
        """`cost` with T corrected where it lies outside the middle half of the messages of
        a size (`cost_fit.correct`), each message as the last rank to enter it saw it (a
        collective: every rank adopts the same model). `largest`: the whole gradient's
        bytes."""
        with guard("gathering the re-plan window's message times"):
            gathered = comm.allgather(self.sent)
        self.sent = []
        if cost is None:
            return None
        rows = last_arrivals(gathered)
        measured = summarise([(m, t) for messages in rows for m, t in messages])
        self.sizes = [s.nbytes for s in measured if s.count >= MIN_SAMPLES]
        corrected, self.corrections = correct(cost, measured, largest=largest)
        if comm.rank == 0:
            _log_correction(cost, corrected, measured, self.corrections)
        return corrected


def _log_correction(before: CostModel, after: CostModel, measured: list[SizeTimes],
                    corrections: list[SizeTimes]) -> None:
    if not corrections:
        log.info("All-reduce cost checked against %d message(s) of %d size(s) sent after "
                 "backward in the window: T holds within the middle half of them",
                 sum(s.count for s in measured), len(measured))
        return
    log.info("All-reduce cost corrected from the window's messages at %s",
             ", ".join(f"{s.nbytes / 1e6:.3g} MB ({before.link_time(s.nbytes) * 1e3:.3g} -> "
                       f"{s.median * 1e3:.3g} ms, {s.count} messages)" for s in corrections))
    log.debug("All-reduce cost after the correction: %s", after.describe())
