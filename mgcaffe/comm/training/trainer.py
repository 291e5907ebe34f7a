"""Distributed synchronous SGD for one rank: the solver's gradient_sync and iteration hook.

How `mgcaffe train` uses it (see docs/distributed.md):

    comm, rank, size = world(args.log_level)          # before the solver: data sharding
    with failing_together(comm):                      # an exception on any rank ends all
        solver = build_solver(args, rank=rank, world_size=size)
        with attach(solver, args, comm):              # gradient_sync + iteration hook
            run_training(solver, args)

`attach` (a collective) wires the parts:
0. starts the heartbeats that judge liveness by progress (liveness.py) and checks that every
   rank holds the same net layout, batch sizes, solver and comm settings (agreement.py);
1. picks the gradients' communicator (gradient_comm.py: NCCL, MPI, or an emulated network)
   and broadcasts rank 0's parameters so all ranks start identical;
2. gets T_ar(M) (cost_source.py: a network file, the emulation, or measured at start-up);
3. gets the plan and keeps it up to date (replanner.py: given, or profiled at start-up and
   re-planned once after warm-up, every rank switching between the same two iterations);
4. starts the communication thread (`GradientExecutor`, one for every plan; a schedule's
   overlaps the next forward, on a communicator of its own: `executor_comm`) and hooks into
   the solver; a scheme that plans a schedule also has the profile measure each layer's
   forward and update (overlap.py).

Each iteration every rank then OR-s its stop/snapshot requests with the others' (one tiny
all-reduce), so all stop or snapshot at the same iteration, and every `--check-sync K`
iterations compares checksums of the learnable weights.
"""

from __future__ import annotations

import logging
import os
import socket
import statistics
import time
from contextlib import contextmanager
from typing import Any

import numpy as np

from ...backend import to_host
from ...errors import CommError
from ..backends.communicator import Communicator
from ..model.schemes import scheme_named
from ..runtime.executor import GradientExecutor
from ..runtime.timing import NetTimer
from ..runtime.trace import COMPUTE, Tracer, merge_traces, save_trace
from .agreement import agree_on_settings, settings_of
from .cost_source import run_cost
from .faults import LeaveGuard, Watchdog, check_in_sync
from .gradient_comm import executor_comm, gradient_channel
from .liveness import start_liveness
from .notices import likely_causes, overrun_warning
from .options import COMM_MODES, MERGES, Options, add_arguments, options_from, wanted
from .overlap import ForwardShape, plans_a_schedule
from .replanner import Learnables, Replanner
from .requests import NONE as _SOLVER_ACTION_NONE
from .requests import STOPS, agree_on_requests
from .startup import (
    agree_on_layers_and_plan,
    benchmark_sizes,
    broadcast_parameters,
    learnable_summary,
)
from .world import failing_together, rank_device, world

# options and start-up pieces are re-exported: `distributed` is the module callers use
__all__ = ["COMM_MODES", "MERGES", "DistributedTraining", "Options", "add_arguments",
           "agree_on_layers_and_plan", "attach", "benchmark_sizes", "failing_together",
           "options_from", "rank_device", "wanted", "world"]

log = logging.getLogger("mgcaffe.comm")



def flatten_gradients(net: Any) -> None:
    """Lay the reduced parameter diffs out as one buffer in the executor's order (unless the
    net already is), so that every planned group is one slice all-reduced in place."""
    flatten = getattr(net, "flatten_param_diffs", None)
    if flatten is None:  # a net without the method: the executor packs
        return
    if tuple(net.flat_param_ids) != tuple(net.reduced_param_ids()):
        flatten()


def describe_scheme(o: Options) -> str:
    """What trains, as the flags say it: `--comm=threshold --bucket-mb 25`, or the plan."""
    text = f"--comm={o.scheme}"
    if scheme_named(o.scheme).bucket and not o.plan:
        text += f" --bucket-mb {o.bucket_mb:g}"
    if o.compress != "none":
        text += f" --compress={o.compress}"
    return text + (f" (the plan of {o.plan})" if o.plan else "")


