"""The interference-aware cost model: backward slows while a message is in flight.

The timeline is checked against hand-computed cases, `optimal` against every grouping of
small profiles (brute force through `timeline`)."""

from __future__ import annotations

import itertools
import json
import random

import numpy as np
import pytest

from mgcaffe.comm.model import interference_search
from mgcaffe.comm.model.cost import CostModel, Network, cost_for
from mgcaffe.comm.model.mgwfbp import groups_from_runs
from mgcaffe.comm.model.plan import Plan
from mgcaffe.comm.model.profile import LayerProfile, Profile
from mgcaffe.comm.model.schemes import SCHEMES, make_plan
from mgcaffe.comm.model.timeline import interfered_message, timeline
from mgcaffe.errors import PlanError


def toy(params, backward, forward=0.0) -> Profile:
    layers = [LayerProfile(f"l{i + 1}", p, float(t))
              for i, (p, t) in enumerate(zip(params, backward))]
    return Profile("toy", 1, 4, float(forward), tuple(layers))


def groupings(profile: Profile):
    back = profile.names[::-1]
    for cuts in itertools.product((False, True), repeat=len(back) - 1):
        groups, cur = [], [back[0]]
        for name, cut in zip(back[1:], cuts):
            if cut:
                groups.append(cur)
                cur = []
            cur.append(name)
        groups.append(cur)
        yield groups


def test_slowdown_interpolates_in_log_size_and_clamps():
    c = CostModel(1e-5, 1e-9, interference=((1 << 20, 0.4), (1 << 10, 0.0)))
    assert c.interference == ((1024, 0.0), (1 << 20, 0.4))  # sorted
    assert c.slowdown(4) == 0.0 and c.slowdown(1 << 30) == 0.4
    assert c.slowdown(1 << 15) == pytest.approx(0.2)  # halfway in log2: 10 .. 20
    assert c.interferes and not CostModel(1, 1).interferes
    assert not CostModel(1, 1, interference=((4, 0.0),)).interferes
    with pytest.raises(PlanError, match=r"interference\[0\]"):
        CostModel(1, 1, interference=((4, -0.5),))


def test_hand_computed_two_layer_timeline():
    # backward l2 on [0, 2]; l1 needs 2 s of work; each message takes 1 s (a = 1, b = 0) and
    # halves backward's speed (rho = 1).
    profile = toy([1, 1], [2, 2])
    cost = CostModel(1.0, 0.0, interference=((4, 1.0),))
    wfbp = make_plan(profile, cost, "wfbp")
    # l2 sent on [2, 3]: l1 does 0.5 s of work meanwhile, the other 1.5 s after: ready 4.5
    assert wfbp.comm_start == (2.0, 4.5) and wfbp.comm_end == (3.0, 5.5)
    assert wfbp.backward_end == (4.5, 2.0) and wfbp.ideal == 4.0  # ideal: undisturbed
    sync = make_plan(profile, cost, "synceasgd")
    assert sync.iteration_time == 5.0
    opt = make_plan(profile, cost, "mgwfbp")
    assert opt.iteration_time == 5.0 and opt.groups == (("l2", "l1"),)
    # without interference both take 5 s and the paper's model cannot tell them apart
    plain = CostModel(1.0, 0.0)
    assert make_plan(profile, plain, "wfbp").iteration_time == 5.0


def test_backward_inside_one_long_message():
    # l3's message (8 s) outlasts backward: l2 and l1 run wholly inside it at half speed
    profile = toy([1, 1, 1], [1, 1, 4])  # backward order: l3 (4 s), l2 (1 s), l1 (1 s)
    cost = CostModel(8.0, 0.0, interference=((4, 1.0),))
    plan = timeline(profile, cost, [["l3"], ["l2", "l1"]])
    # l3 ready at 4, sent [4, 12]; l2 and l1 run at half speed: ready 6 and 8, both inside
    assert plan.backward_end == (8.0, 6.0, 4.0)
    assert plan.comm_start == (4.0, 12.0) and plan.iteration_time == 20.0


