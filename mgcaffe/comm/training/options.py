"""The distributed settings: command-line flags over the solver's comm_param over defaults."""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from typing import Any

from ...errors import CommError
from ..backends.communicator import Communicator

__all__ = ["BACKENDS", "COMM_MODES", "MERGES", "Options", "add_arguments", "options_from",
           "wanted"]

COMM_MODES = ("wfbp", "synceasgd", "mgwfbp", "threshold")
MERGES = ("optimal", "paper")
BACKENDS = ("auto", "mpi", "nccl")


def _suggest(value, choices) -> str:
    """"; did you mean 'x'?" for a value close to one of `choices` (comm_param typos)."""
    close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else ""


@dataclass
class Options:
    """Every distributed setting; `options_from` fills it from flags over comm_param."""

    comm: str = "mgwfbp"
    merge: str = "optimal"
    bucket_mb: float = 25.0
    profile: str | None = None
    network: str | None = None
    plan: str | None = None
    save_plan: str | None = None
    profile_iters: int = 5
    replan_after: int = 50  # re-plan once this many iterations after the start-up plan
    timeout: float = 120.0
    timeline: str | None = None
    emulate_network: str | None = None
    emulate_nodes: int | None = None
    check_sync: int = 0
    test_timeout: float = 3600.0
    backend: str = "auto"
    pack_gradients: bool = False
    thread_nice: int | None = -10

    @property
    def scheme(self) -> str:
        """The planner scheme: mgwfbp with merge=paper is Algorithm 1 ("mgwfbp"), with
        merge=optimal the exact optimum ("optimal")."""
        if self.comm == "mgwfbp":
            return "mgwfbp" if self.merge == "paper" else "optimal"
        return self.comm

    def check(self) -> Options:
        if self.comm not in COMM_MODES:
            raise CommError(f"--comm: expected one of {', '.join(COMM_MODES)}, got "
                            f"{self.comm!r}{_suggest(self.comm, COMM_MODES)}")
        if self.merge not in MERGES:
            raise CommError(f"--merge: expected one of {', '.join(MERGES)}, got {self.merge!r}"
                            f"{_suggest(self.merge, MERGES)}")
        if not self.bucket_mb > 0:
            raise CommError(f"--bucket-mb: must be > 0, got {self.bucket_mb}")
        if self.profile_iters < 2:
            raise CommError(f"profile_iters: must be >= 2 (the first is skipped), got "
                            f"{self.profile_iters}")
        if self.replan_after < 0:
            raise CommError(f"--replan-after: must be >= 0 (0: never), got "
                            f"{self.replan_after}")
        if not self.timeout > 0:
            raise CommError(f"--comm-timeout: must be > 0 seconds, got {self.timeout}")
        if self.check_sync < 0:
            raise CommError(f"--check-sync: must be >= 0, got {self.check_sync}")
        if (self.emulate_network is None) != (self.emulate_nodes is None):
            raise CommError("--emulate-network and --emulate-nodes go together")
        if self.backend not in BACKENDS:
            raise CommError(f"--comm-backend: expected one of {', '.join(BACKENDS)}, got "
                            f"{self.backend!r}")
        if self.backend == "nccl" and self.emulate_network is not None:
            raise CommError("--emulate-network works with the MPI backend only "
                            "(--comm-backend mpi)")
        if self.emulate_nodes is not None and self.emulate_nodes < 1:
            raise CommError(f"--emulate-nodes: must be >= 1, got {self.emulate_nodes}")
        return self


