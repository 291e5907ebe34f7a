"""The re-planner's phases driven directly, without MPI, a net or a communication thread: one
rank (SingleCommunicator), made-up layer times, a recording executor and timer."""

from __future__ import annotations

from contextlib import nullcontext

import pytest

from mgcaffe.comm.backends.local import SingleCommunicator
from mgcaffe.comm.model.cost import CostModel
from mgcaffe.comm.training.options import Options
from mgcaffe.comm.training.replanner import (
    PROFILE_EXTENSION,
    Learnables,
    Phase,
    Replanner,
    median_prediction,
)

NAMES = ["conv1", "conv2", "ip1"]
COUNTS = [1000, 20000, 400000]


class RecordingExecutor:
    """What the re-planner asks of the communication thread: set_plan, intervals, mode."""

    mode = "thread"

    def __init__(self):
        self.plans = []
        self.intervals = None

    def set_plan(self, plan):
        self.plans.append(plan)


class FakeTimer:
    forward_start, forward_end = 0.0, 0.010

    def __init__(self):
        self.installed = 0
        self.removed = 0

    def install(self):
        self.installed += 1

    def remove(self):
        self.removed += 1


def ready_times(scale: float = 1.0) -> dict[int, float]:
    # backward runs L..1: ip1 (k=3) ends first, conv1 (k=1) last
    return {3: 0.012 * scale, 2: 0.015 * scale, 1: 0.020 * scale}


def make(replan_after: int, cost=None, profile_iters=2, **options):
    o = Options(comm="mgwfbp", profile_iters=profile_iters, replan_after=replan_after,
                **options)
    net = Learnables("toy", NAMES, COUNTS, 4)
    planner = Replanner(SingleCommunicator(), o, net, cost or CostModel(1e-4, 1e-9),
                        lambda what, timeout=None: nullcontext())
    first = planner.initial_plan()
    executor, timer = RecordingExecutor(), FakeTimer()
    planner.start(executor, timer, keep_timer=False)
    return planner, first, executor, timer


def test_startup_profile_then_warm_up_then_replan_then_fixed():
    planner, first, executor, timer = make(replan_after=3)
    assert planner.phase is Phase.STARTUP_PROFILE and planner.profiling and planner.planning
    assert planner.plan is None and list(first.groups) == [list(reversed(NAMES))]
    it = 0
    switched_at = []
    while planner.phase is Phase.STARTUP_PROFILE:
        it += 1
        if planner.after_iteration(it, ready_times()):
            switched_at.append(it)
        assert it < 20
    # 2 profiled iterations, the times steady: plan at once, then warm up for 3 iterations
    assert switched_at == [2] and planner.phase is Phase.WARM_UP and planner.replan_at == 5
    assert executor.plans == [planner.plan] and planner.plan_switches[0][0] == 2
    assert timer.removed == 1  # no trace: the timer is off while the plan runs
    startup_prediction = planner.median_prediction
    assert startup_prediction > 0
    for it in (3, 4):
        assert not planner.after_iteration(it, ready_times())
        assert planner.phase is Phase.WARM_UP
    assert not planner.after_iteration(5, ready_times())
    assert planner.phase is Phase.REPLAN_PROFILE and timer.installed == 1
    # the cost has no interference term: the plan runs on while it profiles (no in situ)
    assert planner.window is None and len(executor.plans) == 1
    it, switched = 5, False
    while not switched:
        it += 1
        switched = planner.after_iteration(it, ready_times(scale=2.0))  # slower now
    assert it == 5 + PROFILE_EXTENSION * 2
    assert planner.phase is Phase.FIXED and not planner.planning
    assert [i for i, _ in planner.plan_switches] == [2, it]
    assert planner.startup_prediction == startup_prediction
    assert planner.median_prediction > startup_prediction  # the later, slower iterations
    assert not planner.after_iteration(it + 1, ready_times())  # fixed for good


def test_no_replan_asked_stays_fixed_after_the_first_plan():
    planner, *_ = make(replan_after=0)
    for it in (1, 2):
        planner.after_iteration(it, ready_times())
    assert planner.phase is Phase.FIXED and planner.replan_at is None


@pytest.mark.parametrize("drift, iterations", [(0.0, 5), (1.0, PROFILE_EXTENSION * 5)])
def test_drifting_times_extend_the_startup_profile(drift, iterations):
    planner, *_ = make(replan_after=0, profile_iters=5)
    it = 0
    while planner.phase is Phase.STARTUP_PROFILE:
        it += 1
        planner.after_iteration(it, ready_times(scale=1.0 + drift * it))
    # steady: planned after profile_iters; drifting: profiled on, up to PROFILE_EXTENSION times
    assert it == iterations and planner.plan is not None


def test_interference_in_the_cost_opens_an_in_situ_window():
    cost = CostModel(1e-4, 1e-9).with_interference([(4096, 0.1)])
    planner, _, executor, _ = make(replan_after=1, cost=cost)
    for it in (1, 2, 3):
        planner.after_iteration(it, ready_times())
    assert planner.phase is Phase.REPLAN_PROFILE and planner.window is not None
    # the window starts with all gradients after backward, then alternates
    assert executor.plans[-1] == [list(reversed(NAMES))] or \
        list(executor.plans[-1].groups) == [list(reversed(NAMES))]
    planner.after_iteration(4, ready_times())  # profiled; the next one overlaps
    assert executor.plans[-1] == [[n] for n in reversed(NAMES)]


def test_a_given_profile_plans_once_and_never_profiles(tmp_path):
    profile = tmp_path / "p.json"
    profile.write_text('{"model": "toy", "forward_time": 0.01, "layers": ['
                       + ", ".join(f'{{"name": "{n}", "params": {c}, "backward_time": 0.003}}'
                                   for n, c in zip(NAMES, COUNTS)) + "]}")
    planner, first, *_ = make(replan_after=5, profile=str(profile))
    assert planner.phase is Phase.FIXED and planner.profiler is None
    assert first is planner.plan and planner.profile_dict["model"] == "toy"


def test_median_prediction_is_the_median_of_per_iteration_timelines():
    net = Learnables("m", ["a"], [1], 4)

    class OneGroup:
        groups = [["a"]]

    # one layer, one message of 1 s after its backward: each iteration t_f + t_b + 1
    steps = [(0.0, [1.0]), (0.0, [5.0]), (0.0, [2.0])]
    assert median_prediction(OneGroup, steps, CostModel(1.0, 0.0), net) == pytest.approx(3.0)
