"""`mgcaffe bench-comm`: the all-reduce benchmark alone, under mpiexec, writing a network JSON.

    mpiexec -n 4 mgcaffe bench-comm --out network.json

Times T_ar(M) for message sizes from a few bytes to megabytes (`--sizes`) and writes
`{"fits": {"4": {"a": .., "b": .., "times": [[bytes, seconds], ...]}}, "alpha": .., "beta": ..,
"measurements": ...}`: the measured curve and the line a + b*M fitted to it, what `mgcaffe
plan --network` and `mgcaffe train --network` read (the data of the paper's Figure 5(b)).
The fit holds for the number of ranks it was measured with; `alpha` and `beta` are that line
read through the ring formula (a = 2(N-1) alpha, b = 2(N-1)/N beta), so that `plan --nodes M`
works for another M, as an extrapolation that the log and the file say is one (measure at M
for a fit of its own).
"""

from __future__ import annotations

import json
import logging
import re
import socket
from pathlib import Path

from ..backend import _import_cupy
from ..comm.backends.nccl import NcclCommunicator
from ..comm.training.benchmark import DEFAULT_SIZES, measure_allreduce
from ..comm.training.interference import (
    interference_sizes,
    measure_interference,
)
from ..comm.training.notices import fit_notices, fit_quality_level
from ..comm.training.world import world
from ..errors import CommError

NAME = "bench-comm"
HELP = ("measure all-reduce time over message sizes: the measured T(M) and its line a + b*M "
        "(run under mpiexec)")

log = logging.getLogger("mgcaffe.comm")

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20,
          "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30}


def _size_text(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def parse_size(text: str) -> int:
    """'4', '64K', '16MB' -> bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise CommError(f"--sizes: cannot read {text!r} as a size (e.g. 4, 64K, 16M)")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def add_arguments(parser) -> None:
    parser.add_argument("--sizes", default=None,
                        help="comma-separated message sizes in bytes, K/M suffixes allowed "
                             f"(default: {_size_text(DEFAULT_SIZES[0])} to "
                             f"{_size_text(DEFAULT_SIZES[-1])}, {len(DEFAULT_SIZES)} sizes)")
    parser.add_argument("--iterations", type=int, default=20,
                        help="timed all-reduces per size (fewer for large sizes; default 20)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls per size")
    parser.add_argument("--out", default=None, help="write the network JSON here (rank 0)")
    parser.add_argument("--comm-backend", choices=("mpi", "nccl"), default="mpi",
                        help="what to time: MPI on host memory (default), or NCCL on GPU "
                             "memory, one GPU per rank as train --gpu all picks them")
    parser.add_argument("--interference", action="store_true",
                        help="also measure how much computation slows while an all-reduce is "
                             "in flight (written as fits.N.interference)")


def fit_warning(a: float, rms: float) -> str | None:
    """The warning for a fit whose start-up cost a is smaller than its rms residual: a is
    then noise, and plans made with it are not to be trusted."""
    if rms > abs(a):
        return (f"the fit's rms residual ({rms * 1e6:.3f} us) is larger than its intercept a "
                f"({a * 1e6:.3f} us): a is not measured reliably (a busy machine, or too few "
                "sizes or --iterations); plans made from this file may be off")
    return None


def ring_constants(a: float, b: float, nodes: int) -> tuple[float, float]:
    """(alpha, beta) that give (a, b) at `nodes` by the ring formula: a = 2(N-1) alpha,
    b = 2(N-1)/N beta (the reduction's arithmetic folded into beta)."""
    steps = 2 * (nodes - 1)
    return a / steps, b * nodes / steps


def run(args) -> int:

    comm, _, _ = world(log_level=getattr(args, "log_level", "INFO"))
    sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else DEFAULT_SIZES
    if args.iterations < 1:
        raise CommError("--iterations must be >= 1")
    if comm.size == 1:
        raise CommError("one rank has nothing to exchange: start it under a launcher, e.g. "
                        "mpiexec -n 2 mgcaffe bench-comm --out network.json (one rank per "
                        "node to measure a network)")
    hosts = len(set(comm.allgather(socket.gethostname())))
    xp = None
    if getattr(args, "comm_backend", "mpi") == "nccl":
        if args.interference:
            raise CommError("--interference measures host computation beside MPI; it is not "
                            "measured with --comm-backend nccl")
        comm = NcclCommunicator(comm)  # each rank on its GPU of the node (a collective)
        xp = _import_cupy()
    result = measure_allreduce(comm, sizes, args.iterations, args.warmup,
                               **({} if xp is None else {"xp": xp}))
    points = None
    if args.interference:

        points = measure_interference(comm, result.fit, interference_sizes(max(sizes)))
    if comm.rank == 0:
        where = f"{hosts} host{'s' if hosts > 1 else ''}"
        log.info("all-reduce among %d ranks on %s (%s):\n%s", comm.size, where, comm.name,
                 result.table())
        log.info("%s", result.describe_fit())
        # a poor fit: a warning across hosts, expected on one host (notices.py)
        for level, line in fit_notices(result.warning(), result.worst_error, hosts):
            log.log(level, "%s", line)
        rms_warning = fit_warning(result.fit.a, result.line_check.rms)
        if rms_warning:
            log.log(fit_quality_level(True, hosts), "%s", rms_warning)
        doc = result.network_json()
        alpha, beta = ring_constants(result.fit.a, result.fit.b, comm.size)
        doc.update(alpha=alpha, beta=beta, algorithm="ring",
                   extrapolation=f"alpha and beta: the N = {comm.size} fit by the ring "
                                 f"formula; other N are extrapolated")
        log.info("for other numbers of nodes: alpha = %.3f us, beta = %.4f ns/B (this fit by "
                 "the ring formula a = 2(N-1) alpha, b = 2(N-1)/N beta); `plan --nodes M` "
                 "extrapolates with them: measure at M for a fit of its own", alpha * 1e6,
                 beta * 1e9)
        if points is not None:
            log.info("computation slows while an all-reduce is in flight: %s",
                     ", ".join(f"{m} B +{rho * 100:.0f}%" for m, rho in points))
            doc["fits"][str(comm.size)]["interference"] = [[m, rho] for m, rho in points]
        if args.out:
            path = Path(args.out)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
            tmp.replace(path)
            log.info("wrote %s", path)
    comm.barrier()
    return 0
