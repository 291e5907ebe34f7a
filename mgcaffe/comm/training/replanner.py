"""The plan a run trains with, and when it changes: the trainer's re-planner.

A run's plan goes through named phases (`Phase`):

- STARTUP_PROFILE: no plan yet; the first `profile_iters` iterations (more while the times
  still drift) are profiled with all gradients in one all-reduce after backward, so backward
  is timed undisturbed; then rank 0 plans from the slowest rank's times and every rank
  switches to the plan between the same two iterations.
  When the start-up benchmark's model is in doubt (`CostModel.doubt`: it misses some
  measured size beyond its spread) and a re-plan follows, the start-up plan is the
  conservative one: every gradient in one all-reduce after backward, as synceasgd, which no
  error of T can make slower than itself; the re-plan then plans from T corrected by the
  real messages.
- WARM_UP: the start-up plan runs until `replan_after` iterations later.
- REPLAN_PROFILE: a second, longer profile. Every message sent after backward in its
  undisturbed iterations (the plan's last ones, or the whole gradient at once) is timed as
  the rank that entered it last saw it; where the cost model's T lies outside the middle
  half of those messages of a size, T there becomes their median (`cost_fit.correct`)
  before the re-plan. With measured interference in the cost model the window alternates
  undisturbed iterations (the profile) with overlapped ones (all-reduces during backward),
  measuring in situ how much backward slows beside its all-reduces (rho) and how much those
  slow beside backward (sigma) (`insitu.py`). Both are estimates from other messages than
  the plan's own, so the model is then calibrated on the start-up plan's iterations as
  training runs them: the window's (among the overlapped ones, or the undisturbed ones for a
  plan of one message), which run between the profile's on the same machine, else its last
  ones in warm-up. The measured interference is scaled (`insitu.calibrate`) until the model
  predicts their median (the closing line's measure); where even none predicts more than
  the window measured, T is shortened instead, except at the sizes training measured.
  Then the re-plan, switched likewise.
- REPLAN_CHECK: the model the re-plan used can still be wrong where it was not measured (rho
  and sigma come from per-layer and start-up-plan messages, not the new plan's). When the
  re-plan changed the plan, its first `check_iters` iterations (forward start to the next
  forward start) are compared with the start-up plan's last ones in warm-up; a re-plan
  measured more than `CHECK_MARGIN` slower, with its lower quartile above the start-up plan's
  median (beyond the noise), is undone: the start-up plan runs on, predicted under the
  re-plan's model, and the log says why. Measured, not predicted, has the last word.
- FIXED: the plan is final (given by --plan or --profile, re-planned, or no re-plan asked).

Every transition happens on every rank at the same iteration: the counts that drive it are
the same everywhere, and the agreements it runs are collectives.
"""

from __future__ import annotations

import enum
import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...errors import CommError, MgcaffeError
from ..backends.communicator import Communicator
from ..model.cost import CostModel
from ..model.interference_search import grouping_lower_bound
from ..model.plan import Plan, load_plan
from ..model.profile import load_profile
from ..model.schemes import make_plan, scheme_named
from ..model.timeline import cycle, timeline
from ..runtime.timing import OnlineProfile, as_profile, median_profile, per_iteration_slowest
from .cost_source import SentMessages
from .gradient_comm import Guard
from .insitu import InSituResult, InSituWindow, adopt_in_situ, calibrate
from .options import Options
from .overlap import ForwardShape
from .startup import (
    agree_on_layers_and_plan,
    check_plan_sizes,
    describe_plan,
    describe_profile,
    in_wire_formats,
    plan_summary,
    synceasgd_groups,
)

log = logging.getLogger("mgcaffe.comm")

PROFILE_EXTENSION = 4  # profiling may run up to this many times profile_iters while drifting
CHECK_MARGIN = 0.05  # a re-plan measured this much slower than the start-up plan is undone
T_MIN_SCALE = 0.5  # the calibration shortens T to no less than half the start-up benchmark's