def add_arguments(parser) -> None:
    """The distributed flags of `mgcaffe train` (they override the solver's comm_param)."""
    g = parser.add_argument_group("distributed training (start under mpiexec -n N)")
    g.add_argument("--comm", choices=COMM_MODES, default=None,
                   help="gradient communication: wfbp (one all-reduce per layer), synceasgd "
                        "(one after backward), mgwfbp (merged groups; default), threshold "
                        "(buckets of --bucket-mb)")
    g.add_argument("--merge", choices=MERGES, default=None,
                   help="planner behind --comm=mgwfbp: optimal (exact optimum; default) or "
                        "paper (the paper's Algorithm 1)")
    g.add_argument("--bucket-mb", type=float, default=None, metavar="B",
                   help="bucket size in MB for --comm=threshold (default 25)")
    g.add_argument("--profile", default=None, metavar="P.json",
                   help="layer profile to plan from (default: measured on the first "
                        "iterations)")
    g.add_argument("--network", default=None, metavar="NET.json",
                   help="all-reduce cost a + b*M to plan with (default: measured at start)")
    g.add_argument("--plan", default=None, metavar="PLAN.json",
                   help="use this saved plan (no profiling, no planning)")
    g.add_argument("--save-plan", default=None, metavar="PLAN.json",
                   help="write the plan used (rank 0)")
    g.add_argument("--profile-iters", type=int, default=None, metavar="N",
                   help="iterations timed for the profile (the first is skipped; default 5)")
    g.add_argument("--replan-after", type=int, default=None, metavar="N",
                   help="profile again N iterations after the start-up plan (warm-up over) "
                        "and re-plan once from that profile; 0: never (default 50)")
    g.add_argument("--timeline", default=None, metavar="TRACE.json",
                   help="write a Chrome/Perfetto trace of every rank (rank 0 writes)")
    g.add_argument("--emulate-network", default=None, metavar="NET.json",
                   help="make each gradient all-reduce last at least this network's a + b*M")
    g.add_argument("--emulate-nodes", type=int, default=None, metavar="N",
                   help="number of nodes whose a and b --emulate-network uses")
    g.add_argument("--check-sync", type=int, default=None, metavar="K",
                   help="every K iterations compare weight checksums across ranks")
    g.add_argument("--comm-backend", choices=BACKENDS, default=None,
                   help="gradient all-reduce: nccl (GPU arrays on their own stream), mpi (host "
                        "buffers; GPU gradients staged through them) or auto (default: nccl "
                        "when training on GPUs and every rank can load NCCL)")
    g.add_argument("--comm-timeout", type=float, default=None, metavar="SECONDS",
                   help="a collective making no progress this long ends every rank "
                        "(default 120)")
    g.add_argument("--comm-thread-nice", type=int, default=None, metavar="N",
                   help="nice value of the communication thread, so that it runs as soon as "
                        "it wakes even when backward fills the cores (default -10; lowering "
                        "it needs root or CAP_SYS_NICE, otherwise it is left as it is)")
    g.add_argument("--pack-gradients", action="store_true", default=None,
                   help="copy each group's gradients into a separate buffer to all-reduce "
                        "them (default: one flat gradient buffer, reduced in place; the "
                        "results are bit-identical)")


def _resolve_path(value: str, solver_path: str | None) -> str:
    """A path from the solver file: as given when it exists, else next to the solver file."""
    if not value or os.path.isabs(value) or os.path.exists(value) or not solver_path:
        return value
    alt = os.path.join(os.path.dirname(os.path.abspath(solver_path)), value)
    return alt if os.path.exists(alt) else value


def options_from(args: Any, comm_param: Any = None, solver_path: str | None = None) -> Options:
    """Options from the solver's comm_param, each overridden by its flag when given."""
    o = Options()
    if comm_param is not None:
        o.comm = comm_param.comm
        o.merge = comm_param.merge
        o.bucket_mb = float(comm_param.bucket_mb)
        o.profile_iters = int(comm_param.profile_iters)
        o.timeout = float(comm_param.timeout)
        for name in ("profile", "network", "plan"):
            if comm_param.HasField(name):
                setattr(o, name, _resolve_path(getattr(comm_param, name), solver_path))
    flags = {"comm": "comm", "merge": "merge", "bucket_mb": "bucket_mb", "profile": "profile",
             "network": "network", "plan": "plan", "save_plan": "save_plan",
             "profile_iters": "profile_iters", "replan_after": "replan_after",
             "timeline": "timeline",
             "emulate_network": "emulate_network", "emulate_nodes": "emulate_nodes",
             "check_sync": "check_sync", "comm_timeout": "timeout",
             "comm_backend": "backend", "pack_gradients": "pack_gradients",
             "comm_thread_nice": "thread_nice"}
    for flag, name in flags.items():
        value = getattr(args, flag, None)
        if value is not None:
            setattr(o, name, value)
    return o.check()


def wanted(args: Any, comm: Communicator) -> bool:
    """Whether `mgcaffe train` needs the distributed machinery: several ranks, or one rank
    asked for a trace, an emulated network or a plan."""
    return comm.size > 1 or any(getattr(args, f, None) for f in (
        "timeline", "emulate_network", "plan", "save_plan"))