def test_state_dp_without_interference_matches_the_paper_dp(make_random_profile):
    rng = random.Random(11)
    for _ in range(30):
        profile = make_random_profile(rng, rng.randint(1, 40))
        cost = CostModel(10 ** rng.uniform(-5, -2), 10 ** rng.uniform(-10, -8))
        runs, _ = interference_search._optimal_interfered_runs(profile, cost, strict=False)
        t = timeline(profile, cost, groups_from_runs(profile, runs)).iteration_time
        assert t == pytest.approx(make_plan(profile, cost, "mgwfbp").iteration_time,
                                  rel=1e-12)


def test_interference_travels_through_network_json_and_plans(tmp_path):
    net = Network.from_dict({"fits": {"2": {"a": 1e-4, "b": 1e-9,
                                            "interference": [[1024, 0.1], [1 << 20, 0.5]]}}})
    cost = cost_for(net, 2)
    assert cost.interference == ((1024, 0.1), (1 << 20, 0.5))
    assert Network.from_dict(net.to_dict()) == net
    with pytest.raises(PlanError, match=r"fits.2.interference\[0\]\[1\]"):
        Network.from_dict({"fits": {"2": {"a": 1, "b": 1, "interference": [[4, "x"]]}}})
    profile = toy([1000, 2000, 3000], [1e-3, 2e-3, 3e-3], forward=1e-3)
    plan = make_plan(profile, cost, "mgwfbp")
    path = tmp_path / "plan.json"
    plan.save(path)
    again = Plan.from_dict(json.loads(path.read_text()))
    assert again.interference == cost.interference
    assert again.iteration_time == plan.iteration_time


def test_measure_interference_is_a_collective_with_one_answer():
    from comm_fakes import run_ranks  # noqa: PLC0415

    from mgcaffe.comm.backends.local import LocalWorld  # noqa: PLC0415
    from mgcaffe.comm.training.interference import (  # noqa: PLC0415
        interference_sizes,
        measure_interference,
    )

    assert interference_sizes(100) == [100]
    assert interference_sizes(64 << 20) == [64 << 10, 1 << 20, 16 << 20]
    world = LocalWorld(2, timeout=20)
    comms = world.communicators()
    cost = CostModel(1e-5, 1e-9)
    results, errors = run_ranks(2, lambda r: measure_interference(
        comms[r], cost, [1024, 1 << 16], duration=0.02, rounds=1))
    assert errors == [None, None]
    assert results[0] == results[1]  # every rank keeps the slowest rank's slowdown
    assert [m for m, _ in results[0]] == [1024, 1 << 16]
    assert all(rho >= 0 for _, rho in results[0])


def test_the_probe_times_the_all_reduces_against_T_as_sigma():
    """A message that takes 3x its modelled time beside the GEMMs is sigma 3 (capped at 20;
    never below 1: a faster message than T is not a speed-up the model should promise)."""
    import time as _time  # noqa: PLC0415

    from mgcaffe.comm.backends.local import SingleCommunicator  # noqa: PLC0415
    from mgcaffe.comm.training.interference import MAX_SIGMA, measure_slowdowns  # noqa: PLC0415

    class Slow(SingleCommunicator):
        def allreduce_sum(self, buf):
            _time.sleep(0.006)

    [(m, rho, sigma)] = measure_slowdowns(Slow(), CostModel(0.002, 0.0), [1024],
                                          duration=0.02, rounds=1)
    assert m == 1024 and rho >= 0
    assert 2.5 <= sigma <= 4.5  # 6 ms against 2 ms, give or take the scheduler's wake-ups
    [(_, _, capped)] = measure_slowdowns(Slow(), CostModel(2e-4, 0.0), [1024], duration=0.02,
                                         rounds=1)
    assert capped == MAX_SIGMA == pytest.approx(20.0)
    [(_, _, floor)] = measure_slowdowns(Slow(), CostModel(1.0, 0.0), [1024], duration=0.02,
                                        rounds=1)
    assert floor == 1.0


