"""The re-planner's phases, driven without MPI, a net or a thread: synthetic layer times on
a simulated clock, a recording executor and timer, one rank alone or ranks on LocalWorld."""

from __future__ import annotations

import json
import logging
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
from comm_fakes import run_ranks

from mgcaffe.comm.backends.local import LocalWorld, SingleCommunicator
from mgcaffe.comm.model.cost import CostModel
from mgcaffe.comm.training.options import Options
from mgcaffe.comm.training.replanner import (
    PROFILE_EXTENSION,
    Learnables,
    Phase,
    Replanner,
    median_prediction,
)
from mgcaffe.comm.training.startup import in_wire_formats
from mgcaffe.errors import CommError

pytestmark = pytest.mark.timeout(60)

NAMES = ["conv1", "conv2", "fc1"]  # input side first
LAYERS = Learnables("net", NAMES, [100, 200, 300], 4)
PROBE = ((64, 0.05),)


class Executor:
    """Records every plan (its groups) it is switched to; `intervals` as the real one."""

    def __init__(self, mode: str = "host"):
        self.mode = mode
        self.intervals = None
        self.plans: list[list[list[str]]] = []
        self.formats: list = []  # each plan's wire formats (None: float32, no list given)

    def set_plan(self, plan):
        groups = plan if isinstance(plan, list) else plan.groups
        self.plans.append([list(g) for g in groups])
        self.formats.append(list(getattr(plan, "formats", None) or ()) or None)

    @property
    def overlapping(self) -> bool:  # more than the one all-reduce after backward
        return len(self.plans[-1]) > 1


class Timer:
    def __init__(self):
        self.forward_start = self.forward_end = 0.0
        self.installed = 0
        self.removed = 0

    def install(self):
        self.installed += 1

    def remove(self):
        self.removed += 1


class Driver:
    """Runs iterations on a simulated clock: forward 1 s, then each layer's backward
    `layer` s; in an overlapped iteration of the in-situ window (with `in_flight`) one
    message is in flight through the whole backward, and each layer takes `slow` x longer."""

    def __init__(self, replanner: Replanner, *, layer: float = 1.0, slow: float = 1.0,
                 in_flight: bool = True, mode: str = "host"):
        self.r, self.layer, self.slow, self.in_flight = replanner, layer, slow, in_flight
        self.executor, self.timer = Executor(mode), Timer()
        self.executor.set_plan(replanner.initial_plan())
        replanner.start(self.executor, self.timer, keep_timer=False)
        self.clock = 0.0
        self.it = 0
        self.phases: list[tuple[int, Phase]] = [(0, replanner.phase)]
        self.switches: list[int] = []
        self.periods: list[float] | None = None  # measured as the trainer does, when a list
        self._start: float | None = None

    def extra(self) -> float:
        """Seconds the iteration takes after backward beyond the 0.5 s tail."""
        return 0.0

    def step(self, ready_layers: int | None = None) -> None:
        if self.periods is not None:  # the trainer: forward start to the next forward start
            if self._start is not None and self.r.plan is not None and not self.r.profiling:
                self.periods.append(self.clock - self._start)
            self._start = self.clock
        overlapped = (self.in_flight and self.executor.intervals is not None
                      and self.executor.overlapping)
        per_layer = self.layer * (self.slow if overlapped else 1.0)
        self.timer.forward_start = self.clock
        self.timer.forward_end = t = self.clock + 1.0
        ready = {}
        for k in range(len(NAMES), 0, -1):
            t += per_layer
            ready[k] = t
        if overlapped:
            self.executor.intervals.append((self.timer.forward_end, t, 64))
        if ready_layers is not None:
            ready = {k: v for k, v in ready.items() if k <= ready_layers}
        start, self.clock = self.timer.forward_start, t + 0.5 + self.extra()
        self.it += 1
        if self.r.after_iteration(self.it, ready, periods=self.periods, measured=self.periods,
                                  closing=self.clock - start):
            self.switches.append(self.it)
            if self.periods is not None:
                self.periods.clear()
        if self.r.phase is not self.phases[-1][1]:
            self.phases.append((self.it, self.r.phase))

    def run(self, n: int) -> Driver:
        for _ in range(n):
            self.step()
        return self


