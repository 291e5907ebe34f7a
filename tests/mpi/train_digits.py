"""Distributed training as `mgcaffe train` wires it, for tests (run under mpiexec or alone).

    mpiexec -n 2 python tests/mpi/train_digits.py --solver S.prototxt --comm wfbp \\
        --dump-weights OUT [--fail-at ITER --fail-rank R] [any distributed flag]

After training, every rank writes its learnable weights to OUT.rank<R>.npz. `--fail-at`
makes rank R raise inside the solver at that iteration (through an iteration hook), the
"exception in a rank" fault case on a real net; `--fail-how` picks another fault (SIGKILL,
SIGINT, SIGTERM, SIGSTOP 0.3 s later, NaN weights, sys.exit(0), rank 0's snapshots taking
`--fail-seconds`; in the forward and backward of that iteration: os._exit(0) before a
layer's forward, SIGSTOP `--fail-seconds` into a layer's backward). `--solver-rank1` gives
rank 1 another solver (ranks that disagree),
`--stop-before-init R` stops rank R before MPI is initialised, `--slow-first-layer S` sleeps
S seconds before the input-most learnable layer's backward (room for the overlap to show).
The wiring is that of `run` in mgcaffe/commands/train.py (keep the two in step), plus the
test hooks.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

import numpy as np

from mgcaffe.comm.training import trainer as distributed
from mgcaffe.commands.train import add_arguments, build_solver, run_training


class FailAt:
    """An iteration hook that raises (or kills its process) on one rank at one iteration."""

    def __init__(self, iteration, rank, how, seconds=0.0):
        self.iteration, self.rank, self.how, self.seconds = iteration, rank, how, seconds

    def after_iteration(self, solver):
        if solver.iter == self.iteration and solver.rank == self.rank:
            print(f"FAULT {self.how} rank {solver.rank} iteration {solver.iter}", flush=True)
            if self.how == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.how in ("sigint", "sigterm"):
                os.kill(os.getpid(), getattr(signal, self.how.upper()))
                return
            if self.how == "sigstop":  # a moment later: while rank 0 tests (test_interval)
                threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGSTOP)).start()
                return
            if self.how == "exit0":  # a user hook leaving early with status 0
                sys.exit(0)
            if self.how == "slow-snapshot":  # rank 0's next snapshots outlast the timeout
                write = solver.snapshot

                def slow():
                    time.sleep(self.seconds)
                    return write()

                solver.snapshot = slow
                return
            if self.how == "nan":  # this rank's next loss and gradients are not finite
                solver.net.learnable_params[0].data[...] = np.nan
                return
            raise RuntimeError(f"injected failure at iteration {solver.iter}")


def fail_inside_the_pass(solver, iteration, rank, how, seconds):
    """os._exit(0) before the forward of the last layer (as a Python layer or a library
    might), or SIGSTOP `seconds` after the backward of the last layer starts, in the
    iteration `iteration` of rank `rank`."""
    net, last = solver.net, len(solver.net.layers) - 1

    def here(i):
        if i != last or solver.iter != iteration or solver.rank != rank:
            return
        print(f"FAULT {how} rank {rank} iteration {iteration}", flush=True)
        if how == "os-exit0":
            os._exit(0)
        time.sleep(seconds)  # heartbeats go out meanwhile: the others know where it is
        os.kill(os.getpid(), signal.SIGSTOP)

    (net.before_forward if how == "os-exit0" else net.before_backward)(here)


def slow_before_first_learnable(net, seconds):
    """Sleep before the input-most learnable layer's backward: the gradients of the layers
    after it are ready by then, so a wait-free all-reduce has `seconds` to start (sleeping
    lets go of the GIL, so a loaded machine still gets the thread going)."""
    first = min(i for i, layer in enumerate(net.layers) if layer.blobs)
    net.before_backward(lambda i: time.sleep(seconds) if i == first else None)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-level", default="INFO")
    add_arguments(parser)  # mgcaffe train's flags, the distributed ones included
    parser.add_argument("--dump-weights", default=None)
    parser.add_argument("--fail-at", type=int, default=None)
    parser.add_argument("--fail-rank", type=int, default=1)
    parser.add_argument("--fail-how", default="raise",
                        choices=["raise", "sigkill", "sigint", "nan", "sigterm", "sigstop",
                                 "exit0", "slow-snapshot", "os-exit0", "sigstop-backward"])
    parser.add_argument("--fail-seconds", type=float, default=5.0,
                        help="how long each of rank 0's snapshots takes (slow-snapshot)")
    parser.add_argument("--solver-rank1", default=None,
                        help="rank 1 trains with this solver instead (ranks that disagree)")
    parser.add_argument("--stop-before-init", type=int, default=None, metavar="RANK",
                        help="this rank stops itself (SIGSTOP) before MPI is initialised")
    parser.add_argument("--slow-first-layer", type=float, default=0.0, metavar="SECONDS",
                        help="sleep before the input-most learnable layer's backward")
    args = parser.parse_args()

    if args.stop_before_init is not None and \
            os.environ.get("PMI_RANK") == str(args.stop_before_init):
        print(f"FAULT stop rank {args.stop_before_init} before MPI_Init", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    comm, rank, size = distributed.world(args.log_level, startup_timeout=args.comm_timeout)
    if rank == 1 and args.solver_rank1:
        args.solver = args.solver_rank1
    with distributed.failing_together(comm):
        solver = build_solver(args, rank=rank, world_size=size)
        if args.slow_first_layer:
            slow_before_first_learnable(solver.net, args.slow_first_layer)
        if args.fail_at is not None and args.fail_how in ("os-exit0", "sigstop-backward"):
            fail_inside_the_pass(solver, args.fail_at, args.fail_rank, args.fail_how,
                                 args.fail_seconds)
        elif args.fail_at is not None:
            solver.iteration_hooks.append(FailAt(args.fail_at, args.fail_rank, args.fail_how,
                                                   args.fail_seconds))
        with distributed.attach(solver, args, comm):
            status = run_training(solver, args)
        if args.dump_weights:
            np.savez(f"{args.dump_weights}.rank{rank}.npz",
                     *[np.asarray(b.data) for b in solver.net.learnable_params])
    print(f"DONE rank {rank} iter {solver.iter} status {status}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