def test_a_round_after_a_slow_one_sends_fewer_all_reduces():
    """All-reduces 30x slower than T: the first round sends duration / T of them (100, 0.6 s
    instead of 20 ms); the later rounds fit `duration` with sigma's count (4), so a probe of
    a badly contended network does not take rounds x sigma x duration."""
    import time as _time  # noqa: PLC0415

    from mgcaffe.comm.backends.local import SingleCommunicator  # noqa: PLC0415
    from mgcaffe.comm.training.interference import MAX_SIGMA, measure_slowdowns  # noqa: PLC0415

    class Counted(SingleCommunicator):
        calls = 0

        def allreduce_sum(self, buf):
            Counted.calls += 1
            _time.sleep(0.006)

    [(_, _, sigma)] = measure_slowdowns(Counted(), CostModel(2e-4, 0.0), [1024],
                                        duration=0.02, rounds=3)
    assert sigma == MAX_SIGMA
    # 1 warm-up, 100, then at most ceil(0.02 / (2e-4 x 30)) = 4 each (sigma measured >= 30)
    assert 1 + 100 + 2 * 2 <= Counted.calls <= 1 + 100 + 2 * 4, Counted.calls


def test_the_probe_halves_a_unit_of_work_too_coarse_for_its_phases():
    """A unit that takes longer than a phase's eighth is halved (not below `smallest`): a
    phase that counts one or two units measures where the last one was cut off, not a rate."""
    import time as _time  # noqa: PLC0415

    from mgcaffe.comm.training.interference import _Work  # noqa: PLC0415

    class Timed(_Work):  # a unit of n costs n x 0.1 ms (the GEMM itself still runs)
        def unit(self):
            _time.sleep(self.n * 1e-4)

    assert Timed.fine_grained(1.0).n == 192  # 19.2 ms, within 125 ms: kept
    assert Timed.fine_grained(0.1).n == 96  # 19.2 ms > 12.5 ms; 9.6 ms within
    assert Timed.fine_grained(0.01, smallest=64).n == 64  # never below smallest


# ----------------------------------------------------------------- sigma: comm slowed by backward
def test_hand_computed_timeline_with_comm_slowed_during_backward():
    # l2 (2 s) then l1 (2 s) of backward; messages take 1 s alone (a = 1, b = 0); while backward
    # runs a message goes at half speed (sigma = 2) and backward at half speed (rho = 1)
    profile = toy([1, 1], [2, 2])
    cost = CostModel(1.0, 0.0, interference=((4, 1.0),), comm_slowdown=((4, 2.0),))
    wfbp = make_plan(profile, cost, "wfbp")
    # l2 sent at 2: 2 s long (half speed, backward still runs), l1 does 1 s of work meanwhile;
    # the other 1 s after: l1 ready at 5, its message alone: [5, 6]
    assert wfbp.comm_start == (2.0, 5.0) and wfbp.comm_end == (4.0, 6.0)
    assert wfbp.backward_end == (5.0, 2.0)
    assert make_plan(profile, cost, "synceasgd").iteration_time == 5.0
    assert make_plan(profile, cost, "mgwfbp").groups == (("l2", "l1"),)


def test_backward_ends_inside_a_slowed_message():
    # l2 (1 s) ready at 1; its message needs 2 s alone; l1 (1 s of work) runs beside it at half
    # speed and ends at 3, by then the message has done 2 s / sigma 2 = 1 s of its 2: the other
    # 1 s at full speed, end at 4; l1's message [4, 6]
    profile = toy([1, 1], [1, 1])
    cost = CostModel(2.0, 0.0, interference=((4, 1.0),), comm_slowdown=((4, 2.0),))
    plan = make_plan(profile, cost, "wfbp")
    assert plan.backward_end == (3.0, 1.0)
    assert plan.comm_start == (1.0, 4.0) and plan.comm_end == (4.0, 6.0)