WFBP_COST = CostModel(0.5, 0.0)  # every message 0.5 s


def replanner(communicator=None, cost=WFBP_COST, **options) -> Replanner:
    options = {"comm": "wfbp", "profile_iters": 3, "replan_after": 2, **options}
    return Replanner(communicator or SingleCommunicator(), Options(**options), LAYERS, cost,
                     lambda what, timeout=None: nullcontext())


def test_start_up_profile_warm_up_re_plan_window_then_switched_once(caplog):
    r = replanner()
    with caplog.at_level(logging.INFO, logger="mgcaffe"):
        d = Driver(r).run(30)
    # profile_iters = 3 (stable: fewer than 4 samples), warm-up 2, window 4 x 3 = 12
    assert d.phases == [(0, Phase.STARTUP_PROFILE), (3, Phase.WARM_UP),
                        (5, Phase.REPLAN_PROFILE), (17, Phase.FIXED)]
    assert d.switches == [3, 17]
    assert [it for it, _ in r.plan_switches] == [3, 17]
    assert not r.planning and not r.profiling
    # provisional: one message after backward; then the plans (wfbp: one per layer, output
    # side first); no interference: the window profiles under the running plan
    assert d.executor.plans == [[["fc1", "conv2", "conv1"]], [["fc1"], ["conv2"], ["conv1"]],
                                [["fc1"], ["conv2"], ["conv1"]]]
    assert d.timer.installed == 1 and d.timer.removed == 2  # re-installed for the window
    # each layer takes 1 s, messages 0.5 s: wfbp ends 0.5 s after the last gradient
    assert r.median_prediction == pytest.approx(1.0 + 3.0 + 0.5)
    assert r.startup_prediction == pytest.approx(4.5)
    assert [layer["backward_time"] for layer in r.profile_dict["layers"]] == [1.0, 1.0, 1.0]
    assert "Re-planned at iteration 17: predicted iteration 4500.00 ms" in caplog.text
    assert r.in_situ is None and r.window is None


def test_no_re_plan_asked_runs_on_after_the_start_up_plan():
    r = replanner(replan_after=0)
    d = Driver(r).run(20)
    assert d.phases == [(0, Phase.STARTUP_PROFILE), (3, Phase.FIXED)]
    assert d.switches == [3] and r.replan_at is None and not r.planning


def test_a_drifting_start_up_profile_goes_on_up_to_the_extension():
    steady = Driver(replanner(profile_iters=5, replan_after=0)).run(30)
    assert steady.switches == [5]

    r = replanner(profile_iters=5, replan_after=0)
    d = Driver(r)
    for _ in range(30):
        d.layer *= 1.5  # every iteration slower: the halves never agree
        d.step()
    assert d.switches == [PROFILE_EXTENSION * 5]


def test_an_incomplete_profile_stops_the_run_with_a_message():
    d = Driver(replanner())
    with pytest.raises(CommError, match="rank 0: no complete profile in 3 iterations"):
        for _ in range(3):
            d.step(ready_layers=2)


def test_in_situ_window_alternates_and_adopts_rho_and_sigma():
    # rho = 0.5: each layer takes 1.5 s beside a message; sigma = 1.5: the message, modelled
    # at a = 3 s, takes 4.5 s, all of it during backward
    r = replanner(cost=CostModel(3.0, 0.0).with_interference(PROBE))
    d = Driver(r, slow=1.5)
    d.run(5)
    assert r.phase is Phase.REPLAN_PROFILE and r.window is not None
    assert d.executor.intervals == []
    d.run(12)
    assert d.phases[-2:] == [(5, Phase.REPLAN_PROFILE), (17, Phase.FIXED)]
    # the window (from plan 2 on: provisional, start-up plan): one message after backward
    # and per layer (overlapped) in turn, 12 iterations; its last switch is to the re-plan
    window = [len(p) for p in d.executor.plans[2:-1]]
    assert window == [1] + [3, 1] * 6
    assert d.executor.intervals is None and r.window is None
    assert r.probe_interference == PROBE
    assert r.in_situ.rho.single == pytest.approx(0.5)
    assert r.in_situ.cost.interference == ((64, pytest.approx(0.5)),)
    assert r.in_situ.sigma.single == pytest.approx(1.5)
    assert r.in_situ.cost.comm_slowdown == ((64, pytest.approx(1.5)),)
    assert r.in_situ.comm_slowdown == pytest.approx(1.5)
    assert r.plan.interference == r.cost.interference


