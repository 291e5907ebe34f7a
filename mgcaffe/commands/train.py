"""`mgcaffe train`: Caffe's `caffe train`.

    mgcaffe train --solver solver.prototxt [--weights W.caffemodel[,W2]]
                  [--snapshot S.solverstate] [--iterations N] [--gpu ID[,ID...]|all]
                  [--sigint_effect stop|snapshot|none] [--sighup_effect stop|snapshot|none]
                  [--sigterm_effect stop|snapshot|none] [--signal_exit_status 128+N|S]
                  [--level L] [--stage S ...]

SIGINT and SIGHUP only set a flag; the solver acts on it at the end of the iteration
(default: SIGINT stops, after the final snapshot; SIGHUP snapshots and goes on; SIGTERM,
unlike Caffe, writes one snapshot and stops, so a job a scheduler ends can resume). A
training a signal stopped exits with 128 + the signal's number (130, 129, 143: what a shell
reports for a process the signal ended), unlike Caffe's 0, so that a cancelled job is not
counted as finished; `--signal_exit_status 0` gives Caffe's.

`--gpu 0,1,2,3` (or `all`, with several GPUs visible) outside a launcher trains on every
listed GPU, as Caffe's command does: this process starts one rank per GPU under mpiexec and
waits for them (`_gpu_ranks.py`); under a launcher each rank takes its GPU of the list. The
reusable parts are
`build_solver(args, **solver_options)` and `run_training(solver, args, ...)`, which the
distributed trainer wraps.
"""

from __future__ import annotations

import argparse
import logging
import sys

from ..comm.backends.nccl import node_local_rank
from ..comm.training import trainer as distributed
from ..comm.training.options import check_for_world, options_from
from ..cpu import threads
from ..errors import CommError, MgcaffeError, SolverError
from ..formats.outputs import check_output_path
from ..proto import caffe_pb2
from ..solvers import SOLVER_CLASSES, SignalHandler, Solver, SolverAction, load_solver_param
from ..solvers.actions import SHELL_STATUS, exit_status, parse_exit_status, signal_name
from ._engine import cpu_engine, layer_rules
from ._flags import add_device_argument, add_state_arguments, device_from_flag, stages
from ._gpu_ranks import (
    RankReport,
    exit_status_of,
    gpus_to_start,
    is_mgcaffe,
    restart_command,
    run_ranks,
)

NAME = "train"
HELP = "train or finetune a model with a solver (Caffe's `caffe train`)"

log = logging.getLogger("mgcaffe.commands.train")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--solver", metavar="SOLVER.prototxt",
                        help="the solver definition (SolverParameter prototxt)")
    parser.add_argument("--weights", metavar="W.caffemodel[,W2...]",
                        help="finetune from these weights (comma-separated; .caffemodel or "
                             ".caffemodel.h5); not with --snapshot")
    parser.add_argument("--snapshot", metavar="S.solverstate",
                        help="resume training from this solver state; not with --weights")
    parser.add_argument("--iterations", type=int, metavar="N",
                        help="train to N iterations instead of the solver's max_iter")
    add_device_argument(parser)
    for sig, default in (("sigint", SolverAction.STOP), ("sighup", SolverAction.SNAPSHOT)):
        parser.add_argument(f"--{sig}_effect", f"--{sig}-effect", dest=f"{sig}_effect",
                            default=default, choices=SolverAction.CHOICES,
                            help=f"what {sig.upper()} does: stop (after a final snapshot), "
                                 f"snapshot and go on, or none (default: {default})")
    parser.add_argument("--sigterm_effect", "--sigterm-effect", dest="sigterm_effect",
                        default=SolverAction.SNAPSHOT, choices=SolverAction.CHOICES,
                        help="what SIGTERM (a batch scheduler's cancel or pre-emption) does: "
                             "snapshot at the end of the iteration, then stop (default), "
                             "stop as SIGINT does, or none")
    parser.add_argument("--signal_exit_status", "--signal-exit-status",
                        dest="signal_exit_status", default=SHELL_STATUS,
                        type=_exit_status_flag, metavar="128+N|STATUS",
                        help="the exit status after a signal stopped training: 128 + the "
                             "signal's number (default: 130 SIGINT, 129 SIGHUP, 143 SIGTERM, "
                             "as a shell reports them), or this status (0: as Caffe)")
    add_state_arguments(parser)
    threads.add_argument(parser)
    distributed.add_arguments(parser)