def describe_gradient_buffer(executor: GradientExecutor) -> str:
    """One log line: whether the gradients are all-reduced in place or packed."""
    n, in_place = len(executor.groups), executor.in_place_groups
    if in_place == n:
        return ("Gradients are all-reduced in place, group by group, in the net's flat "
                "gradient buffer (no copies)")
    return (f"Gradients: {n - in_place} of {n} group(s) are packed into a "
            f"{executor.buffer.nbytes / 1e6:.1f} MB buffer to be all-reduced "
            f"({executor.mode} path)")


def log_executor(executor: GradientExecutor, thread_nice: int | None) -> None:
    """Rank 0's lines about the communication thread: its buffer, its priority."""
    log.debug("%s", describe_gradient_buffer(executor))
    if thread_nice is not None and executor.favoured:
        log.debug("Communication thread at nice %d", thread_nice)
    elif thread_nice is not None:
        log.info("Communication thread left at its priority (nice %d needs root or "
                 "CAP_SYS_NICE): its wake-ups may wait for backward on busy cores",
                 thread_nice)


# ----------------------------------------------------------------------------- training
class DistributedTraining:
    """The solver's gradient_sync and iteration hook for one rank (build it with `attach`).

    gradient_sync: `on_learnable_done(k)`, `wait()`. Iteration hook: `before_iteration`,
    `after_iteration`, `should_stop`. `close()` (a collective) stops the thread, writes the
    trace and logs the measured iteration time beside the plan's prediction. The plan and
    its phases are the `replanner`'s.

    MPI requires every rank to issue collectives on a communicator in the same order. The
    main thread's collectives (barrier, agreements, plan broadcast, check-sync) all happen
    between `wait()` returning and the next backward, when the communication thread has
    nothing in flight, so the two threads never interleave theirs. A scheduled plan's thread
    goes on beside the next forward (the solver then calls `wait_layer(k)` per layer instead
    of `wait()`): it has a duplicate communicator of its own, and its work is finished
    before the plan changes or the weights are compared."""

    #: It reads gradients only through the net's buffer and blobs: the solver's clear of
    #: the parameter diffs may stay lazy (Solver._user_code_before_backward).
    reads_param_diffs_afresh = True

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
        self.tracer = Tracer(comm.rank, window=o.trace_window) if o.timeline else None
        channel = gradient_channel(comm, solver.device, o, self._guard)
        self.comm = channel.comm
        with self._guard("exchange of host names"):
            hosts = comm.allgather(socket.gethostname())
        self.hosts = len(set(hosts))  # the ranks' hosts, and how many ranks share this one
        self.ranks_here = hosts.count(hosts[self.rank])

        if self.rank == 0:
            log.info("Distributed training: %d rank%s on %d host%s (%s), %s", self.size,
                     "s" if self.size != 1 else "", self.hosts, "s" if self.hosts != 1 else "",
                     " ".join(str(getattr(comm, "library", comm.name)).split()),
                     describe_scheme(o))
        with self._guard("broadcast of rank 0's parameters"):
            sent = broadcast_parameters(comm, net)
        if self.rank == 0 and self.size > 1:
            log.info("Broadcast rank 0's parameters to every rank (%.2f MB)", sent / 1e6)

        # T(M) and interference measured where the gradients go: NCCL on device memory
        on_device = getattr(channel.comm, "device_streams", False)
        cost = run_cost(o, channel.comm if on_device else comm, 4 * sum(self.counts),
                        self._guard, channel.emulated_cost, net.xp if on_device else np)
        self.replanner = Replanner(comm, o, Learnables(net.name, self.names, self.counts,
                                                       net.dtype.itemsize), cost, self._guard)
        if plans_a_schedule(o.scheme, None) and not o.plan and solver.per_layer_blockers():
            self.replanner.scheme = "mgwfbp"
            if self.rank == 0:
                log.info("--comm=%s updates each layer before its next forward, but this "
                         "solver updates after every gradient (%s): training mgwfbp's plan "
                         "instead", o.scheme, "; ".join(solver.per_layer_blockers()))
        provisional = self.replanner.initial_plan()
        with self._guard("agreement on the plan and the learnable layers"):
            agree_on_layers_and_plan(comm, self.names, self.counts, provisional)
        # On a GPU, layer times need the device to finish first (kernels are asynchronous).
        self._sync = None if net.xp is np else net.xp.cuda.get_current_stream().synchronize
        self.timer = NetTimer(net, self.tracer, synchronize=self._sync)
        if self.tracer is not None or self.replanner.profiling:
            self.timer.install()
        if not o.pack_gradients:
            flatten_gradients(net)
        run = dict(timeout=o.timeout, tracer=self.tracer, watchdog=self.watchdog,
                   in_place=not o.pack_gradients, thread_nice=o.thread_nice)
        schedule = plans_a_schedule(self.replanner.scheme, self.replanner.plan)
        with self._guard("a communicator of the communication thread's own"):
            self.executor = GradientExecutor.from_net(
                net, provisional, executor_comm(self.comm, overlaps_forward=schedule), **run)
        if schedule:
            self.replanner.shape = ForwardShape(net)
            solver.update_times = [0.0] * len(self.names)
        self.replanner.start(self.executor, self.timer, keep_timer=self.tracer is not None)
        if self.rank == 0:
            log_executor(self.executor, o.thread_nice)
        self._ready: dict[int, float] = {}
        self._t_start = 0.0
        self._t_grads = 0.0
        self.grad_times: list[float] = []  # forward start -> reduced gradients, per iteration
        self.iteration_times: list[float] = []
        self.periods: list[float] = []  # forward start -> the next forward start
        self._gates: dict[int, float] = {}  # this forward's waits for layer k's gradient
        self._agreed = _SOLVER_ACTION_NONE
        self._stop = False
        self.signals: Any = None  # vote_with
        self.stop_signal: int | None = None  # the signal of an agreed stop
        self._local_action = None
        self._agreed_fn = self._agreed_action  # one bound method, compared by identity
        solver.gradient_sync = self
        solver.iteration_hooks.append(self)
        with self._guard("start barrier"):
            comm.barrier()
        if self.liveness is not None:
            self.liveness.busy(True)  # until the first iteration: rank 0's initial test
            self.liveness.at(-1, "rank 0's first test" if solver.param.test_initialization
                             and solver.param.test_interval else "start-up")
        # os._exit (and sys.exit, __exit__) on this rank: the job ends non-zero, every rank
        # saying which rank left and where
        self.leave_guard = LeaveGuard(comm, self.liveness).install() \
            if self.size > 1 and comm.one_process_per_rank else None
        if self.tracer is not None:
            self.tracer.set_origin()

    @contextmanager
    def _guard(self, what: str, timeout: float | None = None):
        """A deadline on a collective (judged by the peers' progress), when there are peers."""
        if self.watchdog is None:
            yield
        else:
            with self.watchdog.guard(what, timeout):
                yield

    # ------------------------------------------------------------------ the plan
    @property
    def plan(self) -> Any:
        """The plan the communication thread runs (None while the first is profiled)."""
        return self.replanner.plan

    @property
    def cost(self) -> Any:
        """The cost model the plan was made with (in-situ terms included once measured)."""
        return self.replanner.cost

    @property
    def planning(self) -> bool:
        """Whether a profile (start-up or re-plan) is still to be measured or under way."""
        return self.replanner.planning

    @property
    def profile_dict(self) -> dict | None:
        """The profile the current plan was made from, as a dict (None when read)."""
        return self.replanner.profile_dict

    # ------------------------------------------------------------------ gradient_sync
    def on_learnable_done(self, k: int) -> None:
        """Learnable layer k's gradient is ready: note the time, hand k to the thread."""
        if self._sync is not None and self.replanner.profiling:
            self._sync()  # profiling on a GPU: the time the gradient is computed, not queued
        self._ready[k] = self.clock()
        self.executor.on_learnable_done(k)

    def wait(self) -> None:
        """Block until every group of the iteration is reduced (averaged over ranks)."""
        live = self.liveness
        if live is not None:
            live.at(live.iteration, "waiting for the reduced gradients")
        self.executor.wait()
        self._t_grads = self.clock()
        if live is not None:
            live.at(live.iteration, "the update")

    @property
    def per_layer(self) -> bool:
        """Whether the running plan lets each layer's update wait for its next forward."""
        return self.executor.per_layer

    def wait_layer(self, k: int) -> None:
        """Block until layer k's gradient of the last iteration is reduced (the next forward
        is about to read its parameters; on a GPU the compute stream waits for it)."""
        t0 = self.clock()
        self.executor.wait_layer(k)
        if self._sync is not None and self.replanner.profiling:
            self._sync()  # profiling on a GPU: the wait itself, not the next layer's forward
        t1 = self.clock()
        self._gates[k] = t1 - t0
        if self.tracer is not None and t1 - t0 > 1e-5:
            self.tracer.span(f"wait for {self.names[k - 1]}", "wait", COMPUTE, t0, t1, layer=k)

    # ------------------------------------------------------------------ iteration hook
    def before_iteration(self, solver: Any) -> None:
        if self.liveness is not None:
            self.liveness.busy(False)
            self.liveness.tick()
            self.liveness.at(solver.iter, "forward and backward")
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
        self._gates = {}
        now = self.clock()
        if self._t_start and self.plan is not None and not self.replanner.profiling:
            self.periods.append(now - self._t_start)
        self._t_start = now

    def after_iteration(self, solver: Any) -> None:
        t_end = self.clock()
        it = solver.iter  # already counts this update
        if self.tracer is not None:
            self.tracer.span(f"iteration {it - 1}", "iteration", COMPUTE, self._t_start, t_end)
        if self.plan is not None and not self.replanner.profiling and \
                not getattr(solver, "updates_per_layer", False):
            self.grad_times.append(self._t_grads - self._t_start)
            self.iteration_times.append(t_end - self._t_start)
        k = self.options.check_sync
        if self.replanner.may_switch(it) or (k and it % k == 0 and self.size > 1):
            solver.finish_updates()  # the thread's work of this iteration done, weights final
        updates = solver.update_times
        gates = {k: w + (updates[k - 1] if updates else 0.0) for k, w in self._gates.items()}
        if self.replanner.after_iteration(it, self._ready, gates, updates, self.periods,
                                          self._closing_times(), self._t_grads - self._t_start):
            self.grad_times.clear()  # measured against the new plan's prediction from here on
            self.iteration_times.clear()
            self.periods.clear()
        self._agree_on_requests()
        if k and it % k == 0 and self.size > 1:
            with self._guard(f"weight check at iteration {it}"):
                check_in_sync(self.base_comm,
                              [to_host(b.data) for b in self.net.learnable_params], it)

    def vote_with(self, signals: Any) -> None:
        """Vote with the stop signal of `signals` (a SignalHandler: `stop_signal`), so that
        every rank knows which signal stopped the training (`stop_signal`)."""
        self.signals = signals

    def _agree_on_requests(self) -> None:
        if self.liveness is not None:
            self.liveness.at(self.solver.iter - 1, "the agreement on stop/snapshot requests")
        local = self._local_action() if self._local_action is not None else _SOLVER_ACTION_NONE
        own_signal = getattr(self.signals, "stop_signal", None)
        with self._guard("agreement on stop/snapshot requests"):
            agreed = agree_on_requests(self.base_comm, local, own_signal)
        if agreed.asked_elsewhere and self.rank == 0:
            log.info("Another rank asked to stop: stopping at iteration %d", self.solver.iter)
        if agreed.signal is not None and self.stop_signal is None:
            self.stop_signal = agreed.signal
        self._stop = self._stop or agreed.action in STOPS
        self._agreed = agreed.action

    def _agreed_action(self) -> str:
        """The solver's action function: what every rank agreed on (consumed once).

        The solver asks after each iteration and between test batches; what follows until
        the next iteration (rank 0's snapshot, its test pass) is a busy phase of one rank:
        its heartbeats tell the waiting ranks it is alive (progress.Liveness)."""
        if self.liveness is not None:
            self.liveness.tick()
            self.liveness.busy(True)
            self.liveness.at(self.solver.iter, "rank 0's snapshot or test" if self.rank == 0
                             else "between iterations")
        action, self._agreed = self._agreed, _SOLVER_ACTION_NONE
        return action

    def should_stop(self) -> bool:
        return self._stop

    def allgather_state(self, obj: Any) -> list:
        """Every rank's `obj` (the solver's data positions at a snapshot; a collective)."""
        with self._guard("gathering the data positions for the snapshot"):
            return self.base_comm.allgather(obj)

    # ------------------------------------------------------------------ the end
    def _per_layer(self) -> bool:
        """Whether the plan updates layer by layer (its iteration runs from a forward start
        to the next forward start) and such iterations were measured."""
        schedule = getattr(self.plan, "schedule", None)
        return schedule is not None and schedule.update == "per-layer" and bool(self.periods)

    def _closing_times(self) -> list[float]:
        """The iterations the closing line measures: forward start to reduced gradients, or
        to the next forward start for a plan that updates layer by layer."""
        return self.periods if self._per_layer() else self.grad_times

    def measured(self) -> tuple[float, float, int] | None:
        """(measured median, predicted, iterations) of forward start to reduced gradients
        (a plan that updates layer by layer: to the next forward start) since the plan was in
        place; None before."""
        if self.plan is None:
            return None
        times = self._closing_times()
        if not times:
            return None
        times = times[1:] or times  # the first after a plan change warms
        predicted = self.replanner.median_prediction or self.plan.iteration_time
        return statistics.median(times), predicted, len(times)

    def summary(self) -> str | None:
        """Measured iteration time beside the plan's prediction."""
        got = self.measured()
        if got is None:
            return None
        measured, predicted, n = got
        told = (f"measured {measured * 1e3:.2f} ms (median of {n}), predicted "
                f"{predicted * 1e3:.2f} ms by plan {self.plan.scheme} "
                f"({(measured / predicted - 1) * 100:+.1f}%)")
        if self._per_layer():
            return f"iteration (forward start to the next forward start, update included): {told}"
        whole = statistics.median(self.iteration_times[1:] or self.iteration_times)
        return (f"iteration (forward start to reduced gradients): {told}; whole iteration "
                f"with the update {whole * 1e3:.2f} ms")

    def likely_causes(self) -> list[str]:
        """Why an iteration may run far above its prediction, the most specific first."""
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            os.cpu_count() or 1
        return likely_causes(self.options, getattr(self.plan, "nodes", None),
                             self.options.emulate_nodes or self.size, cores,
                             os.getloadavg()[0], self.ranks_here,
                             getattr(self.cost, "interferes", False), os.cpu_count())

    def report(self) -> None:
        """Rank 0's closing lines: the summary, and a warning when the measured iteration is
        far above the prediction, naming the likely cause."""
        text = self.summary()
        if text:
            log.info("%s", text)
            if self.replanner.median_prediction is not None:
                log.debug("predicted: the median over the profiled iterations of the plan's "
                          "timeline on each one's times; the timeline of the median profile "
                          "gives %.2f ms", self.plan.iteration_time * 1e3)
            measured, predicted, _ = self.measured()
            warning = overrun_warning(measured, predicted, self.likely_causes())
            if warning:
                log.warning("%s", warning)

    def close(self) -> None:
        """Stop the communication thread, log the summary, write the trace (a collective)."""
        if self.closed:
            return
        self.closed = True
        self.executor.close()
        self.timer.remove()
        if self.rank == 0:
            self.report()
        # the gradients' communicator: a scheduled plan's executor has a duplicate of its own
        emulated = self.executor.comm
        if getattr(emulated, "padded_s", None) is not None and self.rank == 0:
            log.info("EMULATION: slept %.3f s in %d all-reduces to match the modelled network",
                     emulated.padded_s, emulated.calls)
        if self.tracer is not None:
            with self._guard("gathering the trace"):
                events = self.base_comm.allgather(self.tracer.snapshot())
            if self.rank == 0:
                meta = {"world_size": self.size, "comm": self.options.scheme,
                        "scheme": getattr(self.plan, "scheme", None),
                        "traced": self.tracer.window.describe(),
                        "predicted_iteration_s": getattr(self.plan, "iteration_time", None),
                        "measured_iteration_s": (statistics.median(self.grad_times[1:])
                                                 if len(self.grad_times) > 1 else None),
                        "plan": self.plan.to_dict() if self.plan is not None else None,
                        "emulated_nodes": self.options.emulate_nodes}
                save_trace(merge_traces(events, meta), self.options.timeline)
                log.info("Wrote the timeline of %d ranks (%s) to %s", self.size,
                         self.tracer.window.describe(), self.options.timeline)
        if self.watchdog is not None:
            self.watchdog.close()
        if self.leave_guard is not None:
            self.leave_guard.restore()
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
            if exc_type is SystemExit and self.leave_guard is not None:
                self.leave_guard.leave(f"sys.exit({exc.code!r})")
                exc.rank_reported = True  # (failing_together: said, do not say it again)
            if self.leave_guard is not None:
                self.leave_guard.restore()
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
