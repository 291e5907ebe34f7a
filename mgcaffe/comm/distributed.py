"""Distributed synchronous SGD: start-up, the plan, and the per-iteration agreements.

How `mgcaffe train` uses it (see docs/distributed.md):

    comm, rank, size = world(args.log_level)          # before the solver: data sharding
    with failing_together(comm):                      # an exception on any rank ends all
        solver = build_solver(args, rank=rank, world_size=size)
        with attach(solver, args, comm):              # gradient_sync + iteration hook
            run_training(solver, args)

`attach` (a collective):
1. broadcasts rank 0's parameters (every blob of every layer) so all ranks start identical;
2. gets T_ar(M) = a + b*M: `--network` (a fit or a formula for N), else the emulated network,
   else an all-reduce benchmark over sizes from 4 bytes to the whole gradient, fitted by least
   squares (logged with its residual);
3. gets the plan: `--plan` (each rank reads it), or made on rank 0 from `--profile`, or from a
   profile measured on the first `profile_iters` training iterations (communicating the whole
   gradient after backward meanwhile, so backward is timed undisturbed), then broadcast; every
   rank compares the plan's digest and its learnable layers with every other rank's, and any
   difference stops every rank with a message naming the rank and what differs;
4. starts the communication thread (`GradientExecutor`) and hooks into the solver.

Each iteration every rank then OR-s its stop/snapshot requests with the others' (one tiny
all-reduce), so all stop or snapshot at the same iteration, and every `--check-sync K`
iterations compares checksums of the learnable weights.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..backend import to_host
from ..errors import CommError, MgcaffeError
from ..log import configure
from .communicator import Communicator
from .executor import GradientExecutor, check_plan_layers
from .faults import ABORT_EXCEPTION, Watchdog, check_in_sync, fail_all
from .local import SingleCommunicator
from .mpi import MpiCommunicator, launched_by_mpi
from .timing import NetTimer, OnlineProfile, slowest
from .trace import COMPUTE, Tracer, merge_traces, save_trace

__all__ = ["COMM_MODES", "MERGES", "DistributedTraining", "Options", "add_arguments", "attach",
           "failing_together", "options_from", "wanted", "world"]

log = logging.getLogger("mgcaffe.comm")

COMM_MODES = ("wfbp", "synceasgd", "mgwfbp", "threshold")
MERGES = ("optimal", "paper")
_SOLVER_ACTION_NONE, _STOP, _SNAPSHOT = "none", "stop", "snapshot"  # SolverAction values


def world(log_level: str | None = "INFO") -> tuple[Communicator, int, int]:
    """(communicator, rank, size) of this process: MPI when a launcher started it, else a
    world of one rank without touching MPI. With `log_level`, logging is configured so that
    only rank 0 logs below WARNING and every other rank's lines carry its rank."""
    comm: Communicator = MpiCommunicator() if launched_by_mpi() else SingleCommunicator()
    if log_level is not None and comm.size > 1:
        configure(log_level, rank=comm.rank, world_size=comm.size)
    return comm, comm.rank, comm.size


@contextmanager
def failing_together(comm: Communicator):
    """Any exception inside ends every rank: logged with this rank, then MPI_Abort."""
    try:
        yield comm
    except BaseException as exc:
        if comm.size > 1 and not isinstance(exc, (SystemExit, GeneratorExit)):
            fail_all(comm, exc, ABORT_EXCEPTION)
        raise


# ----------------------------------------------------------------------------- options
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
    timeout: float = 120.0
    timeline: str | None = None
    emulate_network: str | None = None
    emulate_nodes: int | None = None
    check_sync: int = 0
    test_timeout: float = 3600.0

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
                            f"{self.comm!r}")
        if self.merge not in MERGES:
            raise CommError(f"--merge: expected one of {', '.join(MERGES)}, got {self.merge!r}")
        if not self.bucket_mb > 0:
            raise CommError(f"--bucket-mb: must be > 0, got {self.bucket_mb}")
        if self.profile_iters < 2:
            raise CommError(f"profile_iters: must be >= 2 (the first is skipped), got "
                            f"{self.profile_iters}")
        if not self.timeout > 0:
            raise CommError(f"--comm-timeout: must be > 0 seconds, got {self.timeout}")
        if self.check_sync < 0:
            raise CommError(f"--check-sync: must be >= 0, got {self.check_sync}")
        if (self.emulate_network is None) != (self.emulate_nodes is None):
            raise CommError("--emulate-network and --emulate-nodes go together")
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
    g.add_argument("--timeline", default=None, metavar="TRACE.json",
                   help="write a Chrome/Perfetto trace of every rank (rank 0 writes)")
    g.add_argument("--emulate-network", default=None, metavar="NET.json",
                   help="make each gradient all-reduce last at least this network's a + b*M")
    g.add_argument("--emulate-nodes", type=int, default=None, metavar="N",
                   help="number of nodes whose a and b --emulate-network uses")
    g.add_argument("--check-sync", type=int, default=None, metavar="K",
                   help="every K iterations compare weight checksums across ranks")
    g.add_argument("--comm-timeout", type=float, default=None, metavar="SECONDS",
                   help="a collective making no progress this long ends every rank "
                        "(default 120)")


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
             "profile_iters": "profile_iters", "timeline": "timeline",
             "emulate_network": "emulate_network", "emulate_nodes": "emulate_nodes",
             "check_sync": "check_sync", "comm_timeout": "timeout"}
    for flag, name in flags.items():
        value = getattr(args, flag, None)
        if value is not None:
            setattr(o, name, value)
    return o.check()