def _lower_quartile(values: list[float]) -> float:
    """The 25th percentile (the value itself for fewer than two)."""
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=4)[0]


class Phase(enum.Enum):
    """Where a run's plan stands (see the module docstring)."""

    STARTUP_PROFILE = "start-up profile"
    WARM_UP = "warm-up"
    REPLAN_PROFILE = "re-plan profile"
    REPLAN_CHECK = "re-plan check"
    FIXED = "fixed"


@dataclass
class Learnables:
    """What the re-planner knows of the net: its name, learnable layers and their sizes."""

    net_name: str
    names: list[str]
    counts: list[int]
    itemsize: int


def median_prediction(plan: Any, steps: list, cost: CostModel, net: Learnables,
                      shape: Any = None) -> float:
    """The median over the profiled iterations of the plan's timeline on each one's own
    times: what the measured median is compared with. Not the timeline of the median
    profile: where communication and backward end close together (where merging pays),
    each iteration ends with whichever is later that time, and the median of those maxima
    exceeds the maximum of the medians. With the measured per-layer forward and update times
    (`shape`) where the plan's schedule needs them."""
    index = {name: i + 1 for i, name in enumerate(net.names)}
    layers = [[index[n] for n in g] for g in plan.groups]
    schedule = getattr(plan, "schedule", None)

    def predict(step):
        profile = as_profile(step, net.net_name, net.names, net.counts)
        return cycle(ForwardShape.apply(profile, shape), cost, layers, schedule).iteration_time

    return statistics.median(predict(s) for s in steps)


