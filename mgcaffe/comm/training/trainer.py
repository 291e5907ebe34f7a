"""Distributed synchronous SGD: start-up, the plan, and the per-iteration agreements.

How `mgcaffe train` uses it (see docs/distributed.md):

    comm, rank, size = world(args.log_level)          # before the solver: data sharding
    with failing_together(comm):                      # an exception on any rank ends all
        solver = build_solver(args, rank=rank, world_size=size)
        with attach(solver, args, comm):              # gradient_sync + iteration hook
            run_training(solver, args)

`attach` (a collective):
0. starts the heartbeats that judge liveness by progress (progress.py) and checks that every
   rank holds the same net layout, batch sizes, solver and comm settings (agreement.py);
1. broadcasts rank 0's parameters (every blob of every layer) so all ranks start identical;
2. gets T_ar(M) = a + b*M: `--network` (a fit or a formula for N), else the emulated network,
   else an all-reduce benchmark over sizes from 4 bytes to the whole gradient, fitted by least
   squares (logged with its residual);
3. gets the plan: `--plan` (each rank reads it), or made on rank 0 from `--profile`, or from a
   profile measured on the first `profile_iters` training iterations (communicating the whole
   gradient after backward meanwhile, so backward is timed undisturbed), then broadcast; every
   rank compares the plan's digest and its learnable layers with every other rank's, and any
   difference stops every rank with a message naming the rank and what differs; a measured
   plan is re-made once after warm-up (`replan_after` iterations later) from a second,
   longer profile, and every rank switches to it between the same two iterations;
4. starts the communication thread (`GradientExecutor`) and hooks into the solver.

Each iteration every rank then OR-s its stop/snapshot requests with the others' (one tiny
all-reduce), so all stop or snapshot at the same iteration, and every `--check-sync K`
iterations compares checksums of the learnable weights.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import time
from contextlib import contextmanager
from typing import Any

import numpy as np

from ... import _launch
from ...backend import Device, _import_cupy, to_host
from ...errors import CommError, MgcaffeError
from ...log import configure
from ..backends.communicator import Communicator
from ..backends.emulate import EmulatedCommunicator
from ..backends.launcher import check_world, launcher_size
from ..backends.local import SingleCommunicator
from ..backends.mpi import MpiCommunicator, launched_by_mpi
from ..backends.nccl import NcclCommunicator, _import_nccl, node_local_rank, select_gpu
from ..backends.startup_deadline import DEFAULT_STARTUP_TIMEOUT, StartupDeadline
from ..model.cost import CostModel, cost_for, load_network
from ..model.planner import Plan, load_plan, make_plan, timeline
from ..model.profile import load_profile
from ..runtime.executor import GradientExecutor
from ..runtime.timing import (
    NetTimer,
    OnlineProfile,
    as_profile,
    median_profile,
    per_iteration_slowest,
)
from ..runtime.trace import COMPUTE, Tracer, merge_traces, save_trace
from .agreement import agree_on_settings, settings_of
from .benchmark import measure_allreduce
from .faults import ABORT_EXCEPTION, Watchdog, check_in_sync, fail_all
from .insitu import InSitu, estimate, estimate_comm, last_arrivals, layer_overlaps
from .interference import interference_sizes, measure_interference
from .liveness import describe_rank_map, rank_map, start_liveness
from .options import COMM_MODES, MERGES, Options, add_arguments, options_from, wanted
from .startup import (
    agree_on_layers_and_plan,
    benchmark_sizes,
    broadcast_parameters,
    check_plan_sizes,
    describe_plan,
    describe_profile,
    learnable_summary,
    synceasgd_groups,
)

# options and start-up pieces are re-exported: `distributed` is the module callers use
__all__ = ["COMM_MODES", "MERGES", "DistributedTraining", "Options", "add_arguments",
           "agree_on_layers_and_plan", "attach", "benchmark_sizes", "failing_together",
           "options_from", "rank_device", "wanted", "world"]

log = logging.getLogger("mgcaffe.comm")

_SOLVER_ACTION_NONE, _STOP, _SNAPSHOT = "none", "stop", "snapshot"  # SolverAction values
PROFILE_EXTENSION = 4  # profiling may run up to this many times profile_iters while drifting


def world(log_level: str | None = "INFO", *, mpi_wait: str = "poll",
          startup_timeout: float | None = None,
          keep_deferred: bool = False) -> tuple[Communicator, int, int]:
    """(communicator, rank, size) of this process: MPI when a launcher started it, else a
    world of one rank without touching MPI. With `log_level`, logging is configured so that
    only rank 0 logs below WARNING and every other rank's lines carry its rank. `mpi_wait`:
    how MPI all-reduces wait ("poll" or "block", see MpiCommunicator). Under a launcher,
    MPI's start-up and the exchange of the rank map (rank 0 logs it) must end within
    `startup_timeout` seconds (default 120), or this process ends with a message.
    `keep_deferred`: a Ctrl-C after start-up stays recorded (`_launch.take_pending()`) for
    the SignalHandler the caller installs next, instead of raising KeyboardInterrupt: a rank
    interrupted between the two would leave alone, and the others wait for it."""
    if not (launched_by_mpi() or launcher_size() is not None):
        comm: Communicator = SingleCommunicator()
        return comm, comm.rank, comm.size
    _launch.defer()  # a Ctrl-C from here on stops every rank together, after start-up
    # armed before MPI_Init: a peer stopped before it would block this process there
    with StartupDeadline(startup_timeout or DEFAULT_STARTUP_TIMEOUT):
        comm = MpiCommunicator(wait=mpi_wait)
        check_world(comm.size, comm.library)  # a launcher of another MPI: N lone trainings
        if log_level is not None and comm.size > 1:
            configure(log_level, rank=comm.rank, world_size=comm.size)
        if comm.size > 1:
            ranks = rank_map(comm)
            if comm.rank == 0:
                log.info("%s", describe_rank_map(ranks))
        if any(comm.allgather(_launch.pending())):  # a Ctrl-C while the ranks started
            _launch.take_pending()
            print(_launch.LINE, file=sys.stderr, flush=True)
            raise SystemExit(0)  # on every rank: MPI_Finalize at exit, as a normal end
    if not keep_deferred:
        _launch.resume()
    return comm, comm.rank, comm.size


def rank_device(comm: Communicator, gpu_flag: str | None = None) -> Device:
    """The GPU of this rank when several ranks train on GPUs: the i-th of the node's GPUs for
    the node's i-th rank. `gpu_flag` is `--gpu`: a list of ids ("0,1,2,3") or "all"."""

    ids = None
    if gpu_flag not in (None, "", "all"):
        try:
            ids = [int(x) for x in str(gpu_flag).split(",") if x.strip()]
        except ValueError:
            raise CommError(f"--gpu: expected ids or `all`, found {gpu_flag!r}") from None
    count = _import_cupy().cuda.runtime.getDeviceCount()
    local_rank, local_size = node_local_rank(comm)
    return Device("gpu", select_gpu(local_rank, local_size, count, ids, comm.rank))