def test_a_compressing_model_sends_the_re_plan_window_compressed():
    # 5 + 0.01 s/B on the link and casts of 1 us/B: every group (400-2400 B) is cheaper as
    # float16, so the one all-reduce after backward and the per-layer messages of the window
    # travel as float16 too (the calibration compares them with a compressed prediction);
    # the start-up profile's stand-in stays float32 (compute times do not depend on it, and
    # the first, largest gradients keep every bit)
    cost = CostModel(5.0, 1e-2, wires=("float32", "float16"), cast=(("float16", 1e-6),))
    assert cost.wire_for(400) == cost.wire_for(2400) == "float16"
    r = replanner(cost=cost.with_interference(PROBE))
    d = Driver(r, slow=1.5).run(17)
    assert d.phases[-2:] == [(5, Phase.REPLAN_PROFILE), (17, Phase.FIXED)]
    assert [len(p) for p in d.executor.plans[2:-1]] == [1] + [3, 1] * 6  # the window
    assert d.executor.formats[0] is None  # the start-up profile
    for groups, formats in zip(d.executor.plans[1:], d.executor.formats[1:]):
        assert formats == ["float16"] * len(groups)
    # no compression offered: every plan as it was, without formats
    plain = Driver(replanner(cost=CostModel(5.0, 1e-2).with_interference(PROBE))).run(17)
    assert set(map(str, plain.executor.formats)) == {"None"}


def test_in_wire_formats_keeps_the_plans_own_formats_for_its_own_groups():
    cost = CostModel(5.0, 1e-2, wires=("float32", "float16"), cast=(("float16", 1e-6),))
    plan = SimpleNamespace(groups=[["fc1"], ["conv2", "conv1"]],
                           formats=["float32", "bfloat16"])
    own = in_wire_formats([["fc1"], ["conv2", "conv1"]], plan, cost, NAMES, [100, 200, 300], 4)
    assert own.formats == ["float32", "bfloat16"]  # as the plan says, not the model
    other = in_wire_formats([["fc1", "conv2", "conv1"]], plan, cost, NAMES, [100, 200, 300], 4)
    assert other.groups == [["fc1", "conv2", "conv1"]] and list(other.formats) == ["float16"]
    plain = CostModel(5.0, 1e-2)
    assert in_wire_formats(plan, plan, plain, NAMES, [100, 200, 300], 4) is plan


def test_in_situ_window_without_messages_keeps_the_probe(caplog):
    r = replanner(cost=CostModel(3.0, 0.0).with_interference(PROBE))
    d = Driver(r, in_flight=False)  # nothing is ever in flight during backward
    d.run(5)
    with caplog.at_level(logging.INFO, logger="mgcaffe"):
        d.run(12)
    assert d.switches == [3, 17] and r.phase is Phase.FIXED
    assert r.in_situ.rho is None and r.in_situ.sigma is None
    # the start-up plan's prediction (11 s: three messages of 3 s one after another) does
    # not depend on the interference: its iterations say nothing about it
    assert r.scale == 1.0 and r.cost.interference == r.in_situ.cost.interference == PROBE
    assert "no all-reduce was in flight during backward" in caplog.text


