"""The steady-state cycle of a schedule (comm/model/schedule.py): hand-computed examples, the
merge planner's timeline as its barrier special case, freezing priorities into sequences, the
interference simulation, and the format's checks."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from mgcaffe.comm.model.cost import CostModel, cost_for, load_network
from mgcaffe.comm.model.plan import SCHEDULED_FORMAT, Plan, load_plan
from mgcaffe.comm.model.profile import LayerProfile, Profile, load_profile
from mgcaffe.comm.model.schedule import (
    Schedule,
    barrier_schedule,
    edf_order,
    part_bounds,
    part_layers,
)
from mgcaffe.comm.model.schemes import make_plan
from mgcaffe.comm.model.timeline import cycle, freeze, timeline
from mgcaffe.errors import PlanError

# two layers, backward 1 s each; layer 2's 40-byte gradient costs T = 0.2 + 0.07 * 40 = 3 s,
# layer 1's 4 bytes 0.48 s; each layer's forward takes 1 s
TWO = Profile("two", 1, 4, 2.0, (LayerProfile("l1", 1, 1.0, 1.0),
                                 LayerProfile("l2", 10, 1.0, 1.0)))
COST = CostModel(0.2, 0.07)
WFBP = [[2], [1]]


def edf(group_layers, parts, update="per-layer"):
    ops = ["allreduce"] * len(group_layers)
    return Schedule(tuple(parts), tuple(ops), edf_order(group_layers, parts, ops), "priority",
                    0, update)


def test_the_barrier_is_the_papers_iteration():
    # layer 2's message 1..4 s, layer 1's 4..4.48 s, then the whole forward: 6.48 s
    c = cycle(TWO, COST, WFBP, barrier_schedule(2))
    assert c.iteration_time == pytest.approx(6.48)
    assert c.backward_start == pytest.approx((3.0, 2.0))  # from the forward start (t_f = 2)
    assert c.comm_start == pytest.approx((3.0, 6.0))
    assert c.comm_end == pytest.approx((6.0, 6.48))


def test_per_layer_updates_and_parts_overlap_the_next_forward():
    # layer 2 in two 20-byte parts (1.6 s each): the input-side part goes at 1 s, layer 1
    # (ready at 2 s, due first) jumps ahead of the other part at 2.6 s and ends at 3.08 s;
    # layer 1's forward runs 3.08..4.08, the last part ends at 4.68 and layer 2's forward
    # 4.68..5.68: the next backward starts 5.68 s after this one
    s = edf(WFBP, [2, 1])
    assert s.order == ((1, 0, "ar"), (0, 1, "ar"), (0, 0, "ar"))
    c = cycle(TWO, COST, WFBP, s)
    assert c.iteration_time == pytest.approx(5.68)
    shift = 5.68 - 2.0  # this iteration's forward starts one period before the next one's
    assert c.comm_start == pytest.approx((2.6 + shift, 1.0 + shift, 3.08 + shift))
    assert c.forward_start == pytest.approx((3.08 + shift, 4.68 + shift))
    assert c.hidden_in_forward == pytest.approx(0.48 + 0.6 + 1.6)


def test_per_layer_without_reordering_gains_nothing():
    # sent in backward order, layer 1 is still last: the forward waits for everything
    s = Schedule((1, 1), ("allreduce",) * 2, ((0, 0, "ar"), (1, 0, "ar")), "sequence", 0,
                 "per-layer")
    assert cycle(TWO, COST, WFBP, s).iteration_time == pytest.approx(6.48)


def test_update_times_are_paid_by_the_compute_thread():
    prof = Profile("u", 1, 4, 2.0, (LayerProfile("l1", 1, 1.0, 1.0, 0.25),
                                    LayerProfile("l2", 10, 1.0, 1.0, 0.5)))
    assert cycle(prof, COST, WFBP, barrier_schedule(2)).iteration_time == \
        pytest.approx(6.48 + 0.75)
    # layer 1: reduced at 3.08, updated until 3.33, forward until 4.33; layer 2 reduced at
    # 4.68 (layer 1's update hid in the wait), updated until 5.18, forward until 6.18
    assert cycle(prof, COST, WFBP, edf(WFBP, [2, 1])).iteration_time == pytest.approx(6.18)


def test_reduce_scatter_and_all_gather_cost_half_each():
    s = Schedule((1, 1), ("rs-ag",) * 2, ((0, 0, "rs"), (1, 0, "rs"), (1, 0, "ag"),
                                          (0, 0, "ag")), "sequence", 0, "per-layer")
    c = cycle(TWO, COST, WFBP, s)
    # rs(l2) 1..2.5, rs(l1) 2.5..2.74, ag(l1) ..2.98, ag(l2) ..4.48; forwards 2.98..3.98,
    # 4.48..5.48
    assert c.iteration_time == pytest.approx(5.48)


def test_a_batch_costs_t_of_its_sum():
    s = Schedule((2, 1), ("allreduce",) * 2, ((0, 0, "ar"), (0, 1, "ar"), (1, 0, "ar")),
                 "sequence", 0, "barrier", batches=(2, 1))
    c = cycle(TWO, COST, WFBP, s)
    # both parts ready at 1 s, one collective of 40 bytes (3 s); times from the forward start
    assert c.comm_end[0] == c.comm_end[1] == pytest.approx(2.0 + 1 + 3.0)
    assert c.iteration_time == pytest.approx(6.48)


@pytest.mark.parametrize("model", ["googlenet", "resnet50"])
@pytest.mark.parametrize("nodes", [4, 64])
def test_the_merge_planners_schemes_are_the_barrier_cycle(model, nodes):
    prof = load_profile(f"models/paper/{model}-k80.json")
    cost = cost_for(load_network("models/paper/network-10gbe-paper-constants.json"), nodes)
    slowed = cost.with_interference([(1 << 10, 0.5), (1 << 24, 2.0)],
                                    [(1 << 10, 1.4), (1 << 24, 1.1)])
    # (mgwfbp's search under interference takes seconds: its groups are any groups here)
    for interfered, schemes in ((cost, ("wfbp", "synceasgd", "mgwfbp", "threshold")),
                                (slowed, ("wfbp", "synceasgd", "mgwfbp-paper", "threshold"))):
        for scheme in schemes:
            plan = make_plan(prof, interfered, scheme)
            # the barrier as a priority schedule (it sends the same sequence): the event walk
            # of schedules, not the recurrences the barrier case runs
            walked = replace(barrier_schedule(plan.num_messages), policy="priority")
            assert not walked.whole_groups_in_order
            c = cycle(prof, interfered, plan.group_layer_indices(), walked)
            assert c.iteration_time == pytest.approx(plan.iteration_time, rel=1e-12)
            assert c.comm_end == pytest.approx(plan.comm_end, rel=1e-12)
            assert c.backward_end == pytest.approx(plan.backward_end, rel=1e-12)


def random_case(rng):
    L = rng.randint(1, 9)
    layers = tuple(LayerProfile(f"l{i}", rng.choice([0, 1, 7, 300, 20000]),
                                rng.uniform(0, 0.01), rng.choice([None, 0.002]),
                                rng.choice([0.0, 0.0005])) for i in range(L))
    prof = Profile("r", 1, 4, rng.uniform(0, 0.03), layers)
    runs, hi = [], L
    while hi >= 1:
        lo = rng.randint(1, hi)
        runs.append(list(range(hi, lo - 1, -1)))
        hi = lo - 1
    parts = []
    for g in runs:
        n = sum(prof.layers[l - 1].params for l in g)
        parts.append(rng.randint(1, max(1, min(4, n))))
    return prof, runs, parts


def test_a_frozen_priority_schedule_predicts_the_same_times():
    rng = random.Random(5)
    for _ in range(300):
        prof, runs, parts = random_case(rng)
        cost = CostModel(rng.uniform(0, 0.004), rng.uniform(0, 1e-7))
        ops = ["allreduce"] * len(runs)
        s = Schedule(tuple(parts), tuple(ops), edf_order(runs, parts, ops), "priority",
                     rng.choice([0, 400, 40000]), rng.choice(["per-layer", "barrier"]))
        f = freeze(prof, cost, runs, s)
        assert f.policy == "sequence"
        a, b = cycle(prof, cost, runs, s), cycle(prof, cost, runs, f)
        assert b.iteration_time == pytest.approx(a.iteration_time, rel=1e-12, abs=1e-15)
        by_message = dict(zip(s.order, zip(a.comm_start, a.comm_end)))
        want = [t for m in f.order for t in by_message[m]]
        got = [t for pair in zip(b.comm_start, b.comm_end) for t in pair]
        assert got == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_the_interference_simulation_without_interference_is_the_plain_one():
    rng = random.Random(9)
    for _ in range(200):
        prof, runs, parts = random_case(rng)
        cost = CostModel(rng.uniform(0, 0.004), rng.uniform(0, 1e-7))
        barely = cost.with_interference([(1, 1e-300)])  # takes the event simulation
        assert barely.interferes
        for s in (edf(runs, parts), freeze(prof, cost, runs, edf(runs, parts)),
                  barrier_schedule(len(runs))):
            a, b = cycle(prof, cost, runs, s), cycle(prof, barely, runs, s)
            assert b.iteration_time == pytest.approx(a.iteration_time, rel=1e-9, abs=1e-12)


def test_interference_slows_the_forward_beside_a_message():
    # rho = 1: the compute thread runs at half speed while a message is in flight
    slowed = COST.with_interference([(1, 1.0)])
    base = cycle(TWO, COST, WFBP, edf(WFBP, [2, 1])).iteration_time
    assert cycle(TWO, slowed, WFBP, edf(WFBP, [2, 1])).iteration_time > base + 0.5


def test_a_part_interferes_as_its_whole_group_would():
    # rho 0 and sigma 1 at a part's size, rho 2 and sigma 1.5 at the whole group's: parts sent
    # back to back move the same bytes per second, so rho and sigma are read at the group's
    # size, and the cycle is the one under rho 2 and sigma 1.5 at every size
    by_size = COST.with_interference([(20, 0.0), (40, 2.0)], comm_slowdown=[(20, 1.0),
                                                                            (40, 1.5)])
    flat = COST.with_interference([(1, 2.0)], comm_slowdown=[(1, 1.5)])
    for parts in ([2, 1], [4, 1], [10, 1]):
        s = edf(WFBP, parts)
        got = cycle(TWO, by_size, WFBP, s)
        assert got.iteration_time == pytest.approx(cycle(TWO, flat, WFBP, s).iteration_time)
        assert got.comm_end == pytest.approx(cycle(TWO, flat, WFBP, s).comm_end)


def test_parts_are_as_equal_as_elements_allow_and_never_empty():
    assert part_bounds(10, 4) == [(0, 2), (2, 5), (5, 7), (7, 10)]
    assert part_bounds(5, 4) == [(0, 1), (1, 2), (2, 3), (3, 5)]
    assert part_bounds(0, 1) == [(0, 0)]
    # layers of 3, 0 and 4 elements in 2 parts [0, 3) [3, 7): the empty one goes where its
    # place (3) falls
    assert part_layers([3, 0, 4], 2) == [(0,), (1, 2)]
    assert part_layers([4, 3], 3) == [(0,), (0,), (1,)]  # [0, 2) [2, 4) [4, 7)
    assert part_layers([3, 4], 3) == [(0,), (0, 1), (1,)]


@pytest.mark.parametrize("change, message", [
    ({"parts": (0, 1)}, r"parts\[0\]: must be 1..10"),
    ({"parts": (11, 1)}, r"parts\[0\]: must be 1..10"),
    ({"ops": ("allreduce", "bcast")}, r"ops\[1\]"),
    ({"order": ((0, 0, "ar"),)}, r"message \[1, 0, 'ar'\] is missing"),
    ({"order": ((0, 0, "ar"), (0, 0, "ar"), (1, 0, "ar"))}, "appears twice"),
    ({"order": ((0, 0, "ar"), (1, 0, "rs"))}, "not a message of this plan"),
    ({"policy": "fifo"}, "policy"),
    ({"update": "lazy"}, "update"),
    ({"batches": (3,)}, "batches"),
])
def test_a_malformed_schedule_is_one_line_naming_the_field(change, message):
    base = dict(parts=(1, 1), ops=("allreduce", "allreduce"),
                order=((0, 0, "ar"), (1, 0, "ar")), policy="sequence", credit=0,
                update="per-layer")
    with pytest.raises(PlanError, match=message):
        Schedule(**{**base, **change}).check([10, 1])


def test_an_all_gather_before_its_reduce_scatter_is_refused():
    s = Schedule((1,), ("rs-ag",), ((0, 0, "ag"), (0, 0, "rs")), "sequence", 0, "per-layer")
    with pytest.raises(PlanError, match="comes before its reduce-scatter"):
        s.check([4])


def test_schedule_json_round_trip():
    s = Schedule((2, 1), ("allreduce", "rs-ag"), ((1, 0, "rs"), (0, 1, "ar"), (0, 0, "ar"),
                                                 (1, 0, "ag")),
                 "sequence", 0, "per-layer", bound=1.5, batches=(1, 2, 1))
    again = Schedule.from_dict(s.to_dict())
    assert again == s
    assert "bound" not in again.canon()


def test_a_scheduled_plan_is_frozen_saved_and_loaded(tmp_path):
    groups = [["l2"], ["l1"]]
    plan = timeline(TWO, COST, groups, edf(WFBP, [2, 1]), scheme="custom")
    assert plan.schedule.policy == "sequence"  # what ranks run: one sequence
    assert plan.iteration_time == pytest.approx(5.68)
    assert plan.num_messages == 3 and len(plan.comm_start) == 3
    assert plan.ideal == pytest.approx(4.0)
    path = tmp_path / "plan.json"
    plan.save(path)
    again = load_plan(path)
    assert again.to_dict()["format"] == SCHEDULED_FORMAT
    assert again.schedule == plan.schedule and again.digest() == plan.digest()
    other = timeline(TWO, COST, groups, edf(WFBP, [1, 1]))
    assert other.digest() != plan.digest()  # ranks with different parts must not train
    bad = plan.to_dict()
    bad["schedule"]["parts"] = [0, 1]
    with pytest.raises(PlanError, match=r"plan: schedule: parts\[0\]"):
        Plan.from_dict(bad)
    bad = plan.to_dict()
    bad["comm_start"] = bad["comm_start"][:2]
    with pytest.raises(PlanError, match="comm_start: must list one time per message"):
        Plan.from_dict(bad)


def test_the_barrier_case_is_the_papers_recurrences_to_the_last_bit():
    rng = random.Random(3)
    for _ in range(50):
        prof, runs, _ = random_case(rng)
        prof = Profile(prof.model, 1, 4, prof.forward_time, tuple(
            LayerProfile(x.name, x.params, x.backward_time) for x in prof.layers))
        cost = CostModel(rng.uniform(0, 0.003), rng.uniform(0, 1e-8))
        # the recurrences, written out here: ready(l) = t_f + t_b(L) + ... + t_b(l); each
        # group from max(the channel free, its input-most layer ready), lasting T
        ready, t = {}, prof.forward_time
        for l in range(prof.num_layers, 0, -1):
            t = t + prof.layers[l - 1].backward_time
            ready[l] = t
        ends, free = [], 0.0
        for g in runs:
            free = max(free, ready[g[-1]]) + cost.time(
                sum(prof.layers[l - 1].params * 4 for l in g))
            ends.append(free)
        for schedule in (None, barrier_schedule(len(runs))):
            c = cycle(prof, cost, runs, schedule)
            assert list(c.comm_end) == ends and c.iteration_time == ends[-1]