def test_sigma_alone_is_in_the_model():
    # rho = 0, sigma = 3: backward is not slowed, the message during it is
    profile = toy([1, 1], [2, 2])
    cost = CostModel(1.0, 0.0, comm_slowdown=((4, 3.0),))
    assert cost.interferes and cost.sigma(1 << 30) == 3.0
    plan = make_plan(profile, cost, "wfbp")
    # l2's message from 2: by the end of backward (4) it has done 2/3 s of its 1 s, the rest
    # at full speed: ends 4 + 1/3; l1 (ready at 4) is sent then, alone: 1 s
    assert plan.comm_end == pytest.approx((13 / 3, 16 / 3), rel=1e-15)
    assert plan.backward_end == (4.0, 2.0)


@pytest.mark.parametrize("L", range(1, 10))
def test_optimal_equals_brute_force_under_rho_and_sigma(L, make_random_profile):
    rng = random.Random(900 + L)
    for _ in range(8 if L < 8 else 3):
        profile = make_random_profile(rng, L, zero_params=True)
        sizes = sorted(int(10 ** rng.uniform(2, 7)) for _ in range(2))
        if rng.random() < 0.5:  # one number each, or per size
            rho, sigma = ((4, rng.uniform(0, 3)),), ((4, rng.uniform(1, 2.5)),)
        else:
            rho = tuple((m, rng.uniform(0, 3)) for m in sizes)
            sigma = tuple((m, rng.uniform(1, 2.5)) for m in sizes)
        if rng.random() < 1 / 3:  # rho alone: communication not slowed
            sigma = ()
        cost = CostModel(10 ** rng.uniform(-5, -2), 10 ** rng.uniform(-10, -8),
                         interference=rho, comm_slowdown=sigma)
        best = min(timeline(profile, cost, g).iteration_time for g in groupings(profile))
        opt = make_plan(profile, cost, "mgwfbp")
        assert opt.exact
        assert opt.iteration_time == pytest.approx(best, rel=1e-12)
        for s in SCHEMES:
            assert opt.iteration_time <= make_plan(profile, cost, s).iteration_time * (1 + 1e-12)


def test_optimal_exact_with_integer_times_and_ties():
    rng = random.Random(5)
    for _ in range(400):
        L = rng.randint(1, 6)
        profile = toy([rng.randint(0, 4) for _ in range(L)],
                      [rng.randint(0, 4) for _ in range(L)], forward=rng.randint(0, 3))
        # speeds 1/2 and 1/4, sigma 1, 2 and 4: binary fractions, so every time is exact
        cost = CostModel(rng.randint(0, 4), 0.25 * rng.randint(0, 2),
                         interference=((4, rng.choice((0.0, 1.0, 3.0))),),
                         comm_slowdown=((4, rng.choice((1.0, 2.0, 4.0))),))
        best = min(timeline(profile, cost, g).iteration_time for g in groupings(profile))
        assert make_plan(profile, cost, "mgwfbp").iteration_time == best


def test_the_idling_dominance_is_wrong_under_sigma():
    # Two states with layers still to send, backward 2 s in all: A (channel free at 0, no work
    # done) and B (free at 1, 1 s done). Without sigma A dominates B (A, had it idled until 1,
    # would be B). The next message is ready in both and needs 1 s alone; rho = 9, sigma = 100.
    # From A: backward's 2 s take 20 s beside it, the message does 0.2 s of its work by then and
    # ends at 20.8. From B: the last 1 s takes 10 s (end 11), 0.1 s done, ends at 11.9: B wins.
    states = [(np.array([[0.0, 1.0], [0.0, 1.0], [0.0, 0.0]]), 3, 2)]  # F, w, parent: A, B
    idling = interference_search._pareto_arrays(states, strict=False)
    assert idling[0].tolist() == [0.0]  # the old rule drops B: wrong
    strict = interference_search._pareto_arrays(states, strict=True)
    assert strict[0].tolist() == [0.0, 1.0] and strict[1].tolist() == [0.0, 1.0]  # keeps both
    dA, _ = interfered_message(0.0, 1.0, 10.0, 100.0, 2.0)
    dB, _ = interfered_message(1.0, 1.0, 10.0, 100.0, 2.0)
    assert 0.0 + dA == pytest.approx(20.8) and 1.0 + dB == pytest.approx(11.9)


