"""The optimiser that also overlaps the next forward pass (comm/model/schedule_search.py): its lower
bound holds for every schedule, its answer is never worse than the schedules it is given, it
is a pure function, and the other systems' schedules are what their papers describe."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from mgcaffe.comm.model.cost import CostModel
from mgcaffe.comm.model.profile import LayerProfile, Profile, load_profile
from mgcaffe.comm.model.schedule import Schedule, barrier_schedule, edf_order
from mgcaffe.comm.model.schedule_search import (
    DEAR_GROUP_BYTES,
    bucket_runs,
    bytescheduler_schedule,
    dear_schedule,
    lower_bound,
    overlap_schedule,
    runs_layers,
)
from mgcaffe.comm.model.schemes import make_plan
from mgcaffe.comm.model.timeline import cycle

REPO = Path(__file__).resolve().parents[2]
TWO = Profile("two", 1, 4, 2.0, (LayerProfile("l1", 1, 1.0, 1.0),
                                 LayerProfile("l2", 10, 1.0, 1.0)))
COST = CostModel(0.2, 0.07)


def random_profile(rng, L=None):
    L = L or rng.randint(1, 14)
    layers = tuple(LayerProfile(f"l{i}", rng.choice([0, 3, 100, 5000, 200000, 2000000]),
                                rng.uniform(0, 0.01), rng.choice([None, rng.uniform(0, 5e-3)]),
                                rng.choice([0.0, rng.uniform(0, 1e-3)])) for i in range(L))
    return Profile("r", 1, 4, rng.uniform(0, 0.03), layers)


def random_runs(rng, L):
    runs, hi = [], L
    while hi >= 1:
        lo = rng.randint(1, hi)
        runs.append((hi, lo))
        hi = lo - 1
    return runs


def test_the_bound_of_the_two_layer_example():
    # compute: t_b + t_f = 4; layer 1: ready at 2 + T(4 B) 0.48 + both forwards 2 = 4.48;
    # layer 2: ready at 1 + T(44 B) 3.28 + its forward 1 = 5.28
    b = lower_bound(TWO, COST)
    assert b.value == pytest.approx(5.28)
    assert b.layer == 2 and b.subadditive
    assert "layers 1..2" in b.describe(TWO.names)


def test_the_bound_holds_for_every_schedule():
    rng = random.Random(7)
    for _ in range(150):
        prof = random_profile(rng)
        cost = CostModel(rng.uniform(0, 0.003), rng.uniform(0, 1e-8))
        if rng.random() < 0.3:
            cost = cost.with_interference([(1, rng.uniform(0, 2))], [(1, rng.uniform(1, 2))])
        bound = lower_bound(prof, cost).value
        L = prof.num_layers
        runs = random_runs(rng, L)
        gl = runs_layers(runs)
        parts = [rng.randint(1, max(1, min(5, sum(prof.layers[l - 1].params for l in g))))
                 for g in gl]
        ops = ["allreduce"] * len(runs)
        schedules = [
            (runs, barrier_schedule(len(runs))),
            (runs, Schedule(tuple(parts), tuple(ops), edf_order(gl, parts, ops), "priority",
                            rng.choice([0, 10000]), "per-layer")),
            bytescheduler_schedule(prof),
            dear_schedule(prof, rng.choice([1000, DEAR_GROUP_BYTES])),
        ]
        for r, s in schedules:
            t = cycle(prof, cost, runs_layers(r), s).iteration_time
            assert bound <= t * (1 + 1e-12), (bound, t)


def test_a_superadditive_cost_uses_a_bound_valid_for_any_split():
    class Convex:
        """T(M) = (M / 1000)^2 ms: pieces are cheaper than the whole."""

        interferes = False
        interference = comm_slowdown = ()

        def time(self, m):
            return 1e-3 * (m / 1000.0) ** 2

    prof = Profile("big", 1, 4, 0.0, (LayerProfile("l1", 10000, 0.0),))
    b = lower_bound(prof, Convex())
    assert not b.subadditive
    # 40 kB sent in 40 parts of 1 kB costs 40 ms, whole 1.6 s: the bound allows the parts
    runs = [(1, 1)]
    split = Schedule((40,), ("allreduce",), edf_order([[1]], [40], ["allreduce"]),
                     "priority", 0, "per-layer")
    t = cycle(prof, Convex(), runs_layers(runs), split).iteration_time
    assert t == pytest.approx(0.04)
    assert b.value <= t


def test_the_search_never_loses_to_what_it_is_given_and_is_pure():
    rng = random.Random(3)
    for _ in range(10):
        prof = random_profile(rng, rng.randint(2, 25))
        cost = CostModel(rng.uniform(1e-5, 3e-3), rng.uniform(1e-10, 1e-8))
        L = prof.num_layers
        given = {"bytescheduler": bytescheduler_schedule(prof), "dear": dear_schedule(prof),
                 "wfbp": ([(l, l) for l in range(L, 0, -1)], barrier_schedule(L)),
                 "synceasgd": ([(L, 1)], barrier_schedule(1))}
        choice = overlap_schedule(prof, cost, [random_runs(rng, L)], given, budget=5000)
        for runs, s in given.values():
            assert choice.iteration_time <= cycle(prof, cost, runs_layers(runs),
                                                  s).iteration_time * (1 + 1e-12)
        assert choice.iteration_time == pytest.approx(
            cycle(prof, cost, runs_layers(choice.runs), choice.schedule).iteration_time,
            rel=1e-12)
        assert choice.bound.value <= choice.iteration_time * (1 + 1e-12)
        again = overlap_schedule(prof, cost, [], given, budget=5000)
        repeat = overlap_schedule(prof, cost, [], given, budget=5000)
        assert (again.runs, again.schedule) == (repeat.runs, repeat.schedule)


def test_the_two_layer_example_is_split_and_reordered():
    choice = overlap_schedule(TWO, COST)
    # the barrier takes 6.48 s; cutting layer 2 and sending layer 1 first takes 5.68 s
    assert choice.iteration_time <= 5.68 + 1e-9
    assert choice.schedule.update == "per-layer"
    assert choice.schedule.parts[0] > 1
    assert 0 < choice.gap < 0.08 and not choice.exact


def test_free_communication_meets_the_bound_and_says_it_is_exact():
    prof = Profile("p", 1, 4, 0.01, tuple(LayerProfile(f"l{i}", 1000, 0.001)
                                          for i in range(8)))
    choice = overlap_schedule(prof, CostModel(0.0, 0.0))
    assert choice.exact and choice.gap == 0
    assert choice.iteration_time == pytest.approx(prof.ideal_time)


def test_bytescheduler_parts_credit_and_priority():
    prof = Profile("b", 1, 4, 0.01, (LayerProfile("conv", 1000, 0.001),
                                     LayerProfile("fc", 2_500_000, 0.001),
                                     LayerProfile("out", (1 << 20) + 1, 0.001)))
    runs, s = bytescheduler_schedule(prof)
    assert runs == [(3, 3), (2, 2), (1, 1)]  # no merging
    assert s.parts == (2, 3, 1)  # at most 1M parameters a part
    assert s.credit == 4 * (4 << 20) and s.policy == "priority" and s.update == "per-layer"
    assert s.order[0] == (2, 0, "ar")  # the input side first


def test_dear_reduce_scatters_in_backward_order_and_gathers_in_forward_order():
    prof = Profile("d", 1, 4, 0.01, tuple(LayerProfile(f"l{i}", 4_000_000, 0.001)
                                          for i in range(5)))
    runs, s = dear_schedule(prof)  # 16 MB a layer: buckets of two (32 MB >= 25 MB)
    assert runs == bucket_runs(prof, DEAR_GROUP_BYTES) == [(5, 4), (3, 2), (1, 1)]
    assert s.order == ((0, 0, "rs"), (1, 0, "rs"), (2, 0, "rs"), (2, 0, "ag"), (1, 0, "ag"),
                       (0, 0, "ag"))
    assert s.ops == ("rs-ag",) * 3 and s.update == "per-layer"


# The all-reduce among 2 hosts over 1 Gbit/s TCP, each size measured alone after an idle link
# (the trainer's start-up benchmark): 16 KB costs 7.5 ns/byte, 53.5 MB 11.6 ns/byte.
TCP_1GBIT = CostModel(3.52e-05, 8.83e-09, times=(
    (4, 3.81e-05), (1024, 3.81e-05), (4096, 1.139e-04), (16384, 1.224e-04),
    (65536, 5.587e-04), (262144, 2.407e-03), (1048576, 1.0621e-02), (4194304, 4.7568e-02),
    (16777216, 1.6979e-01), (53513120, 6.2230e-01)))


def test_cutting_a_message_never_makes_it_cheaper():
    # k back-to-back parts of a message cost at least the whole plus k - 1 start-ups, however
    # cheap one small message measured alone is; on the paper's line a part costs T(part)
    whole = 53513120
    for k in (2, 7, 3266):
        cuts = [q * whole // k for q in range(k + 1)]
        parts = [TCP_1GBIT.part_time(b - a, whole) for a, b in zip(cuts, cuts[1:])]
        assert sum(parts) >= TCP_1GBIT.time(whole) + (k - 1) * TCP_1GBIT.time(0) - 1e-12
    assert 3266 * TCP_1GBIT.time(whole / 3266) < TCP_1GBIT.time(whole)  # what it guards
    line = CostModel(2e-4, 7e-9)
    assert line.part_time(1000, 10 ** 6) == line.time(1000)


def test_a_part_travels_in_its_messages_format_even_where_another_is_cheaper_alone():
    # 10 ns/B up to 1 MB, then 0.1 ns/B; casts 1 ns/B: a 100 KB message alone is cheaper in
    # float16 (half of its steep bytes saved), a 100 MB one in float32 (the casts outweigh
    # the flat link); the parts of the 100 MB message go float32 as it does
    curve = CostModel(0.0, 1e-9, times=((1, 0.0), (10 ** 6, 0.01), (10 ** 8, 0.02)),
                      wires=("float32", "float16"), cast=(("float16", 1e-9),))
    part, whole = 10 ** 5, 10 ** 8
    assert curve.wire_for(part) == "float16" and curve.wire_for(whole) == "float32"
    alone = curve.wire_time(part, "float32")
    assert alone > curve.time(part)  # the premise: float32 costs more for the part alone
    share = curve.wire_time(whole, "float32") * part / whole
    assert curve.part_time(part, whole) == max(alone, share) == alone
    assert curve.part_time(part, part) == curve.time(part)  # a message of its own


def test_the_overlap_schedule_gains_nothing_from_cutting_on_a_measured_curve():
    # each group's parts together hold the channel at least as long as the group sent whole
    # (before, the search cut GoogleNet's 53.5 MB into 3266 parts of 16 KB, predicted 400 ms
    # against 649 for mgwfbp, and measured 1.3-1.5x its prediction)
    prof = load_profile(REPO / "models" / "paper" / "googlenet-k80.json")
    plan = make_plan(prof, TCP_1GBIT, "overlap")
    spans = {g: set() for g in range(len(plan.groups))}  # a batch of parts: one span
    for i, (g, _, _) in enumerate(plan.schedule.order):
        spans[g].add((plan.comm_start[i], plan.comm_end[i]))
    for g, size in enumerate(plan.group_sizes):
        held = sum(e - s for s, e in spans[g])
        assert held >= TCP_1GBIT.time(size) * (1 - 1e-9), (g, held, TCP_1GBIT.time(size))
    assert plan.iteration_time <= make_plan(prof, TCP_1GBIT, "mgwfbp").iteration_time