def test_a_gpu_stream_re_plans_without_measuring_in_situ():
    r = replanner(cost=CostModel(3.0, 0.0).with_interference(PROBE))
    d = Driver(r, mode="stream").run(5)
    assert r.phase is Phase.REPLAN_PROFILE and r.window is None  # profiles, measures nothing
    d.run(15)
    # measured interference: the window profiles undisturbed (one message after backward)
    assert d.executor.plans[2:-1] == [[["fc1", "conv2", "conv1"]]]
    assert d.switches == [3, 17] and r.cost.interference == PROBE


def test_ranks_switch_together_on_the_slowest_ranks_profile():
    comms = LocalWorld(2).communicators()
    drivers = [None, None]

    def rank_main(rank):
        drivers[rank] = Driver(replanner(comms[rank]), layer=1.0 + rank).run(20)

    _, errors = run_ranks(2, rank_main, timeout=30)
    assert errors == [None, None]
    r0, r1 = (d.r for d in drivers)
    assert r0.plan_switches == r1.plan_switches and [i for i, _ in r0.plan_switches] == [3, 17]
    assert [layer["backward_time"] for layer in r1.profile_dict["layers"]] == [2.0, 2.0, 2.0]
    assert r0.median_prediction == r1.median_prediction == pytest.approx(1.0 + 6.0 + 0.5)


def test_plan_and_profile_files_are_final_from_the_start(tmp_path):
    profile = {"model": "net", "forward_time": 1.0, "layers": [
        {"name": n, "params": c, "backward_time": 1.0} for n, c in zip(NAMES, LAYERS.counts)]}
    (tmp_path / "p.json").write_text(json.dumps(profile))
    r = replanner(profile=str(tmp_path / "p.json"), save_plan=str(tmp_path / "plan.json"))
    d = Driver(r).run(10)
    assert d.phases == [(0, Phase.FIXED)] and d.switches == [] and not r.planning
    assert d.executor.plans == [[["fc1"], ["conv2"], ["conv1"]]]
    assert r.profile_dict["forward_time"] == 1.0

    r = replanner(cost=None, plan=str(tmp_path / "plan.json"))
    d = Driver(r).run(10)
    assert d.phases == [(0, Phase.FIXED)] and d.switches == []
    assert [list(g) for g in r.plan.groups] == [["fc1"], ["conv2"], ["conv1"]]


def test_median_prediction_is_the_median_of_per_iteration_timelines():
    net = Learnables("m", ["a"], [1], 4)

    class OneGroup:
        groups = [["a"]]

    # one layer, one message of 1 s after its backward: each iteration t_f + t_b + 1
    steps = [(0.0, [1.0]), (0.0, [5.0]), (0.0, [2.0])]
    assert median_prediction(OneGroup, steps, CostModel(1.0, 0.0), net) == pytest.approx(3.0)


class AfterBackward(Driver):
    """Each iteration also sends one message of `nbytes` after backward, taking `seconds`."""

    def __init__(self, replanner: Replanner, nbytes: int, seconds: float):
        self.nbytes, self.seconds = nbytes, seconds
        super().__init__(replanner)

    def step(self, ready_layers: int | None = None) -> None:
        if self.executor.intervals is not None:
            end = self.clock + 1.0 + len(NAMES) * self.layer  # this iteration's backward end
            self.executor.intervals.append((end + 0.01, end + 0.01 + self.seconds,
                                            self.nbytes))
        super().step(ready_layers)


def test_re_plan_corrects_T_where_the_window_messages_differ(caplog):
    r = replanner()
    with caplog.at_level(logging.INFO, logger="mgcaffe"):
        AfterBackward(r, 400, 0.8).run(30)
    # conv1's 400 B message took 0.8 s where the line said 0.5 s: T there is the measured
    # median now, and the larger sizes (start-up points) yield so that T never decreases
    assert [s.nbytes for s in r.sent.corrections] == [400]
    assert r.cost.time(400) == pytest.approx(0.8) and r.cost.time(1200) == pytest.approx(0.8)
    assert r.cost.time(256) == pytest.approx(0.5)  # untouched below the measured size
    # wfbp: fc1 ready at 2 s ends 2.8, conv2 3 -> 3.8, conv1 4 -> 4.8 (was 4.5 by the line)
    assert r.median_prediction == pytest.approx(4.8)
    assert r.startup_prediction == pytest.approx(4.5)
    assert "corrected from the window's messages at 0.0004 MB (500 -> 800 ms, 11 messages)" \
        in caplog.text