def test_a_cut_search_says_it_is_not_proven(make_random_profile, monkeypatch):
    rng = random.Random(2)
    profile = make_random_profile(rng, 40)
    cost = CostModel(2.7e-4, 3.4e-9, interference=((4, 1.0),), comm_slowdown=((4, 1.3),))
    full = make_plan(profile, cost, "mgwfbp")
    monkeypatch.setattr(interference_search, "FRONT_BUDGET", 10)  # one state per front
    cut = make_plan(profile, cost, "mgwfbp")
    assert full.exact and not cut.exact
    assert Plan.from_dict(cut.to_dict()).exact is False
    assert "exact" not in full.to_dict()
    # never worse than the schemes it is bounded by
    for s in ("wfbp", "synceasgd", "mgwfbp-paper"):
        assert cut.iteration_time <= make_plan(profile, cost, s).iteration_time * (1 + 1e-12)
    assert cut.iteration_time >= full.iteration_time * (1 - 1e-12)


def test_comm_slowdown_in_network_json_and_plans(tmp_path):
    # one number, or points; old files without it load with sigma = 1
    net = Network.from_dict({"fits": {"2": {"a": 1e-4, "b": 1e-9, "comm_slowdown": 1.25}}})
    assert cost_for(net, 2).comm_slowdown == ((1, 1.25),)
    assert cost_for(net, 2).sigma(1 << 20) == 1.25
    net = Network.from_dict({"fits": {"2": {"a": 1e-4, "b": 1e-9,
                                            "comm_slowdown": [[1024, 1.1], [1 << 20, 1.5]]}}})
    cost = cost_for(net, 2)
    assert cost.sigma(1 << 15) == pytest.approx(1.3)
    assert Network.from_dict(net.to_dict()) == net
    assert cost_for(Network.from_dict({"fits": {"2": {"a": 1, "b": 1}}}), 2).sigma(4) == 1.0
    with pytest.raises(PlanError, match=r"fits.2.comm_slowdown\[0\]\[1\]: must be >= 1"):
        Network.from_dict({"fits": {"2": {"a": 1, "b": 1, "comm_slowdown": 0.5}}})
    with pytest.raises(PlanError, match=r"fits.2.comm_slowdown: must be a number or a list"):
        Network.from_dict({"fits": {"2": {"a": 1, "b": 1, "comm_slowdown": "x"}}})
    profile = toy([1000, 2000, 3000], [1e-3, 2e-3, 3e-3], forward=1e-3)
    plan = make_plan(profile, cost, "mgwfbp")
    again = Plan.from_dict(json.loads(plan.to_json()))
    assert again.comm_slowdown == cost.comm_slowdown