def _solver_mode_gpu(args) -> bool:
    """Whether the solver file says solver_mode: GPU (False when there is none to read:
    build_solver then says what is wrong)."""
    if not args.solver:
        return False
    param, _ = load_solver_param(args.solver)
    return param.HasField("solver_mode") and param.solver_mode == caffe_pb2.SolverParameter.GPU


def build_solver(args, **solver_options) -> Solver:
    """The solver `args` describe (the file, --weights, --iterations, --gpu, --level,
    --stage), built with `solver_options` (rank, world_size, gradient_sync, ...)."""
    if not args.solver:
        raise SolverError("need a solver definition to train: --solver SOLVER.prototxt")
    if args.snapshot and args.weights is not None:
        raise SolverError("give --snapshot to resume training or --weights to finetune, "
                          "not both")
    param, path = load_solver_param(args.solver)
    # Caffe's train always sets train_state from --level/--stage; only do it when given, so
    # that a train_state written in the solver file is kept.
    if args.level:
        param.train_state.level = args.level
    if stages(args):
        param.train_state.stage.extend(stages(args))
    if args.iterations is not None:
        if args.iterations < 0:
            raise SolverError(f"--iterations: expected >= 0, found {args.iterations}")
        param.max_iter = args.iterations
    if args.snapshot:
        del param.weights[:]
    elif args.weights is not None:
        if not all(s.strip() for s in args.weights.split(",")):
            raise SolverError(f"--weights {args.weights!r}: an empty file name; give "
                              "W.caffemodel or a comma-separated list of them")
        del param.weights[:]
        param.weights.append(args.weights)
    cls = SOLVER_CLASSES.get(param.type)
    if cls is None:
        raise SolverError(f"{path}: type: expected one of {', '.join(SOLVER_CLASSES)}, "
                          f"found {param.type!r}")
    if "device" not in solver_options:  # a rank's own GPU (distributed) was chosen already
        solver_options["device"] = device_from_flag(args.gpu)
    solver_options.setdefault("rules", layer_rules())
    solver = cls(param, solver_path=path, **solver_options)
    log.info("Use CPU." if solver.device.kind == "cpu" else f"Using GPUs {solver.device.index}")
    return solver


def run_training(solver: Solver, args, action_wrapper=None, handler=None) -> int:
    """Resume (--snapshot) and solve, with the signal flags acting at iteration ends.

    `action_wrapper(action_function) -> action_function` lets the distributed trainer turn
    this process's signal requests into requests agreed by every rank. `handler` is an
    installed SignalHandler to use (one is installed for the run otherwise).
    """
    own = handler is None
    if own:
        handler = SignalHandler(args.sigint_effect, args.sighup_effect,
                                _sigterm_effect(args)).install()
    sync = solver.gradient_sync
    if hasattr(sync, "vote_with"):  # distributed: every rank learns the stopping signal
        sync.vote_with(handler)
    try:
        action = handler.requested_action
        solver.action_function = action_wrapper(action) if action_wrapper else action
        if args.snapshot:
            log.info("Resuming from %s", args.snapshot)
            solver.restore(args.snapshot)
        log.info("Starting Optimization")
        solver.solve()
    finally:
        if own:
            handler.restore()
    signum = getattr(sync, "stop_signal", None) if hasattr(sync, "vote_with") \
        else handler.stop_signal
    if signum is None or not solver.stopped_early:
        return 0
    status = exit_status(signum, getattr(args, "signal_exit_status", SHELL_STATUS))
    if solver.rank == 0:
        log.info("%s", stop_line(solver, signum, status))
    return status


def stop_line(solver: Solver, signum: int, status: int) -> str:
    """One line: the signal that stopped training, the snapshot to resume from, the status."""
    where = f"Stopped by {signal_name(signum)} at iteration {solver.iter}"
    if solver.last_snapshot is None:
        snap = ("no snapshot written (--sigterm_effect snapshot, or snapshot_after_train, "
                "writes one)")
    else:
        state = solver.last_snapshot[1]
        at = "" if solver.snapshot_iter == solver.iter else \
            f" (iteration {solver.snapshot_iter}: none written at the stop)"
        snap = f"resume with --snapshot {state}{at}"
    return f"{where}; {snap}; exit status {status}"