def test_re_plan_keeps_T_where_the_window_messages_agree(caplog):
    r = replanner()
    with caplog.at_level(logging.INFO, logger="mgcaffe"):
        AfterBackward(r, 400, 0.5).run(30)
    assert r.sent.corrections == [] and r.cost is WFBP_COST
    assert r.median_prediction == pytest.approx(4.5)
    assert "checked against 11 message(s) of 1 size(s)" in caplog.text
    assert "T holds within the middle half of them" in caplog.text


def test_a_doubtful_T_starts_with_one_all_reduce_after_backward_until_the_re_plan(caplog):
    doubtful = CostModel(0.5, 0.0, doubt="the all-reduce model misses 1 measured size(s)")
    r = replanner(cost=doubtful, comm="mgwfbp")
    with caplog.at_level(logging.INFO, logger="mgcaffe"):
        d = Driver(r).run(30)
    # provisional, then synceasgd's one message as the start-up plan, then the optimum's
    # three (messages of 0.5 s beside layers of 1 s) at the re-plan (nothing contradicted T)
    assert d.executor.plans == [[["fc1", "conv2", "conv1"]], [["fc1", "conv2", "conv1"]],
                                [["fc1"], ["conv2"], ["conv1"]]]
    assert d.switches == [3, 17] and r.plan.scheme == "mgwfbp"
    assert r.startup_prediction == pytest.approx(1.0 + 3.0 + 0.5)  # one message after all
    assert ("Start-up plan: one all-reduce after backward (as synceasgd) until the re-plan, "
            "not mgwfbp's 3 messages: the all-reduce model misses 1") in caplog.text


def test_a_doubtful_T_leaves_a_scheme_whose_groups_it_does_not_choose(caplog):
    """--comm=wfbp is one message per layer whatever T says: the user's choice stands."""
    r = replanner(cost=CostModel(0.5, 0.0, doubt="far off"))
    with caplog.at_level(logging.INFO, logger="mgcaffe"):
        d = Driver(r).run(30)
    assert d.executor.plans[1:] == [[["fc1"], ["conv2"], ["conv1"]]] * 2
    assert "Start-up plan" not in caplog.text


def test_a_doubtful_T_without_a_re_plan_keeps_the_scheme():
    r = replanner(cost=CostModel(0.5, 0.0, doubt="far off"), replan_after=0)
    d = Driver(r).run(10)
    assert d.executor.plans[-1] == [["fc1"], ["conv2"], ["conv1"]]


class Slower(Driver):
    """Measures its iterations; under a plan of several messages each takes the next of
    `extra` (in turn) more seconds: what the model did not see."""

    def __init__(self, replanner: Replanner, extra: list[float], **kwargs):
        self.extras, self.n = extra, 0
        super().__init__(replanner, **kwargs)
        self.periods = []

    def extra(self) -> float:
        if len(self.executor.plans[-1]) == 1:
            return 0.0
        self.n += 1
        return self.extras[(self.n - 1) % len(self.extras)]


def doubtful_mgwfbp(communicator=None) -> Replanner:
    """Starts with one message after backward (T in doubt) and re-plans to three: each
    message 0.5 s beside layers of 1 s."""
    return replanner(communicator, cost=CostModel(0.5, 0.0, doubt="in doubt"), comm="mgwfbp",
                     replan_after=8)