def flatten_gradients(net: Any) -> None:
    """Lay the reduced parameter diffs out as one buffer in the executor's order (unless the
    net already is), so that every planned group is one slice all-reduced in place."""
    flatten = getattr(net, "flatten_param_diffs", None)
    if flatten is None:  # a net without the method: the executor packs
        return
    if tuple(net.flat_param_ids) != tuple(net.reduced_param_ids()):
        flatten()


def describe_gradient_buffer(executor: GradientExecutor) -> str:
    """One log line: whether the gradients are all-reduced in place or packed."""
    n, in_place = len(executor.groups), executor.in_place_groups
    if in_place == n:
        return ("Gradients are all-reduced in place, group by group, in the net's flat "
                "gradient buffer (no copies)")
    return (f"Gradients: {n - in_place} of {n} group(s) are packed into a "
            f"{executor.buffer.nbytes / 1e6:.1f} MB buffer to be all-reduced "
            f"({executor.mode} path)")


@contextmanager
def failing_together(comm: Communicator):
    """Any exception inside ends every rank: logged with this rank, then MPI_Abort. So does
    a SystemExit (a hook calling sys.exit(0)): a rank that leaves before the others fails
    the job, saying which."""
    try:
        yield comm
    except SystemExit as exc:
        if comm.size > 1:
            log.error("rank %d (pid %d): ended before the others (sys.exit(%r)); aborting all "
                      "%d ranks", comm.rank, os.getpid(), exc.code, comm.size)
            comm.abort(ABORT_EXCEPTION)
        raise
    except BaseException as exc:
        if comm.size > 1 and not isinstance(exc, GeneratorExit):
            fail_all(comm, exc, ABORT_EXCEPTION)
        raise