def test_the_bound_stays_below_every_continuation():
    # the branch and bound's lower bound must hold for per-size rho far apart (backward
    # slowed +0% beside small messages, up to +1900% beside large ones): compare with every
    # grouping, and the bound of the start state with the optimum
    rng = random.Random(77)
    for _ in range(60):
        L = rng.randint(2, 7)
        profile = toy([rng.randint(0, 8) for _ in range(L)],
                      [rng.uniform(0, 4) for _ in range(L)], forward=rng.uniform(0, 1))
        cost = CostModel(rng.uniform(0, 2), 0.25 * rng.uniform(0, 2),
                         interference=((4, 0.0), (32, rng.uniform(5, 19))),
                         comm_slowdown=((4, rng.uniform(1, 3)), (32, rng.uniform(1, 3))))
        best = min(timeline(profile, cost, g).iteration_time for g in groupings(profile))
        total = sum(layer.backward_time for layer in profile.layers)
        lower = interference_search._lower(profile, cost, total)
        index = {n: i + 1 for i, n in enumerate(profile.names)}
        W = {l: sum(x.backward_time for x in profile.layers[l - 1:]) for l in range(1, L + 1)}
        for g in groupings(profile):
            end = timeline(profile, cost, g).iteration_time
            F, w, k = profile.forward_time, 0.0, L  # the state before each group
            for group in g:
                # every grouping is one continuation of each of its own states
                assert lower(k, F, w) <= end * (1 + 1e-12)
                j = index[group[-1]]
                size = 4 * sum(profile.layers[index[n] - 1].params for n in group)
                s, ws = (F, w) if w >= W[j] else (F + W[j] - w, W[j])
                d, w = interfered_message(ws, cost.time(size), 1 + cost.slowdown(size),
                                        cost.sigma(size), total)
                F, k = s + d, j - 1
            assert F == pytest.approx(end, rel=1e-12)  # the states replay the timeline
        assert make_plan(profile, cost, "mgwfbp").iteration_time == pytest.approx(best,
                                                                                   rel=1e-12)


def _steep_curve(rng: random.Random) -> tuple[tuple[int, float], ...]:
    """A measured-like T that is not subadditive: cheap small messages, then steep (over TCP a
    large message can cost more than its halves), over the toy profiles' sizes (4..64 B)."""
    t0 = rng.uniform(0, 0.5)
    mid = t0 + rng.uniform(0, 0.5)
    return ((4, t0), (rng.choice((8, 16, 24)), mid), (64, mid + rng.uniform(2, 12)))


def test_the_bound_holds_for_measured_curves_that_are_not_subadditive():
    # one message of layers 1..k may cost more than two: the bound must use the cheapest
    # grouping's channel time, not one message's
    rng = random.Random(78)
    for _ in range(60):
        L = rng.randint(2, 7)
        profile = toy([rng.randint(0, 8) for _ in range(L)],
                      [rng.uniform(0, 4) for _ in range(L)], forward=rng.uniform(0, 1))
        cost = CostModel(0.1, 0.01, times=_steep_curve(rng),
                         interference=((4, rng.uniform(0, 1)), (32, rng.uniform(0, 3))),
                         comm_slowdown=((4, rng.uniform(1, 3)),))
        best = min(timeline(profile, cost, g).iteration_time for g in groupings(profile))
        total = sum(layer.backward_time for layer in profile.layers)
        lower = interference_search._lower(profile, cost, total)
        assert lower(L, profile.forward_time, 0.0) <= best * (1 + 1e-12)
        opt = make_plan(profile, cost, "mgwfbp")
        assert opt.exact and opt.iteration_time == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("L", range(2, 9))
def test_optimal_equals_brute_force_for_measured_curves_under_rho_and_sigma(
        L, make_random_profile):
    rng = random.Random(950 + L)
    for _ in range(6):
        profile = make_random_profile(rng, L, zero_params=True)
        total = 4 * sum(layer.params for layer in profile.layers)
        mid = max(8, total // rng.randint(2, 8))
        t0 = 10 ** rng.uniform(-5, -3)
        curve = ((4, t0), (mid, t0 + 10 ** rng.uniform(-4, -2)),
                 (total + 4, t0 + 10 ** rng.uniform(-2, -0.5)))
        cost = CostModel(t0, 0.0, times=curve,
                         interference=((4, rng.uniform(0, 1)), (mid, rng.uniform(0, 3))),
                         comm_slowdown=((4, rng.uniform(1, 2.5)),))
        best = min(timeline(profile, cost, g).iteration_time for g in groupings(profile))
        opt = make_plan(profile, cost, "mgwfbp")
        assert opt.exact and opt.iteration_time == pytest.approx(best, rel=1e-12)