def test_a_re_plan_measured_slower_than_the_start_up_plan_is_undone(caplog):
    r = doubtful_mgwfbp()
    with caplog.at_level(logging.INFO, logger="mgcaffe"):
        d = Slower(r, [2.0]).run(40)
    # warm-up 3-11, re-planned at 23 to three messages; measured 2 * profile_iters = 6
    # iterations of it (6.5 s each against 4.5 s for the one message), undone at 23 + 6 + 1
    assert d.phases[-3:] == [(11, Phase.REPLAN_PROFILE), (23, Phase.REPLAN_CHECK),
                             (30, Phase.FIXED)]
    assert d.switches == [3, 23, 30] and [i for i, _ in r.plan_switches] == [3, 23, 30]
    assert d.executor.plans[-2:] == [[["fc1"], ["conv2"], ["conv1"]],
                                     [["fc1", "conv2", "conv1"]]]
    assert [list(g) for g in r.plan.groups] == [["fc1", "conv2", "conv1"]]
    assert r.median_prediction == pytest.approx(4.5)  # one message 0.5 s after backward
    assert ("Re-plan undone: it measured 6500.00 ms per iteration (median of 6; lower quartile "
            "6500.00) against 4500.00 ms for the start-up plan (median of its last 6 in "
            "warm-up") in caplog.text
    assert "predicted 4500.00 ms by the re-plan's model" in caplog.text
    d.run(10)
    assert d.switches == [3, 23, 30] and not r.planning  # no more switches


def test_a_re_plan_within_the_margin_or_the_noise_is_kept(caplog):
    r = doubtful_mgwfbp()
    d = Slower(r, [0.2]).run(40)  # 4.4% slower: within the 5% margin
    assert d.switches == [3, 23] and r.phase is Phase.FIXED
    assert d.executor.plans[-1] == [["fc1"], ["conv2"], ["conv1"]]

    r = doubtful_mgwfbp()
    with caplog.at_level(logging.INFO, logger="mgcaffe"):
        d = Slower(r, [0.0, 0.6]).run(40)  # median 4.8 (6.7% slower); lower quartile 4.5
    assert d.switches == [3, 23]
    assert "Re-plan kept: it measured 4800.00 ms" in caplog.text
    assert r.median_prediction == pytest.approx(4.5)  # the re-plan's own: 1 + 3 + 0.5


def test_an_unchanged_re_plan_is_not_checked():
    r = replanner(replan_after=8)  # wfbp: the re-plan is the start-up plan again
    d = Slower(r, [5.0]).run(40)
    assert d.switches == [3, 23] and Phase.REPLAN_CHECK not in [p for _, p in d.phases]


def test_ranks_undo_the_re_plan_together_when_one_rank_measured_it_slower():
    comms = LocalWorld(2).communicators()
    drivers = [None, None]

    def rank_main(rank):
        drivers[rank] = Slower(doubtful_mgwfbp(comms[rank]), [2.0 * rank]).run(35)

    _, errors = run_ranks(2, rank_main, timeout=30)
    assert errors == [None, None]
    r0, r1 = (d.r for d in drivers)
    assert [list(g) for g in r0.plan.groups] == [list(g) for g in r1.plan.groups] == [
        ["fc1", "conv2", "conv1"]]  # both back on the start-up plan's one message
    assert r0.plan_switches == r1.plan_switches
    assert [i for i, _ in r0.plan_switches] == [3, 23, 30]


class SlowWarmUp(Slower):
    """`Slower`, but only while the start-up plan runs in warm-up: what a machine busy with
    something else for a while does to those iterations."""

    def extra(self) -> float:
        return super().extra() if self.r.phase is Phase.WARM_UP else 0.0


def interfered(**options) -> Replanner:
    # wfbp's three messages of 3 s beside layers of 1 s, a start-up probe of rho 0.05
    return replanner(cost=CostModel(3.0, 0.0).with_interference(PROBE), replan_after=8,
                     **options)