class Replanner:
    """Makes, shares and switches the run's plan (a collective: every rank runs one).

    `initial_plan()` first; `start(executor, timer)` once the communication thread and the
    net's timer exist; then `after_iteration(it, ready)` after every iteration, which
    returns True when the plan was switched (measurements start over)."""

    def __init__(self, comm: Communicator, options: Options, net: Learnables,
                 cost: CostModel | None, guard: Guard):
        self.comm, self.options, self.net, self.cost, self.guard = (comm, options, net, cost,
                                                                     guard)
        self.rank, self.size = comm.rank, comm.size
        self.phase = Phase.FIXED
        self.plan: Any = None
        self.profile_dict: dict | None = None
        self.profiler: OnlineProfile | None = None
        self.profiled_iters = 0
        self.replan_at: int | None = None  # iteration at which the re-plan's profile starts
        self.window: InSituWindow | None = None
        self.plan_switches: list[tuple[int, str]] = []  # (iteration, digest), every rank
        self.startup_prediction: float | None = None  # the start-up plan's, once re-planned
        self.median_prediction: float | None = None  # median of the plan's per-iteration times
        self.in_situ: InSituResult | None = None  # what the window measured in situ
        self.scale: float | None = None  # the calibration's scale of the interference
        self.executor: Any = None
        self.timer: Any = None
        self.keep_timer = False  # the trace needs the timer after profiling too
        self.sent = SentMessages()  # the re-plan window's messages sent after backward
        self.scheme = options.scheme  # what is planned (the trainer may fall back)
        self.shape: ForwardShape | None = None  # per-layer forward/update times, scheduled
        self.forward_shape: Any = None  # the ranks' combined shape of the latest profile
        self.warmup_periods: list[float] = []  # the start-up plan's last periods in warm-up
        self.warmup_measured: list[float] = []  # ... and its closing-line measure there
        self.check_at: int | None = None  # iteration at which the re-plan is judged
        self.fallback: tuple[Any, float] | None = None  # (start-up plan, its prediction now)

    @property
    def probe_interference(self) -> tuple:
        """The start-up probe's rho points where in-situ ones replaced them; else ()."""
        found = self.in_situ is not None and self.in_situ.rho is not None
        return self.in_situ.probe if found else ()

    @property
    def check_iters(self) -> int:
        """Iterations of a changed re-plan measured before it is kept or undone."""
        return 2 * self.options.profile_iters

    @property
    def planning(self) -> bool:
        """Whether a profile (start-up or re-plan) is still to be measured or under way, or
        the re-plan still to be checked."""
        return self.phase is not Phase.FIXED

    @property
    def profiling(self) -> bool:
        """Whether this iteration's times are being profiled."""
        return self.phase in (Phase.STARTUP_PROFILE, Phase.REPLAN_PROFILE)

    # ------------------------------------------------------------------ the first plan
    def initial_plan(self) -> Any:
        """The plan to start with: final (--plan, --profile) or provisional (profiling)."""
        o = self.options
        if o.plan:
            plan = load_plan(o.plan)
            check_plan_sizes(plan, self.net.names, self.net.counts, self.net.itemsize, o.plan)
            self._adopt(plan, f"from {o.plan}")
            return plan
        if o.profile:
            return self._make_and_share(lambda: load_profile(o.profile),
                                        f"made from {o.profile}")
        self.phase = Phase.STARTUP_PROFILE
        self.profiler = OnlineProfile(self.net.net_name, self.net.names, self.net.counts, skip=1)
        if self.rank == 0:
            log.info("Profiling the first %d iterations (up to %d while the times drift), all "
                     "gradients in one all-reduce after backward meanwhile", o.profile_iters,
                     PROFILE_EXTENSION * o.profile_iters)
        return synceasgd_groups(self.net.names)

    def start(self, executor: Any, timer: Any, keep_timer: bool) -> None:
        """The communication thread and the net's timer the phases drive."""
        self.executor, self.timer, self.keep_timer = executor, timer, keep_timer

    def _make_and_share(self, get_profile: Callable[[], Any], where: str,
                        startup: bool = False) -> Any:
        """Rank 0 plans from get_profile(); every rank receives the plan (a collective).
        `startup`: the plan runs until a re-plan (conservative while T is in doubt)."""
        o = self.options
        payload = None
        if self.rank == 0:
            try:
                profile = get_profile()
                plan = make_plan(profile, self.cost, self.scheme,
                                 int(o.bucket_mb * (1 << 20))
                                 if scheme_named(self.scheme).bucket else None,
                                 nodes=o.emulate_nodes or self.size)
                if startup:
                    plan = self._conservative(profile, plan)
                bound = getattr(plan.schedule, "bound", None)
                if bound:  # the scheduler's search: its gap to the bound, not a cut DP
                    log.info("Plan %s: %s predicts %.3f ms, %.1f%% above the lower bound "
                             "%.3f ms%s", where, plan.scheme, plan.iteration_time * 1e3,
                             max(0.0, plan.iteration_time / bound - 1) * 100, bound * 1e3,
                             " (proven optimal)" if plan.exact else "")
                elif not plan.exact:
                    bound = grouping_lower_bound(profile, self.cost)
                    log.info("Plan %s: the search for the optimum was cut (too many states): "
                             "%s predicts %.3f ms, %.1f%% above the lower bound %.3f ms on any "
                             "grouping", where, plan.scheme, plan.iteration_time * 1e3,
                             max(0.0, plan.iteration_time / bound - 1) * 100, bound * 1e3)
                payload = ("ok", plan.to_dict(), profile.to_dict())
            except MgcaffeError as exc:  # every rank must learn why, not wait for a plan
                payload = ("error", str(exc), None)
        with self.guard("broadcast of the plan"):
            status, body, profile_dict = self.comm.broadcast(payload, root=0)
        if status == "error":
            raise CommError(f"rank {self.rank}: rank 0 could not plan: {body}")
        plan = Plan.from_dict(body, source="plan from rank 0")
        self.profile_dict = profile_dict
        if self.rank == 0:
            log.debug("%s", describe_profile(profile_dict, where))
        self._adopt(plan, where)
        return plan

    def _conservative(self, profile: Any, plan: Plan) -> Plan:
        """The start-up plan: `plan`, or synceasgd's one all-reduce after backward (under
        the run's scheme name) when T is in doubt and `plan` sends more messages. Kept as
        they are: a scheme whose groups T does not choose (wfbp, synceasgd, buckets: what
        the user asked for) and a schedule plan (it decides more than groups)."""
        doubt = getattr(self.cost, "doubt", "")
        if (not doubt or plan.schedule is not None or len(plan.groups) == 1
                or scheme_named(plan.scheme).fixed):
            return plan
        # still the run's scheme (its --comm value), with synceasgd's one group
        sync = timeline(profile, self.cost, [list(reversed(profile.names))],
                        scheme=plan.scheme, nodes=plan.nodes)
        log.info("Start-up plan: one all-reduce after backward (as synceasgd) until the "
                 "re-plan, not %s's %d messages: %s", plan.scheme, len(plan.groups), doubt)
        return sync

    def _adopt(self, plan: Any, where: str) -> None:
        self.plan = plan
        if self.rank == 0:
            log.info("%s", plan_summary(plan, where))
            log.debug("%s", describe_plan(plan))
            if self.options.save_plan:
                plan.save(self.options.save_plan)
                log.info("Wrote the plan to %s", self.options.save_plan)

    # ------------------------------------------------------------------ every iteration
    def may_switch(self, it: int) -> bool:
        """Whether `after_iteration(it, ...)` may change what the thread runs (its work of the
        last iteration must be done first)."""
        return self.profiling or (self.phase is Phase.WARM_UP and it >= self.replan_at) or \
            (self.phase is Phase.REPLAN_CHECK and it >= self.check_at)

    def after_iteration(self, it: int, ready: dict[int, float],
                        gates: dict[int, float] | None = None,
                        updates: list[float] | None = None,
                        periods: list[float] | None = None,
                        measured: list[float] | None = None,
                        closing: float | None = None) -> bool:
        """Advance the phase after iteration `it - 1` (the solver's count already includes
        it), given each learnable layer's gradient-ready time (and, per layer, the seconds
        the forward waited for gradients and updated: `gates`, and the update times) and
        the iterations measured since the plan last switched (`periods`: forward start to
        the next forward start, the first one still under the plan before; `measured`: the
        same iterations as the closing line measures them), and this iteration's forward
        start to reduced gradients (`closing`); True when the plan switched."""
        if self.profiling:
            return self._profile_step(it, ready, gates or {}, updates, closing)
        if self.phase is Phase.WARM_UP and it >= self.replan_at:
            self.warmup_periods = (periods or [])[1:][-self.check_iters:]
            self.warmup_measured = (measured or [])[1:][-self.check_iters:]
            self._start_replan_profile(it)
        if self.phase is Phase.REPLAN_CHECK and it >= self.check_at:
            return self._check_replan(it, (periods or [])[1:])
        return False

    def _profile_step(self, it: int, ready: dict[int, float], gates: dict[int, float],
                      updates: list[float] | None, closing: float | None) -> bool:
        prof, window = self.profiler, self.window
        overlapped = window is not None and self.profiled_iters % 2 == 1
        if self.phase is Phase.REPLAN_PROFILE and not overlapped:
            self._record_sent(ready)
        self.profiled_iters += 1  # counted alike on every rank: the switch is a collective
        if window is not None:
            window.add_time(closing if self.profiled_iters > 1 else None)
        if overlapped:
            window.add_overlapped(self.timer.forward_end, ready, self.executor.intervals or [],
                                  self.cost, len(self.net.names))
            self.executor.intervals = []
            self.sent.seen = 0
        elif len(ready) == len(self.net.names):
            # t_f without the waits of a layer-by-layer plan for the previous gradients
            prof.add(self.timer.forward_start + sum(gates.values()), self.timer.forward_end,
                     ready)
            if self.shape is not None:
                self.shape.sample(self.timer, gates, updates)
        if window is not None:  # the next iteration's kind: odd ones overlap
            self.executor.set_plan(self._as_sent(window.groups_for(
                self.profiled_iters, synceasgd_groups(self.net.names))))
        replanning = self.phase is Phase.REPLAN_PROFILE
        wanted_iters = self.options.profile_iters
        if replanning:  # after warm-up: a fixed, longer window for a stable median
            wanted_iters = PROFILE_EXTENSION * self.options.profile_iters
        if self.profiled_iters < wanted_iters:
            return False
        if not replanning and self.profiled_iters < PROFILE_EXTENSION * wanted_iters:
            # Warm-up may outlast the first iterations: go on (all ranks alike) while any
            # rank's older and newer samples disagree, then plan from the newest ones.
            with self.guard("agreement on the profile's stability"):
                drifting = self.comm.any_true([not prof.stable()])[0]
            if drifting:
                return False
        if not len(prof):
            raise CommError(f"rank {self.rank}: no complete profile in {self.profiled_iters} "
                            f"iterations (the backward hook did not report every layer)")
        recent = max(1, wanted_iters - 1)  # the first of a phase is skipped
        if self.rank == 0:
            log.debug("%s", prof.describe_spread(recent))
        if window is not None:
            self.window, self.executor.intervals = None, None
            self.in_situ = adopt_in_situ(self.comm, self.guard, self.cost, window,
                                         [b for _, b in prof.samples])
            self.cost = self.in_situ.cost
        self.profiler = None
        if not self.keep_timer:
            self.timer.remove()
        self._replan(it, prof, recent, replanning, window)
        return True

    def _replan(self, it: int, prof: OnlineProfile, recent: int, replanning: bool,
                window: InSituWindow | None = None) -> None:
        """Plan from the profile's last `recent` iterations and switch every rank to it."""
        # The step waits for the slowest rank: plan with the latest ready time of each layer,
        # iteration by iteration.
        with self.guard("gathering the ranks' profiles"):
            steps = per_iteration_slowest(self.comm.allgather(prof.window(recent)))
        shape = None
        if self.shape is not None:
            with self.guard("gathering the ranks' forward and update times"):
                shape = ForwardShape.combine(self.comm.allgather(self.shape.mine(recent)))
            self.shape.samples.clear()
        self.forward_shape = shape
        before = self.plan
        where = (f"the median profile of iterations {it - min(recent, len(prof))}-{it - 1} "
                 f"(slowest of {self.size} ranks)")
        net = self.net
        startup_now = None  # the start-up plan's prediction under the re-plan's model
        if replanning:
            self.cost = self.sent.correct(self.comm, self.guard, self.cost,
                                          sum(net.counts) * net.itemsize)
            startup_now = self._calibrate(before, steps, shape,
                                          window.plan_times if window is not None else [])
        plan = self._make_and_share(
            lambda: ForwardShape.apply(median_profile(steps, net.net_name, net.names,
                                                      net.counts), shape),
            f"re-planned after warm-up from {where}" if replanning else f"made from {where}",
            startup=not replanning and self.options.replan_after > 0)
        with self.guard("agreement on the plan and the learnable layers"):
            agree_on_layers_and_plan(self.comm, net.names, net.counts, plan, it)
        # Switched here, between iterations, on every rank alike (the agreement above
        # compared the iteration): the next iteration communicates by the new plan.
        self.executor.set_plan(plan)
        before_median = self.median_prediction
        self.median_prediction = median_prediction(plan, steps, self.cost, net, shape)
        self.plan_switches.append((it, plan.digest()))
        self.phase = Phase.FIXED
        if replanning:
            self.startup_prediction = before_median
            changed = plan.digest() != before.digest()
            check = changed and len(self.warmup_periods) >= 2
            if check:
                if startup_now is None:
                    startup_now = median_prediction(before, steps, self.cost, net, shape)
                self.fallback = (before, startup_now)
                self.phase = Phase.REPLAN_CHECK
                self.check_at = it + self.check_iters + 1  # the first period is the old plan's
            if self.rank == 0:
                log.info("Re-planned at iteration %d: predicted iteration %.2f ms (the "
                         "start-up profile predicted %.2f ms); plan %s %s the start-up plan's "
                         "groups%s", it, self.median_prediction * 1e3, before_median * 1e3,
                         plan.digest()[:12],
                         "keeps" if plan.groups == before.groups else "changes",
                         f"; measuring it {self.check_iters} iterations against the start-up "
                         f"plan (predicted {self.fallback[1] * 1e3:.2f} ms now)" if check
                         else "")
        elif self.options.replan_after > 0:
            self.phase = Phase.WARM_UP
            self.replan_at = it + self.options.replan_after

    def _check_replan(self, it: int, measured: list[float]) -> bool:
        """Keep the re-plan, or undo it when it measured slower than the start-up plan
        beyond the noise (a collective: every rank decides from the same numbers)."""
        before, predicted = self.fallback
        self.fallback, self.check_at, self.phase = None, None, Phase.FIXED
        mine = (statistics.median(self.warmup_periods), statistics.median(measured),
                _lower_quartile(measured))
        with self.guard("agreement on the re-plan's measured time"):
            rows = self.comm.allgather(mine)
        old, new, new_low = (max(row[i] for row in rows) for i in range(3))
        undo = new > old * (1 + CHECK_MARGIN) and new_low > old
        if self.rank == 0:
            log.info("Re-plan %s: it measured %.2f ms per iteration (median of %d; lower "
                     "quartile %.2f) against %.2f ms for the start-up plan (median of its last "
                     "%d in warm-up; forward start to the next forward start, slowest rank)%s",
                     "undone" if undo else "kept", new * 1e3, len(measured), new_low * 1e3,
                     old * 1e3, len(self.warmup_periods),
                     f": more than {CHECK_MARGIN:.0%} slower beyond the noise, so the start-"
                     f"up plan runs on, predicted {predicted * 1e3:.2f} ms by the re-plan's "
                     f"model (predicted {self.median_prediction * 1e3:.2f} ms for the re-plan: "
                     f"the model errs for it)" if undo else "")
        if not undo:
            return False
        self.executor.set_plan(before)
        self.median_prediction = predicted
        self.plan_switches.append((it, before.digest()))
        self._adopt(before, f"kept at iteration {it} (the re-plan undone)")
        return True

    def _start_replan_profile(self, it: int) -> None:
        """Warm-up is over: profile again on the iterations from here, then re-plan once.
        Every rank starts at the same iteration (the count is the same everywhere).

        With a cost model that has no interference term, the profile is taken while the
        start-up plan runs: backward then includes what its overlapped all-reduces cost it
        (the communication thread's CPU time and wake-ups, the interpreter lock), which the
        model cannot see otherwise. With measured interference, the model adds that itself,
        so the profile is taken as at start-up (one all-reduce after backward, backward
        undisturbed), so as not to count it twice."""
        self.phase = Phase.REPLAN_PROFILE
        self.replan_at = None
        self.profiled_iters = 0
        self.profiler = OnlineProfile(self.net.net_name, self.net.names, self.net.counts, skip=1)
        self.timer.install()
        self.sent = SentMessages()
        self.executor.intervals = []  # every message's span: T is checked against them
        runs_on = not getattr(self.cost, "interferes", False)
        if not runs_on:
            self.executor.set_plan(self._as_sent(synceasgd_groups(self.net.names)))
        # on a GPU stream the all-reduce calls return at once: their spans are not the time
        # a message is in flight, so rho cannot be measured from them
        measure = not runs_on and self.executor.mode != "stream"
        if measure:
            # Measure rho in situ: alternate undisturbed iterations (the profile) with
            # overlapped ones (all-reduces while backward runs): WFBP's per-layer messages
            # (every layer's size), and the running plan's groups when it merges (the sizes
            # it will send).
            overlapped = [[[n] for n in reversed(self.net.names)]]
            groups = [list(g) for g in getattr(self.plan, "groups", ())]
            if 1 < len(groups) < len(self.net.names):
                overlapped.append(groups)
            # the start-up plan's own iterations here run as training runs them, unless it
            # has a schedule (its next forward overlaps the messages: not between profiles)
            own = groups if getattr(self.plan, "schedule", None) is None else None
            self.window = InSituWindow(overlapped, own)
            self.window.groups_for(0, synceasgd_groups(self.net.names))
        if self.rank == 0:
            log.info("Warm-up over at iteration %d: profiling %d more iterations to re-plan "
                     "once", it, PROFILE_EXTENSION * self.options.profile_iters)
            log.debug("Meanwhile %s", "the plan runs on (the profile includes what its "
                      "overlapped all-reduces cost backward)" if runs_on else
                      "all gradients go in one all-reduce after backward" if not measure else
                      "iterations alternate between all gradients in one all-reduce after "
                      "backward (the profile) and all-reduces during backward, per layer or "
                      "by the plan's groups (to measure how much backward slows beside them)")

    def _as_sent(self, chosen: Any) -> Any:
        """A window iteration's groups in the wire formats training sends them in."""
        net = self.net
        return in_wire_formats(chosen, self.plan, self.cost, net.names, net.counts,
                               net.itemsize)

    # ------------------------------------------------------------------ T from real messages
    def _record_sent(self, ready: dict[int, float]) -> None:
        """Keep this iteration's messages sent after backward ended (undisturbed by it); the
        first iteration of the window warms and is not counted."""
        intervals = self.executor.intervals
        if intervals is None or self.executor.mode == "stream":
            return  # a GPU stream's calls return at once: their spans are not flight times
        self.sent.record(intervals, ready, len(self.net.names), self.profiled_iters > 0,
                         keep=self.window is not None)

    # ------------------------------------------------------------------ in situ
    def _calibrate(self, before: Any, steps: list, shape: Any, times: list) -> float | None:
        """Scale the model's interference (and, where even none predicts more than the window
        measured, T at the sizes training did not measure) so that it predicts the start-up
        plan's iterations as they ran in training: the window's (`times`, interleaved with
        the profile, so that both saw the same machine) where there were at least two, else
        its last ones in warm-up (a schedule, or nothing measured in situ). Every rank
        computes the same from gathered numbers. Returns the start-up plan's prediction under
        the model kept (None when there was nothing to calibrate)."""
        where, samples = "in the re-plan window, between its profiled iterations", times
        if len(times) < 2:
            where, samples = "in warm-up", self.warmup_measured
        if not getattr(self.cost, "interferes", False) or len(samples) < 2:
            return None
        with self.guard("gathering the start-up plan's measured iterations"):
            measured = max(self.comm.allgather(statistics.median(samples)))
        base, net = self.cost, self.net

        def predict(cost: CostModel) -> float:
            return median_prediction(before, steps, cost, net, shape)

        self.scale = k = calibrate(lambda x: predict(base.scaled_interference(x)), measured)
        self.cost = base.scaled_interference(k)
        c = 1.0
        # even no interference predicts more: training's messages ran faster than T, where
        # the window measured them (the warm-up ran before the profile and T's check: its
        # machine may not be theirs, and T is the window's)
        if k == 0.0 and samples is times:
            keep = self.sent.sizes  # T measured in training there
            unslowed = self.cost
            c = calibrate(lambda x: predict(unslowed.scaled_time(x, keep)), measured,
                          lo=T_MIN_SCALE, hi=1.0)
            self.cost = unslowed.scaled_time(c, keep)
        predicted = predict(self.cost)
        if self.rank == 0:
            log.info("The start-up plan measured %.2f ms per iteration %s (median of %d, "
                     "slowest rank); the model predicts %.2f ms for it with the measured rho "
                     "and sigma, %.2f ms with none: the re-plan uses them x%.2f%s (%.2f ms)",
                     measured * 1e3, where, len(samples), predict(base) * 1e3,
                     predict(base.scaled_interference(0.0)) * 1e3, k,
                     f" and T x{c:.2f} where training did not measure it" if c != 1.0 else "",
                     predicted * 1e3)
        return predicted