# ----------------------------------------------------------------------------- start-up
def _blob_arrays(net: Any) -> list[Any]:
    """Every parameter blob's data, each array once (shared blobs alias one array)."""
    seen, out = set(), []
    for blobs in net.params.values():
        for blob in blobs:
            if id(blob.data) not in seen:
                seen.add(id(blob.data))
                out.append(blob.data)
    return out


def broadcast_parameters(comm: Communicator, net: Any) -> int:
    """Give every rank rank 0's parameters (learnable or not: BatchNorm statistics too);
    returns the number of bytes sent."""
    total = 0
    for data in _blob_arrays(net):
        if isinstance(data, np.ndarray) and data.flags.c_contiguous:
            comm.broadcast(data, root=0)
        else:  # a device array: through a host copy
            host = np.ascontiguousarray(to_host(data))
            comm.broadcast(host, root=0)
            data[...] = net.xp.asarray(host)
        total += data.nbytes
    return total


def learnable_summary(net: Any) -> tuple[list[str], list[int]]:
    """The learnable layer names (input side first) and their parameter counts."""
    names, counts = [], []
    for layer in net.learnable_layers:
        names.append(layer.name)
        counts.append(sum(int(net.learnable_params[p].diff.size) for p in layer.param_ids))
    return names, counts


def _first_difference(a: list, b: list) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"position {i}: {x!r} vs {y!r}"
    return f"{len(a)} vs {len(b)} entries"


def agree_on_layers_and_plan(comm: Communicator, names: list[str], counts: list[int],
                             plan: Any) -> None:
    """Every rank holds the same learnable layers and the same plan, or every rank raises a
    CommError naming the ranks that differ from rank 0 and how."""
    check_plan_layers([list(g) for g in plan.groups], names, comm.rank)
    digest = plan.digest() if hasattr(plan, "digest") else repr([list(g) for g in plan.groups])
    everyone = comm.allgather((names, counts, digest))
    ref_names, ref_counts, ref_digest = everyone[0]
    problems = []
    for r, (n, c, d) in enumerate(everyone[1:], start=1):
        if n != ref_names:
            problems.append(f"rank {r}'s learnable layers differ from rank 0's "
                            f"({_first_difference(n, ref_names)})")
        elif c != ref_counts:
            problems.append(f"rank {r}'s parameter counts differ from rank 0's "
                            f"({_first_difference(c, ref_counts)})")
        elif d != ref_digest:
            problems.append(f"rank {r} holds plan {d[:12]} but rank 0 holds {ref_digest[:12]}")
    if problems:
        raise CommError(f"rank {comm.rank}: ranks disagree: {'; '.join(problems)}")


def _synceasgd_groups(names: list[str]) -> SimpleNamespace:
    """A stand-in plan (one message after backward) used while the profile is measured."""
    return SimpleNamespace(groups=[list(reversed(names))])


def describe_plan(plan: Any) -> str:
    """The plan in a few log lines: scheme, groups, predicted times."""
    lines = [f"plan {plan.scheme} ({plan.digest()[:12]}): {len(plan.groups)} all-reduce(s) "
             f"for {len(plan.layers)} learnable layers, a = {plan.a * 1e6:.2f} us, "
             f"b = {plan.b * 1e9:.4f} ns/B"]
    for g, (group, size) in enumerate(zip(plan.groups, plan.group_sizes)):
        lines.append(f"  group {g}: {size / 1e6:.3f} MB  {', '.join(group)}")
    lines.append(f"predicted iteration {plan.iteration_time * 1e3:.2f} ms (t_f + t_b = "
                 f"{plan.ideal * 1e3:.2f} ms, not overlapped communication "
                 f"{plan.non_overlapped_comm * 1e3:.2f} ms)")
    return "\n".join(lines)