def _exit_status_flag(text: str):
    try:
        return parse_exit_status(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _sigterm_effect(args) -> str:
    """--sigterm_effect (callers that build args without it get the default)."""
    return getattr(args, "sigterm_effect", SolverAction.SNAPSHOT)


def check_output_paths(args) -> None:
    """The files flags ask for (written at the end) must be writable now."""

    for flag in ("timeline", "save_plan"):
        check_output_path(getattr(args, flag, None), "--" + flag.replace("_", "-"), CommError)


def check_plan_will_be_made(training, solver) -> None:
    """--save-plan when the plan is made from a profile the run cannot finish measuring."""
    o = training.options
    if o.save_plan and not (o.plan or o.profile) and \
            solver.param.max_iter - solver.iter < o.profile_iters:
        raise CommError(f"--save-plan {o.save_plan}: the plan is made after profiling "
                        f"{o.profile_iters} iterations, but this run trains "
                        f"{solver.param.max_iter - solver.iter}; train longer, lower "
                        "comm_param.profile_iters (>= 2), or give --profile")


def check_comm_settings(args, solver, rank: int, size: int) -> None:
    """The distributed flags and the solver's comm_param, checked on every run (one process
    too: a typo in comm_param must not pass because no launcher was used); rank 0 logs what
    deserves a warning (deprecated spellings, a plan made for another number of nodes)."""
    param = solver.param
    options = options_from(args, param.comm_param if param.HasField("comm_param") else None,
                           getattr(solver, "solver_path", None))
    for line in check_for_world(options, size):
        if rank == 0:
            log.warning("%s", line)


def run(args) -> int:
    try:
        handler = SignalHandler(args.sigint_effect, args.sighup_effect, _sigterm_effect(args))
    except ValueError as exc:
        raise MgcaffeError(str(exc)) from None
    gpus = gpus_to_start(args.gpu)
    if gpus is not None:  # --gpu 0,1,2,3 outside a launcher: one rank per GPU, started here
        return _start_ranks(args, gpus)
    # Under mpiexec: rank and size before the solver (data sharding), every rank ended on
    # any rank's failure, gradients averaged by the communication thread (docs/distributed.md).
    # A Ctrl-C from here to the handler's install is recorded, and the handler takes it: a
    # KeyboardInterrupt in between ended one rank alone and left the others waiting.
    comm, rank, size = distributed.world(getattr(args, "log_level", "INFO"),
                                         startup_timeout=getattr(args, "comm_timeout", None),
                                         keep_deferred=True)
    report = RankReport(rank)  # for the process that started this job, if one did
    try:
        return report.ended(_train(args, handler, comm, rank, size))
    except BaseException as exc:
        report.ended(exit_status_of(exc))
        raise


def _start_ranks(args, gpus: list[int]) -> int:
    """Run this command again as one rank per GPU of `gpus` (under mpiexec); the job's
    exit status."""
    flag = f"--gpu {args.gpu}"
    if not args.solver:
        raise SolverError("need a solver definition to train: --solver SOLVER.prototxt")
    load_solver_param(args.solver)  # a wrong file is one line here, not one per rank
    command = restart_command(sys.argv[1:], is_mgcaffe)
    if command is None:
        raise SolverError(f"{flag}: one rank per GPU is started by running the `mgcaffe` "
                          f"program again, and this process was not started as that "
                          f"program; run `mgcaffe train ... {flag}`, or start the ranks "
                          f"with mpiexec -n {len(gpus)}")
    return run_ranks(gpus, command)


def _train(args, handler, comm, rank: int, size: int) -> int:
    """Training itself, in this process (alone, or as one rank of a launched job)."""
    # before any net is built; the ranks on this node, where no launcher variable says, by
    # a shared-memory split of the world (a collective: every rank passes it)
    cpu = cpu_engine(getattr(args, "threads", None),
                     (lambda: node_local_rank(comm)[1]) if size > 1 else None)
    with handler, distributed.failing_together(comm):
        if rank == 0:  # the rank that writes them; before hours of training, not after
            check_output_paths(args)
        # several ranks on GPUs (--gpu, or the solver file's solver_mode: GPU): each takes
        # its own GPU of the node, as the launcher bound them
        device = distributed.rank_device(comm, args.gpu, size > 1 and _solver_mode_gpu(args))
        own_gpu = {} if device is None else {"device": device}
        solver = build_solver(args, rank=rank, world_size=size, cpu=cpu, **own_gpu)
        try:
            check_comm_settings(args, solver, rank, size)
            if not distributed.wanted(args, comm):
                return run_training(solver, args, handler=handler)
            with distributed.attach(solver, args, comm) as training:
                check_plan_will_be_made(training, solver)
                status = run_training(solver, args, handler=handler)
                if training.options.save_plan and training.plan is None and rank == 0:
                    log.warning("--save-plan %s: no plan was made (training ended at "
                                "iteration %d, before profiling finished); nothing written",
                                training.options.save_plan, solver.iter)
                return status
        finally:
            solver.close()