# ----------------------------------------------------------------------------- training
class DistributedTraining:
    """The solver's gradient_sync and iteration hook for one rank (build it with `attach`).

    gradient_sync: `on_learnable_done(k)`, `wait()`. Iteration hook: `before_iteration`,
    `after_iteration`, `should_stop`. `close()` (a collective) stops the thread, writes the
    trace and logs the measured iteration time beside the plan's prediction.

    MPI requires every rank to issue collectives on a communicator in the same order. The
    main thread's collectives (barrier, agreements, plan broadcast, check-sync) all happen
    between `wait()` returning and the next backward, when the communication thread has
    nothing in flight, so the two threads never interleave theirs."""

    def __init__(self, solver: Any, comm: Communicator, options: Options):
        self.solver = solver
        self.base_comm = comm
        self.options = o = options
        self.rank, self.size = comm.rank, comm.size
        net = solver.net
        self.net = net
        self.names, self.counts = learnable_summary(net)
        self.clock = time.perf_counter
        self.closed = False
        self.watchdog = Watchdog(comm, o.timeout) if comm.size > 1 else None
        self.liveness = None
        if self.watchdog is not None:
            with self._guard("exchange of heartbeat addresses"):
                self.liveness = start_liveness(comm, o.timeout, busy_limit=o.test_timeout)
            self.watchdog.liveness = self.liveness
        # Before any collective whose shape depends on them (the NCCL choice, the broadcast).
        with self._guard("agreement on the solver, net and distributed settings"):
            agree_on_settings(comm, settings_of(solver, o))
        self.tracer = Tracer(comm.rank) if o.timeline else None
        self.comm = self._communicator()

        if self.rank == 0:
            log.info("Distributed training: %d rank(s) (%s), comm=%s%s", self.size,
                     getattr(comm, "library", comm.name), o.comm,
                     f" merge={o.merge}" if o.comm == "mgwfbp" else
                     f" bucket={o.bucket_mb} MB" if o.comm == "threshold" else "")
        with self._guard("broadcast of rank 0's parameters"):
            sent = broadcast_parameters(comm, net)
        if self.rank == 0 and self.size > 1:
            log.info("Broadcast rank 0's parameters to every rank (%.2f MB)", sent / 1e6)

        self.cost = self._cost_model()
        self.plan: Any = None
        self.profile_dict: dict | None = None
        self.profiler: OnlineProfile | None = None
        self._profiled_iters = 0
        self._replan_at: int | None = None  # iteration at which the re-plan's profile starts
        self._replanning = False  # the current profile is the re-plan's (after warm-up)
        self.plan_switches: list[tuple[int, str]] = []  # (iteration, digest), every rank
        self.startup_prediction: float | None = None  # the start-up plan's, once re-planned
        self.median_prediction: float | None = None  # median of the plan's per-iteration times
        self._in_situ: dict | None = None  # the re-plan window's two kinds of iterations
        self.insitu: Any = None  # the in-situ rho (insitu.InSitu) once measured
        self.probe_interference: tuple = ()  # the start-up probe's points, once replaced
        self.comm_slowdown: float | None = None  # in situ: all-reduce time / (a + b*M)
        self.insitu_comm: Any = None  # the in-situ sigma (insitu.CommInSitu) once measured
        provisional = self._initial_plan()
        with self._guard("agreement on the plan and the learnable layers"):
            agree_on_layers_and_plan(comm, self.names, self.counts, provisional)
        # On a GPU, layer times need the device to finish first (kernels are asynchronous).
        self._sync = None if net.xp is np else net.xp.cuda.get_current_stream().synchronize
        self.timer = NetTimer(net, self.tracer, synchronize=self._sync)
        if self.tracer is not None or self.profiler is not None:
            self.timer.install()
        if not o.pack_gradients:
            flatten_gradients(net)
        self.executor = GradientExecutor.from_net(net, provisional, self.comm,
                                                  timeout=o.timeout, tracer=self.tracer,
                                                  watchdog=self.watchdog,
                                                  in_place=not o.pack_gradients,
                                                  thread_nice=o.thread_nice)
        if self.rank == 0:
            log.info("%s", describe_gradient_buffer(self.executor))
            if o.thread_nice is not None:
                log.info("Communication thread %s", f"at nice {o.thread_nice}"
                         if self.executor.favoured else f"left at its priority (nice "
                         f"{o.thread_nice} needs root or CAP_SYS_NICE): its wake-ups may "
                         f"wait for backward's time slice on busy cores")
        self._ready: dict[int, float] = {}
        self._t_start = 0.0
        self._t_grads = 0.0
        self.grad_times: list[float] = []  # forward start -> reduced gradients, per iteration
        self.iteration_times: list[float] = []
        self._agreed = _SOLVER_ACTION_NONE
        self._stop = False
        self._local_action = None
        self._agreed_fn = self._agreed_action  # one bound method, compared by identity
        solver.gradient_sync = self
        solver.iteration_hooks.append(self)
        with self._guard("start barrier"):
            comm.barrier()
        if self.liveness is not None:
            self.liveness.busy(True)  # until the first iteration: rank 0's initial test
        if self.tracer is not None:
            self.tracer.set_origin()

    # ------------------------------------------------------------------ set-up pieces
    @contextmanager
    def _guard(self, what: str, timeout: float | None = None):
        if self.watchdog is None:
            yield
        else:
            with self.watchdog.guard(what, timeout):
                yield

    def _communicator(self) -> Communicator:
        """The gradient all-reduce's communicator: NCCL, MPI, or MPI under emulation."""
        o = self.options
        if self._use_nccl():

            nccl = NcclCommunicator(self.base_comm, timeout=o.timeout)
            device = self.solver.device
            if device.index != nccl.device_id:
                raise CommError(f"rank {self.rank}: the solver runs on GPU {device.index} but "
                                f"this rank's GPU is {nccl.device_id} (local rank "
                                f"{nccl.local_rank}): build the solver on rank_device(comm)")
            if self.rank == 0:
                log.info("Gradients all-reduced with NCCL on each GPU's own stream")
            return nccl
        if o.emulate_network is None:
            return self.base_comm

        cost = cost_for(load_network(o.emulate_network), o.emulate_nodes)
        emulated = EmulatedCommunicator(self.base_comm, cost, o.emulate_nodes)
        if self.rank == 0:
            log.warning("%s [from %s]", emulated.describe(), o.emulate_network)
        self.emulated_cost = cost
        return emulated

    def _use_nccl(self) -> bool:
        """--comm-backend nccl, or auto on GPUs when EVERY rank can load NCCL (agreed, so
        that no rank waits in an NCCL set-up the others skip)."""
        o = self.options
        on_gpu = getattr(self.solver.device, "kind", "cpu") == "gpu"
        if o.backend == "mpi" or (o.backend == "auto" and (not on_gpu or o.emulate_network)):
            return False
        if not on_gpu:
            raise CommError(f"rank {self.rank}: --comm-backend nccl needs the solver on a GPU "
                            f"(--gpu)")
        try:

            _import_nccl(self.rank)
            problem = None
        except CommError as exc:
            problem = exc
        with self._guard("agreement on the NCCL backend"):
            missing = self.base_comm.any_true([problem is not None])[0]
        if not missing:
            return True
        if o.backend == "nccl":
            raise problem or CommError(f"rank {self.rank}: another rank cannot load NCCL")
        if self.rank == 0:
            log.warning("NCCL is not usable on every rank (%s): GPU gradients go through host "
                        "buffers over MPI", problem or "see the other ranks' logs")
        return False

    def _cost_model(self):
        """T_ar for this run: --network, else the emulated network, else measured."""

        o = self.options
        nodes = o.emulate_nodes or self.size
        if o.network:
            cost = cost_for(load_network(o.network), nodes)
            origin = f"{o.network} ({cost.origin}, N={nodes})"
        elif o.emulate_network:
            cost, origin = self.emulated_cost, f"emulated {o.emulate_network} (N={nodes})"
        elif self.size == 1:
            cost, origin = CostModel(0.0, 0.0, nodes=1), "one rank: no communication"
        elif o.plan:
            return None  # the plan carries its own a and b
        else:

            sizes = benchmark_sizes(4 * sum(self.counts))
            with self._guard("all-reduce benchmark"):
                bench = measure_allreduce(self.base_comm, sizes, iterations=10)
            cost = bench.fit
            origin = (f"measured all-reduce of {len(sizes)} sizes from {sizes[0]} B to "
                      f"{sizes[-1] / 1e6:.1f} MB; {bench.describe_fit().split('; ', 1)[1]}")
            if self.rank == 0:
                log.info("All-reduce benchmark among %d ranks:\n%s", self.size, bench.table())
                if bench.warning():
                    log.warning("%s", bench.warning())
            cost = self._with_interference(cost)
        if self.rank == 0:
            log.info("All-reduce cost T(M) = a + b*M: a = %.3f us, b = %.4f ns/byte [%s]",
                     cost.a * 1e6, cost.b * 1e9, origin)
        return cost

    def _with_interference(self, cost):
        """`cost` with the measured slowdown of computation while an all-reduce is in flight
        (the planner's extended model; see mgcaffe.comm.training.interference)."""

        points = []
        for m in interference_sizes(4 * sum(self.counts)):
            # a few fixed-length rounds per size: a deadline of its own, not the comm timeout
            with self._guard(f"interference measurement at {m} bytes",
                             max(self.options.timeout, 20.0)):
                points += measure_interference(self.base_comm, cost, [m])
        if self.rank == 0:
            log.info("Computation slows while an all-reduce is in flight: %s",
                     ", ".join(f"{m / 1e6:.3g} MB +{rho * 100:.0f}%" for m, rho in points))
        return cost.with_interference(points)

    def _initial_plan(self):
        """The plan to start with: final (--plan, --profile) or provisional (profiling)."""
        o = self.options
        if o.plan:

            plan = load_plan(o.plan)
            check_plan_sizes(plan, self.names, self.counts, self.net.dtype.itemsize, o.plan)
            self._adopt(plan, f"read from {o.plan}")
            return plan
        if o.profile:

            plan = self._make_and_share(lambda: load_profile(o.profile), f"from {o.profile}")
            return plan
        self.profiler = OnlineProfile(self.net.name, self.names, self.counts, skip=1)
        if self.rank == 0:
            log.info("Profiling the first %d iterations (the first one is not counted; up to "
                     "%d while the times still drift); meanwhile all gradients go in one "
                     "all-reduce after backward", self.options.profile_iters,
                     PROFILE_EXTENSION * self.options.profile_iters)
        return synceasgd_groups(self.names)

    def _make_and_share(self, get_profile, where: str):
        """Rank 0 plans from get_profile(); every rank receives the plan (a collective)."""

        o = self.options
        payload = None
        if self.rank == 0:
            try:
                profile = get_profile()
                plan = make_plan(profile, self.cost, o.scheme,
                                 int(o.bucket_mb * (1 << 20)) if o.comm == "threshold" else None,
                                 nodes=o.emulate_nodes or self.size)
                if not plan.exact:
                    log.warning("Plan %s: the optimal search was cut (too many states): the "
                                "plan is not proven optimal under the model", where)
                payload = ("ok", plan.to_dict(), profile.to_dict())
            except MgcaffeError as exc:  # every rank must learn why, not wait for a plan
                payload = ("error", str(exc), None)
        with self._guard("broadcast of the plan"):
            status, body, profile_dict = self.base_comm.broadcast(payload, root=0)
        if status == "error":
            raise CommError(f"rank {self.rank}: rank 0 could not plan: {body}")
        plan = Plan.from_dict(body, source="plan from rank 0")
        self.profile_dict = profile_dict
        if self.rank == 0:
            log.info("%s", describe_profile(profile_dict, where))
        self._adopt(plan, where)
        return plan

    def _adopt(self, plan: Any, where: str) -> None:
        self.plan = plan
        if self.rank == 0:
            log.info("Using %s\n%s", where, describe_plan(plan))
            if self.options.save_plan:
                plan.save(self.options.save_plan)
                log.info("Wrote the plan to %s", self.options.save_plan)

    # ------------------------------------------------------------------ gradient_sync
    def on_learnable_done(self, k: int) -> None:
        """Learnable layer k's gradient is ready: note the time, hand k to the thread."""
        if self._sync is not None and self.profiler is not None:
            self._sync()  # profiling on a GPU: the time the gradient is computed, not queued
        self._ready[k] = self.clock()
        self.executor.on_learnable_done(k)

    def wait(self) -> None:
        """Block until every group of the iteration is reduced (averaged over ranks)."""
        self.executor.wait()
        self._t_grads = self.clock()

    # ------------------------------------------------------------------ iteration hook
    def before_iteration(self, solver: Any) -> None:
        if self.liveness is not None:
            self.liveness.busy(False)
            self.liveness.tick()
        if solver.action_function is not self._agreed_fn:
            # Signals act only once every rank agrees (after_iteration); run_training's
            # handler becomes this rank's vote.
            self._local_action = solver.action_function
            solver.action_function = self._agreed_fn
        p = solver.param
        if (self.size > 1 and p.test_interval and solver.iter % p.test_interval == 0
                and (solver.iter > 0 or p.test_initialization)):
            # Rank 0 has just tested (alone); wait for it here. With heartbeats the deadline
            # is the comm timeout after rank 0's last progress (it counts its test batches);
            # without, a generous fixed one.
            with self._guard(f"waiting for rank 0's test at iteration {solver.iter}",
                             None if self.liveness is not None else
                             max(self.options.test_timeout, self.options.timeout)):
                self.base_comm.barrier()
        if self.tracer is not None:
            self.tracer.iteration = solver.iter
        self._ready.clear()
        self._t_start = self.clock()

    def after_iteration(self, solver: Any) -> None:
        t_end = self.clock()
        it = solver.iter  # already counts this update
        if self.tracer is not None:
            self.tracer.span(f"iteration {it - 1}", "iteration", COMPUTE, self._t_start, t_end)
        if self.plan is not None and self.profiler is None:
            self.grad_times.append(self._t_grads - self._t_start)
            self.iteration_times.append(t_end - self._t_start)
        if self.profiler is not None:
            self._profile_step()
        elif self._replan_at is not None and it >= self._replan_at:
            self._start_replan_profile()
        self._agree_on_requests()
        k = self.options.check_sync
        if k and it % k == 0 and self.size > 1:
            with self._guard(f"weight check at iteration {it}"):
                check_in_sync(self.base_comm,
                              [to_host(b.data) for b in self.net.learnable_params], it)

    def _profile_step(self) -> None:
        prof = self.profiler
        overlapped = self._in_situ is not None and self._profiled_iters % 2 == 1
        self._profiled_iters += 1  # counted alike on every rank: the switch is a collective
        if overlapped:
            self._add_overlapped()
        elif len(self._ready) == len(self.names):
            prof.add(self.timer.forward_start, self.timer.forward_end, self._ready)
        if self._in_situ is not None:  # the next iteration's kind: odd ones overlap
            n = self._profiled_iters
            kinds = self._in_situ["overlapped"]
            self.executor.set_plan(kinds[(n // 2) % len(kinds)] if n % 2 == 1
                                   else synceasgd_groups(self.names))
        wanted_iters = self.options.profile_iters
        if self._replanning:  # after warm-up: a fixed, longer window for a stable median
            wanted_iters = PROFILE_EXTENSION * self.options.profile_iters
        if self._profiled_iters < wanted_iters:
            return
        if not self._replanning and self._profiled_iters < PROFILE_EXTENSION * wanted_iters:
            # Warm-up may outlast the first iterations: go on (all ranks alike) while any
            # rank's older and newer samples disagree, then plan from the newest ones.
            with self._guard("agreement on the profile's stability"):
                drifting = self.base_comm.any_true([not prof.stable()])[0]
            if drifting:
                return
        if not len(prof):
            raise CommError(f"rank {self.rank}: no complete profile in {self._profiled_iters} "
                            f"iterations (the backward hook did not report every layer)")
        recent = max(1, wanted_iters - 1)  # the first of a phase is skipped
        if self.rank == 0:
            log.info("%s", prof.describe_spread(recent))
        if self._in_situ is not None:
            self._adopt_in_situ_rho()
        self.profiler = None
        if self.tracer is None:
            self.timer.remove()
        it = self.solver.iter
        first = it - self._profiled_iters
        # The step waits for the slowest rank: plan with the latest ready time of each layer,
        # iteration by iteration.
        with self._guard("gathering the ranks' profiles"):
            steps = per_iteration_slowest(self.base_comm.allgather(prof.window(recent)))
        before = self.plan
        where = (f"median profile of the last {min(recent, len(prof))} of "
                 f"{self._profiled_iters} iteration(s) ({first}-{it - 1}), slowest of "
                 f"{self.size} rank(s)")
        plan = self._make_and_share(lambda: median_profile(
                                        steps, self.net.name, self.names, self.counts),
                                    f"re-plan after warm-up, {where}" if self._replanning
                                    else where)
        with self._guard("agreement on the plan and the learnable layers"):
            agree_on_layers_and_plan(self.base_comm, self.names, self.counts, plan, it)
        # Switched here, between iterations, on every rank alike (the agreement above
        # compared the iteration): the next iteration communicates by the new plan.
        self.executor.set_plan(plan)
        before_median = self.median_prediction
        self.median_prediction = self._median_prediction(plan, steps)
        self.plan_switches.append((it, plan.digest()))
        self.grad_times.clear()  # measured against this plan's prediction from here on
        self.iteration_times.clear()
        if self._replanning:
            self._replanning = False
            self.startup_prediction = before_median
            if self.rank == 0:
                log.info("Re-planned at iteration %d: predicted iteration %.2f ms (the "
                         "start-up profile predicted %.2f ms); plan %s %s the start-up plan's "
                         "groups", it, self.median_prediction * 1e3, before_median * 1e3,
                         plan.digest()[:12],
                         "keeps" if plan.groups == before.groups else "changes")
        elif self.options.replan_after > 0:
            self._replan_at = it + self.options.replan_after

    def _median_prediction(self, plan: Any, steps: list) -> float:
        """The median over the profiled iterations of the plan's timeline on each one's own
        times: what the measured median is compared with. Not the timeline of the median
        profile: where communication and backward end close together (where merging pays),
        each iteration ends with whichever is later that time, and the median of those
        maxima exceeds the maximum of the medians."""

        return statistics.median(
            timeline(as_profile(s, self.net.name, self.names, self.counts), self.cost,
                     plan.groups).iteration_time for s in steps)

    def _start_replan_profile(self) -> None:
        """Warm-up is over: profile again on the iterations from here, then re-plan once.
        Every rank starts at the same iteration (the count is the same everywhere).

        With a cost model that has no interference term, the profile is taken while the
        start-up plan runs: backward then includes what its overlapped all-reduces cost it
        (the communication thread's CPU time and wake-ups, the interpreter lock), which the
        model cannot see otherwise. With measured interference, the model adds that itself,
        so the profile is taken as at start-up (one all-reduce after backward, backward
        undisturbed), so as not to count it twice."""
        self._replan_at = None
        self._replanning = True
        self._profiled_iters = 0
        self.profiler = OnlineProfile(self.net.name, self.names, self.counts, skip=1)
        self.timer.install()
        runs_on = not getattr(self.cost, "interferes", False)
        if not runs_on:
            self.executor.set_plan(synceasgd_groups(self.names))
        # on a GPU stream the all-reduce calls return at once: their spans are not the time
        # a message is in flight, so rho cannot be measured from them
        measure = not runs_on and self.executor.mode != "stream"
        if measure:
            # Measure rho in situ: alternate undisturbed iterations (the profile) with
            # overlapped ones (all-reduces while backward runs).
            # overlapped: WFBP's per-layer messages (every layer's size), and the running
            # plan's groups when it merges (the sizes it will send)
            overlapped = [[[n] for n in reversed(self.names)]]
            groups = [list(g) for g in getattr(self.plan, "groups", ())]
            if 1 < len(groups) < len(self.names):
                overlapped.append(groups)
            self._in_situ = {"overlapped": overlapped, "rows": [], "seen": 0}
            self.executor.intervals = []
        if self.rank == 0:
            log.info("Warm-up over at iteration %d: profiling %d more iterations (the first "
                     "one is not counted) to re-plan once; meanwhile %s", self.solver.iter,
                     PROFILE_EXTENSION * self.options.profile_iters,
                     "the plan runs on (the profile includes what its overlapped "
                     "all-reduces cost backward)" if runs_on else
                     "all gradients go in one all-reduce after backward" if not measure else
                     "iterations alternate between all gradients in one all-reduce after "
                     "backward (the profile) and all-reduces during backward, per layer or "
                     "by the plan's groups (to measure how much backward slows beside them)")

    @property
    def planning(self) -> bool:
        """Whether a profile (start-up or re-plan) is still to be measured or under way."""
        return self.profiler is not None or self._replan_at is not None

    def _add_overlapped(self) -> None:
        """One overlapped iteration of the re-plan window: each layer's backward time and
        what was in flight meanwhile (the first such iteration warms and is not counted)."""

        state, intervals = self._in_situ, self.executor.intervals or []
        self.executor.intervals = []
        state["seen"] += 1
        if state["seen"] > 1 and len(self._ready) == len(self.names):
            state["rows"].append(layer_overlaps(self.timer.forward_end, self._ready,
                                                intervals, len(self.names)))
            # the other direction (sigma): each message's time in flight, how much of it
            # during backward, and what a + b*M predicts for it
            start, end = self.timer.forward_end, self._ready[1]
            state.setdefault("messages", []).append(
                [(m, t1 - t0, max(0.0, min(t1, end) - max(t0, start)), self.cost.time(m))
                 for t0, t1, m in intervals])
            comm = state.setdefault("comm", [0.0, 0.0])
            for t0, t1, m in intervals:
                if t0 < end:
                    comm[0] += t1 - t0
                    comm[1] += self.cost.time(m)

    def _adopt_in_situ_rho(self) -> None:
        """Estimate rho from the window's two kinds of iterations on every rank, keep the
        slowest rank's (a collective: every rank adopts the same points), and use it in the
        cost model for the re-plan, its prediction and the rest of the run."""

        state, self._in_situ = self._in_situ, None
        self.executor.intervals = None
        probe = tuple(self.cost.interference)
        classes = [m for m, _ in probe]
        mine = estimate([b for _, b in self.profiler.samples], state["rows"], classes)
        with self._guard("gathering the in-situ interference estimates"):
            gathered = self.base_comm.allgather((mine, state.get("messages", [])))
        found = [e for e, _ in gathered if e is not None]
        # sigma from each message as the rank that entered it last saw it (every rank
        # computes the same from the same rows)
        comm_est = estimate_comm(last_arrivals([m for _, m in gathered]), classes)
        if comm_est is not None:
            self.insitu_comm = comm_est
            self.cost = self.cost.with_comm_slowdown(comm_est.points)
            if self.rank == 0:
                log.info("Communication slows beside backward, measured in situ (each "
                         "message as the last of %d rank(s) to enter it saw it): %s; the "
                         "model now uses %s", self.size, comm_est.describe(),
                         ", ".join(f"{m / 1e6:.3g} MB x{v:.2f}" for m, v in comm_est.points))
        probe_text = ", ".join(f"{m / 1e6:.3g} MB +{r * 100:.0f}%" for m, r in probe)
        if not found:
            if self.rank == 0:
                log.warning("In-situ interference: no all-reduce was in flight during "
                            "backward in the window; keeping the start-up probe's (%s)",
                            probe_text)
            return
        est: InSitu = max(found, key=lambda e: e.single)  # the step waits for the slowest
        self.insitu, self.probe_interference = est, probe
        self.cost = self.cost.with_interference(est.points)
        measured, modelled = state.get("comm", [0.0, 0.0])
        with self._guard("gathering the in-situ all-reduce times"):
            slowest = max(m / p if p > 0 else 1.0 for m, p in
                          self.base_comm.allgather((measured, modelled)))
        self.comm_slowdown = slowest  # measured / modelled all-reduce time during backward
        if self.rank == 0:
            log.info("All-reduces sent while backward ran took %.2fx their a + b*M (slowest "
                     "rank; whole messages, also their part after backward)", slowest)
            log.info("Computation slows beside the all-reduces, measured in situ on the "
                     "slowest of %d rank(s): %s; the model now uses %s (start-up GEMM probe: "
                     "%s)", self.size, est.describe(),
                     ", ".join(f"{m / 1e6:.3g} MB +{r * 100:.0f}%" for m, r in est.points),
                     probe_text)

    def _agree_on_requests(self) -> None:
        local = self._local_action() if self._local_action is not None else _SOLVER_ACTION_NONE
        with self._guard("agreement on stop/snapshot requests"):
            stop, snapshot = self.base_comm.any_true([local == _STOP, local == _SNAPSHOT])
        if stop and local != _STOP and self.rank == 0:
            log.info("Another rank asked to stop: stopping at iteration %d", self.solver.iter)
        self._stop = self._stop or stop
        self._agreed = _STOP if stop else _SNAPSHOT if snapshot else _SOLVER_ACTION_NONE

    def _agreed_action(self) -> str:
        """The solver's action function: what every rank agreed on (consumed once).

        The solver asks after each iteration and between test batches; what follows until
        the next iteration (rank 0's snapshot, its test pass) is a busy phase of one rank:
        its heartbeats tell the waiting ranks it is alive (progress.Liveness)."""
        if self.liveness is not None:
            self.liveness.tick()
            self.liveness.busy(True)
        action, self._agreed = self._agreed, _SOLVER_ACTION_NONE
        return action

    def should_stop(self) -> bool:
        return self._stop

    def allgather_state(self, obj: Any) -> list:
        """Every rank's `obj` (the solver's data positions at a snapshot; a collective)."""
        with self._guard("gathering the data positions for the snapshot"):
            return self.base_comm.allgather(obj)

    # ------------------------------------------------------------------ the end
    def summary(self) -> str | None:
        """Measured forward-to-reduced-gradients time beside the plan's prediction."""
        if self.plan is None or not self.grad_times:
            return None
        times = self.grad_times[1:] or self.grad_times  # the first after a plan change warms
        measured = statistics.median(times)
        predicted = self.median_prediction or self.plan.iteration_time
        whole = statistics.median(self.iteration_times[1:] or self.iteration_times)
        how = ("" if self.median_prediction is None else
               f"; median over the profiled iterations, {self.plan.iteration_time * 1e3:.2f} "
               f"ms at the median profile")
        return (f"iteration (forward start to reduced gradients): measured {measured * 1e3:.2f}"
                f" ms (median of {len(times)}), predicted {predicted * 1e3:.2f} ms by plan "
                f"{self.plan.scheme} ({(measured / predicted - 1) * 100:+.1f}%{how}); whole "
                f"iteration with the update {whole * 1e3:.2f} ms")

    def close(self) -> None:
        """Stop the communication thread, log the summary, write the trace (a collective)."""
        if self.closed:
            return
        self.closed = True
        self.executor.close()
        self.timer.remove()
        text = self.summary()
        if self.rank == 0 and text:
            log.info("%s", text)
        if getattr(self.comm, "padded_s", None) is not None and self.rank == 0:
            log.info("EMULATION: slept %.3f s in %d all-reduces to match the modelled network",
                     self.comm.padded_s, self.comm.calls)
        if self.tracer is not None:
            with self._guard("gathering the trace"):
                events = self.base_comm.allgather(self.tracer.snapshot())
            if self.rank == 0:
                meta = {"world_size": self.size, "comm": self.options.comm,
                        "scheme": getattr(self.plan, "scheme", None),
                        "predicted_iteration_s": getattr(self.plan, "iteration_time", None),
                        "measured_iteration_s": (statistics.median(self.grad_times[1:])
                                                 if len(self.grad_times) > 1 else None),
                        "plan": self.plan.to_dict() if self.plan is not None else None,
                        "emulated_nodes": self.options.emulate_nodes}
                save_trace(merge_traces(events, meta), self.options.timeline)
                log.info("Wrote the timeline of %d rank(s) to %s", self.size,
                         self.options.timeline)
        if self.watchdog is not None:
            self.watchdog.close()
        if self.liveness is not None:
            self.liveness.close()  # the others stop watching: this rank ended normally
        if self in self.solver.iteration_hooks:
            self.solver.iteration_hooks.remove(self)
        if self.solver.gradient_sync is self:
            self.solver.gradient_sync = None

    def __enter__(self) -> DistributedTraining:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:  # the failure path: no collectives (peers may be gone); failing_together aborts
            self.executor.close(join=False)
            self.timer.remove()


def attach(solver: Any, args: Any, comm: Communicator | None = None) -> DistributedTraining:
    """Make `solver` train data-parallel over `comm` (default: `world()`): a collective.

    Sets `solver.gradient_sync` and adds an iteration hook; returns the handle (a context
    manager whose exit closes it). Build the solver with rank/world_size of `comm` first."""
    if comm is None:
        comm = world(None)[0]
    if getattr(solver, "world_size", comm.size) != comm.size or \
            getattr(solver, "rank", comm.rank) != comm.rank:
        raise CommError(f"rank {comm.rank}: the solver was built for rank {solver.rank} of "
                        f"{solver.world_size}, the communicator is rank {comm.rank} of "
                        f"{comm.size}: pass rank and world_size from world() to the solver")
    param = solver.param
    comm_param = param.comm_param if param.HasField("comm_param") else None
    options = options_from(args, comm_param, getattr(solver, "solver_path", None))
    return DistributedTraining(solver, comm, options)