def test_the_interference_is_calibrated_on_the_plans_own_iterations(caplog):
    # the window measures rho 0.5 and sigma 1.5 (each layer 1.5 s beside a message, the
    # message 4.5 s, all during backward); the model predicts 11 s for the start-up plan with
    # no interference (fc1 ready at 2 s, three messages of 3 s: 2-5, 5-8, 8-11) and 12 s
    # with the measured one. Its iterations in the window measured 1 + 4.5 + 0.5 + 30 s:
    # above even 4 x the measured interference, its cap
    r = interfered()
    with caplog.at_level(logging.INFO, logger="mgcaffe"):
        d = Slower(r, [30.0], slow=1.5).run(30)
    assert d.switches == [3, 23]
    assert r.in_situ.rho.single == pytest.approx(0.5)
    assert r.scale == 4.0
    assert r.cost == r.in_situ.cost.scaled_interference(4.0)
    assert r.plan.interference == r.cost.interference
    assert ("The start-up plan measured 36000.00 ms per iteration in the re-plan window, "
            "between its profiled iterations (median of 6, slowest rank); the model predicts "
            "12000.00 ms for it with the measured rho and sigma, 11000.00 ms with none: the "
            "re-plan uses them x4.00 (") in caplog.text


def test_the_calibration_lands_between_the_bounds():
    # 11.5 s measured: between no interference (11 s) and the measured one (12 s)
    r = interfered()
    Slower(r, [5.5], slow=1.5).run(30)
    assert 0.0 < r.scale < 1.0
    assert r.median_prediction == pytest.approx(11.5, rel=1e-3)


@pytest.mark.parametrize("extra, predicted", [(2.0, 8.0), (0.0, 6.5)])
def test_where_even_no_interference_predicts_more_T_is_shortened(caplog, extra, predicted):
    # the plan's iterations measured 6 + extra s, less than the 11 s of no interference:
    # the messages ran faster in training than the start-up benchmark's T. T x c makes them
    # 3c s, ending at 2 + 9c: 8 s at c = 2/3; 6 s would need c = 4/9, below the floor of
    # 0.5 (6.5 s)
    r = interfered()
    with caplog.at_level(logging.INFO, logger="mgcaffe"):
        Slower(r, [extra], slow=1.5).run(30)
    assert r.scale == 0.0 and not r.cost.interferes
    assert r.cost.time(64) == pytest.approx(3.0 * (predicted - 2.0) / 9.0, rel=1e-3)
    assert r.median_prediction == pytest.approx(predicted, rel=1e-3)
    assert f"the re-plan uses them x0.00 and T x{(predicted - 2) / 9:.2f} where training" \
        in caplog.text


def test_a_warm_up_slowed_by_something_else_does_not_calibrate_the_model(caplog):
    # the start-up plan measured 26 s per iteration in warm-up (20 s more than anything the
    # model sees), 6 s between the window's profiled iterations: the model follows the
    # window (6.5 s at T's floor, above), not the warm-up (which would take it to its cap)
    r = interfered()
    with caplog.at_level(logging.INFO, logger="mgcaffe"):
        d = SlowWarmUp(r, [20.0], slow=1.5).run(30)
    assert d.switches == [3, 23]
    assert r.scale == 0.0 and r.median_prediction == pytest.approx(6.5)
    assert "measured 6000.00 ms per iteration in the re-plan window" in caplog.text


def test_without_the_plans_iterations_in_the_window_the_warm_up_calibrates():
    # a GPU stream measures nothing in situ: its window runs only the profile, so the
    # start-up plan's last iterations in warm-up (4.5 + 20 s) calibrate the probe's model:
    # above even 4 x its rho (0.2). wfbp's messages of 0.5 s then slow each next layer's
    # first 0.5 s to 1/1.2: fc1 ready at 2, conv2 at 2.5 + (1 - 0.5 / 1.2), conv1 at 3.0833
    # + 0.5 + 0.5833 = 4.1667, its message ends at 4.6667 s
    r = replanner(cost=WFBP_COST.with_interference(PROBE), replan_after=8)
    d = Slower(r, [20.0], mode="stream").run(30)
    assert d.switches == [3, 23] and r.in_situ is None
    assert r.scale == 4.0
    assert r.cost == WFBP_COST.with_interference(PROBE).scaled_interference(4.0)
    assert r.median_prediction == pytest.approx(4.6667, rel=1e-4)