def describe_profile(profile: dict, where: str) -> str:
    """The profile the plan is made from, one line per learnable layer (output side first)."""
    layers = profile["layers"]
    tb = sum(layer["backward_time"] for layer in layers)
    lines = [f"profile ({where}): t_f = {profile['forward_time'] * 1e3:.2f} ms, t_b = "
             f"{tb * 1e3:.2f} ms, {len(layers)} learnable layers"]
    for layer in reversed(layers):
        lines.append(f"  {layer['name']:>24} {layer['params']:>10d} params  backward "
                     f"{layer['backward_time'] * 1e3:8.3f} ms")
    return "\n".join(lines)


def benchmark_sizes(total_bytes: int) -> list[int]:
    """4 bytes up to the whole gradient (at least 1 MB, at most 64 MB), by factors of 4."""
    largest = min(max(total_bytes, 1 << 20), 64 << 20)
    sizes, m = [], 4
    while m < largest:
        sizes.append(m)
        m *= 4
    sizes.append(largest // 4 * 4)
    return sizes


# ----------------------------------------------------------------------------- training
class DistributedTraining:
    """The solver's gradient_sync and iteration hook for one rank (build it with `attach`).

    gradient_sync: `on_learnable_done(k)`, `wait()`. Iteration hook: `before_iteration`,
    `after_iteration`, `should_stop`. `close()` (a collective) stops the thread, writes the
    trace and logs the measured iteration time beside the plan's prediction."""

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
        provisional = self._initial_plan()
        with self._guard("agreement on the plan and the learnable layers"):
            agree_on_layers_and_plan(comm, self.names, self.counts, provisional)
        self.timer = NetTimer(net, self.tracer)
        if self.tracer is not None or self.profiler is not None:
            self.timer.install()
        self.executor = GradientExecutor.from_net(net, provisional, self.comm,
                                                  timeout=o.timeout, tracer=self.tracer,
                                                  watchdog=self.watchdog)
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
        o = self.options
        if o.emulate_network is None:
            return self.base_comm
        from .cost import cost_for, load_network  # noqa: PLC0415
        from .emulate import EmulatedCommunicator  # noqa: PLC0415

        cost = cost_for(load_network(o.emulate_network), o.emulate_nodes)
        emulated = EmulatedCommunicator(self.base_comm, cost, o.emulate_nodes)
        if self.rank == 0:
            log.warning("%s [from %s]", emulated.describe(), o.emulate_network)
        self.emulated_cost = cost
        return emulated

    def _cost_model(self):
        """T_ar for this run: --network, else the emulated network, else measured."""
        from .cost import CostModel, cost_for, load_network  # noqa: PLC0415

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
            from .benchmark import measure_allreduce  # noqa: PLC0415

            sizes = benchmark_sizes(4 * sum(self.counts))
            with self._guard("all-reduce benchmark"):
                bench = measure_allreduce(self.base_comm, sizes, iterations=10)
            cost = bench.fit
            origin = (f"measured all-reduce of {len(sizes)} sizes from {sizes[0]} B to "
                      f"{sizes[-1] / 1e6:.1f} MB, rms residual {bench.rms * 1e6:.2f} us")
            if self.rank == 0:
                log.info("All-reduce benchmark among %d ranks:\n%s", self.size, bench.table())
        if self.rank == 0:
            log.info("All-reduce cost T(M) = a + b*M: a = %.3f us, b = %.4f ns/byte [%s]",
                     cost.a * 1e6, cost.b * 1e9, origin)
        return cost

    def _initial_plan(self):
        """The plan to start with: final (--plan, --profile) or provisional (profiling)."""
        o = self.options
        if o.plan:
            from .planner import load_plan  # noqa: PLC0415

            plan = load_plan(o.plan)
            self._adopt(plan, f"read from {o.plan}")
            return plan
        if o.profile:
            from .profile import load_profile  # noqa: PLC0415

            plan = self._make_and_share(lambda: load_profile(o.profile), f"from {o.profile}")
            return plan
        self.profiler = OnlineProfile(self.net.name, self.names, self.counts, skip=1)
        if self.rank == 0:
            log.info("Profiling the first %d iterations (the first one is not counted); "
                     "meanwhile all gradients go in one all-reduce after backward",
                     self.options.profile_iters)
        return _synceasgd_groups(self.names)

    def _make_and_share(self, get_profile, where: str):
        """Rank 0 plans from get_profile(); every rank receives the plan (a collective)."""
        from .planner import Plan, make_plan  # noqa: PLC0415

        o = self.options
        payload = None
        if self.rank == 0:
            try:
                profile = get_profile()
                plan = make_plan(profile, self.cost, o.scheme,
                                 int(o.bucket_mb * (1 << 20)) if o.comm == "threshold" else None,
                                 nodes=o.emulate_nodes or self.size)
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
        self._ready[k] = self.clock()
        self.executor.on_learnable_done(k)

    def wait(self) -> None:
        """Block until every group of the iteration is reduced (averaged over ranks)."""
        self.executor.wait()
        self._t_grads = self.clock()

    # ------------------------------------------------------------------ iteration hook
    def before_iteration(self, solver: Any) -> None:
        if solver.action_function is not self._agreed_fn:
            # Signals act only once every rank agrees (after_iteration); run_training's
            # handler becomes this rank's vote.
            self._local_action = solver.action_function
            solver.action_function = self._agreed_fn
        p = solver.param
        if (self.size > 1 and p.test_interval and solver.iter % p.test_interval == 0
                and (solver.iter > 0 or p.test_initialization)):
            # Rank 0 has just tested (alone); wait for it here, under a generous deadline,
            # rather than in the first all-reduce, whose deadline is the comm timeout.
            with self._guard(f"waiting for rank 0's test at iteration {solver.iter}",
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
        self._agree_on_requests()
        k = self.options.check_sync
        if k and it % k == 0 and self.size > 1:
            with self._guard(f"weight check at iteration {it}"):
                check_in_sync(self.base_comm,
                              [to_host(b.data) for b in self.net.learnable_params], it)

    def _profile_step(self) -> None:
        prof = self.profiler
        self._profiled_iters += 1  # counted alike on every rank: the switch is a collective
        if len(self._ready) == len(self.names):
            prof.add(self.timer.forward_start, self.timer.forward_end, self._ready)
        if self._profiled_iters < self.options.profile_iters:
            return
        if not len(prof):
            raise CommError(f"rank {self.rank}: no complete profile in {self._profiled_iters} "
                            f"iterations (the backward hook did not report every layer)")
        self.profiler = None
        if self.tracer is None:
            self.timer.remove()
        # The step waits for the slowest rank: plan with the latest ready time of each layer.
        with self._guard("gathering the ranks' profiles"):
            profiles = self.base_comm.allgather(prof.profile())
        plan = self._make_and_share(lambda: slowest(profiles),
                                    f"profile of {len(prof)} iteration(s), slowest of "
                                    f"{self.size} rank(s)")
        with self._guard("agreement on the plan and the learnable layers"):
            agree_on_layers_and_plan(self.base_comm, self.names, self.counts, plan)
        self.executor.set_plan(plan)

    def _agree_on_requests(self) -> None:
        local = self._local_action() if self._local_action is not None else _SOLVER_ACTION_NONE
        with self._guard("agreement on stop/snapshot requests"):
            stop, snapshot = self.base_comm.any_true([local == _STOP, local == _SNAPSHOT])
        if stop and local != _STOP and self.rank == 0:
            log.info("Another rank asked to stop: stopping at iteration %d", self.solver.iter)
        self._stop = self._stop or stop
        self._agreed = _STOP if stop else _SNAPSHOT if snapshot else _SOLVER_ACTION_NONE

    def _agreed_action(self) -> str:
        """The solver's action function: what every rank agreed on (consumed once)."""
        action, self._agreed = self._agreed, _SOLVER_ACTION_NONE
        return action

    def should_stop(self) -> bool:
        return self._stop

    # ------------------------------------------------------------------ the end
    def summary(self) -> str | None:
        """Measured forward-to-reduced-gradients time beside the plan's prediction."""
        if self.plan is None or not self.grad_times:
            return None
        times = self.grad_times[1:] or self.grad_times  # the first after a plan change warms
        measured = statistics.median(times)
        predicted = self.plan.iteration_time
        whole = statistics.median(self.iteration_times[1:] or self.iteration_times)
        return (f"iteration (forward start to reduced gradients): measured {measured * 1e3:.2f}"
                f" ms (median of {len(times)}), predicted {predicted * 1e3:.2f} ms by plan "
                f"{self.plan.scheme} ({(measured / predicted - 1) * 100:+.1f}%); whole "
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


def wanted(args: Any, comm: Communicator) -> bool:
    """Whether `mgcaffe train` needs the distributed machinery: several ranks, or one rank
    asked for a trace, an emulated network or a plan."""
    return comm.size > 1 or any(getattr(args, f, None) for f in (
        "timeline", "emulate_network", "plan", "save_plan"))


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
