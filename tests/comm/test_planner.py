"""Merge planner: Algorithm 1, the exact optimum (against brute force), the properties of the
issue, the timeline, and the Plan as data."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import time

import pytest

from mgcaffe.comm.model.cost import CostModel, cost_for, load_network
from mgcaffe.comm.model.plan import Plan, load_plan
from mgcaffe.comm.model.profile import LayerProfile, Profile, load_profile
from mgcaffe.comm.model.schemes import (
    DEFAULT_BUCKET_BYTES,
    DEFAULT_SCHEME,
    REGISTRY,
    SCHEMES,
    canonical_scheme,
    make_plan,
    make_plans,
)
from mgcaffe.comm.model.timeline import timeline
from mgcaffe.errors import PlanError

REL = 1e-12


def toy(params, backward, forward=0.0, dtype_bytes=4) -> Profile:
    """Layers l1 (input side) .. lL with the given params and backward times."""
    layers = [LayerProfile(f"l{i + 1}", p, float(t))
              for i, (p, t) in enumerate(zip(params, backward))]
    return Profile("toy", 1, dtype_bytes, float(forward), tuple(layers))


def all_groupings(profile: Profile):
    """Every grouping of consecutive layers, output side first: 2^(L-1) of them."""
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


def random_cost(rng: random.Random) -> CostModel:
    return CostModel(10 ** rng.uniform(-5, -1.5), 10 ** rng.uniform(-10, -8))


# the schemes that only group layers and send the groups in order (the others, which also
# cut, reorder and update per layer, are tested in test_scheduler.py (schedule_search.py)
# and test_schedule.py)
GROUPING = tuple(s.name for s in REGISTRY if s.schedule is None)


def check_plan(plan: Plan, profile: Profile, cost: CostModel) -> None:
    """Every layer in exactly one group, groups consecutive in backward order, sizes right,
    and the timeline consistent."""
    back = profile.names[::-1]
    assert [n for g in plan.groups for n in g] == back
    assert all(plan.groups)
    sizes = {layer.name: layer.params * profile.dtype_bytes for layer in profile.layers}
    assert list(plan.group_sizes) == [sum(sizes[n] for n in g) for g in plan.groups]
    assert plan.layers == tuple(profile.names)
    # backward: L .. 1 back to back after the forward pass
    t = profile.forward_time
    for i in range(profile.num_layers - 1, -1, -1):
        assert plan.backward_start[i] == pytest.approx(t, rel=REL, abs=1e-15)
        t += profile.layers[i].backward_time
        assert plan.backward_end[i] == pytest.approx(t, rel=REL, abs=1e-15)
    assert plan.ideal == pytest.approx(profile.ideal_time, rel=REL)
    end = {n: e for n, e in zip(plan.layers, plan.backward_end)}
    prev_end = 0.0
    for g, group in enumerate(plan.groups):
        s, e = plan.comm_start[g], plan.comm_end[g]
        assert s >= prev_end  # one message at a time
        assert s >= end[group[-1]]  # not before its last layer's gradient is ready
        assert s == max(prev_end, end[group[-1]])  # and no idling either
        assert e - s == pytest.approx(cost.time(plan.group_sizes[g]), rel=1e-9, abs=1e-15)
        prev_end = e
    assert plan.iteration_time == plan.comm_end[-1]
    assert plan.iteration_time >= plan.ideal
    assert plan.non_overlapped_comm == pytest.approx(plan.iteration_time - plan.ideal,
                                                     abs=1e-15)
    assert (plan.a, plan.b) == (cost.a, cost.b)


# ----------------------------------------------------------------------------- optimum
@pytest.mark.parametrize("L", range(1, 10))
@pytest.mark.parametrize("cost_kind", ["line", "measured-curve"])
def test_optimal_equals_brute_force(L, cost_kind, make_random_profile):
    # a measured curve (random_curve, below) need not be subadditive: the optimum must hold
    # for any non-decreasing T, not only for the paper's a + b*M
    rng = random.Random((1000 if cost_kind == "line" else 2000) + L)
    for _ in range(12 if L < 8 else 4):
        profile = make_random_profile(rng, L, zero_params=True)
        cost = random_cost(rng) if cost_kind == "line" else random_curve(rng)
        best = min(timeline(profile, cost, g).iteration_time for g in all_groupings(profile))
        opt = make_plan(profile, cost, "mgwfbp")
        check_plan(opt, profile, cost)
        assert opt.iteration_time == pytest.approx(best, rel=REL)
        for s in GROUPING:
            assert opt.iteration_time <= make_plan(profile, cost, s).iteration_time * (1 + REL)


def test_optimal_brute_force_integer_times():
    """Ties and exact arithmetic: small integer profiles, every combination."""
    rng = random.Random(7)
    for _ in range(300):
        L = rng.randint(1, 6)
        profile = toy([rng.randint(0, 4) for _ in range(L)], [rng.randint(0, 4) for _ in range(L)],
                      forward=rng.randint(0, 3))
        cost = CostModel(rng.randint(0, 4), 0.25 * rng.randint(0, 2))
        best = min(timeline(profile, cost, g).iteration_time for g in all_groupings(profile))
        assert make_plan(profile, cost, "mgwfbp").iteration_time == best


# ----------------------------------------------------------------------------- Algorithm 1
def test_algorithm1_by_hand_not_optimal():
    """Worked by hand from the model (docs/planner.md). t_f = 0, p = (4, 1, 1) params (b = 1 s
    per param), t_b = (4, 3, 4), a = 4: ready(3) = 4, ready(2) = 7, ready(1) = 11;
    t_c = a + p = (8, 5, 5).
    l = 3: tau_c(3) = 4, r = 7 < 4 + a: merge (C.2: waits 3 < a); p(2) = 2, t_c(2) = 6,
    tau_c(2) = max(4, 7) = 7. l = 2: r = 11, not < 7 + 4: keep. Messages {3,2} 7..13, {1}
    13..21. The optimum sends {3} 4..9 and {2,1} 11..20; WFBP ends at 22, SyncEASGD at 21."""
    profile = toy([4, 1, 1], [4, 3, 4])
    cost = CostModel(4.0, 0.25)
    greedy = make_plan(profile, cost, "mgwfbp-paper")
    assert greedy.groups == (("l3", "l2"), ("l1",))
    assert greedy.comm_start == (7.0, 13.0) and greedy.comm_end == (13.0, 21.0)
    assert greedy.iteration_time == 21.0
    opt = make_plan(profile, cost, "mgwfbp")
    assert opt.groups == (("l3",), ("l2", "l1"))
    assert (opt.comm_start, opt.comm_end, opt.iteration_time) == ((4.0, 11.0), (9.0, 20.0), 20.0)
    assert make_plan(profile, cost, "wfbp").iteration_time == 22.0
    assert make_plan(profile, cost, "synceasgd").iteration_time == 21.0
    assert greedy.merged_layers == frozenset({"l3"})
    assert greedy.group_layer_indices() == [[3, 2], [1]]


def test_algorithm1_c1_chain():
    """Short backward, large start-up: C.1/C.2 merge everything into one message."""
    profile = toy([1, 1, 1], [0.5, 0.5, 0.5])
    cost = CostModel(1.0, 0.0)
    plan = make_plan(profile, cost, "mgwfbp-paper")
    assert plan.groups == (("l3", "l2", "l1"),)
    assert plan.iteration_time == 2.5
    assert make_plan(profile, cost, "wfbp").iteration_time == 3.5


def test_algorithm1_strict_inequality_at_the_boundary():
    """r == tau_c(l) + a is C.2's boundary: not merged (merge iff r < tau_c(l) + a)."""
    profile = toy([1, 1], [1.0, 1.0])  # ready(2) = 1, ready(1) = 2
    plan = make_plan(profile, CostModel(1.0, 0.0), "mgwfbp-paper")  # tau_c(2) = 1, 1 + a = 2 = r
    assert plan.groups == (("l2",), ("l1",))
    plan = make_plan(profile, CostModel(1.0 + 1e-9, 0.0), "mgwfbp-paper")
    assert plan.groups == (("l2", "l1"),)


def test_algorithm1_never_worse_than_wfbp_or_synceasgd(make_random_profile):
    """Each merge of Algorithm 1 ends the message carrying l-1 earlier (so t_iter <= WFBP's),
    and a group is closed only when the next gradient is ready no earlier than its end minus
    b*bytes (so t_iter <= SyncEASGD's). Also counts how often it misses the optimum."""
    rng = random.Random(3)
    worse = 0
    n = 400
    for _ in range(n):
        profile = make_random_profile(rng, rng.randint(2, 60))
        cost = random_cost(rng)
        plans = make_plans(profile, cost, GROUPING)
        g = plans["mgwfbp-paper"].iteration_time
        assert g <= plans["wfbp"].iteration_time * (1 + REL)
        assert g <= plans["synceasgd"].iteration_time * (1 + REL)
        assert plans["mgwfbp"].iteration_time <= g * (1 + REL)
        worse += g > plans["mgwfbp"].iteration_time * (1 + 1e-9)
    # strictly worse on about a quarter of random profiles (depends on the mix)
    assert 0.05 * n < worse < 0.5 * n


def test_greedy_above_optimal_on_googlenet_64(paper_dir):
    """About 11% above the optimum on GoogleNet, 64 nodes, the authors' constants."""
    profile = load_profile(paper_dir / "googlenet-k80.json")
    cost = cost_for(load_network(paper_dir / "network-10gbe-paper-constants.json"), 64)
    g = make_plan(profile, cost, "mgwfbp-paper").iteration_time
    o = make_plan(profile, cost, "mgwfbp").iteration_time
    assert g / o - 1 == pytest.approx(0.108, abs=0.001)


# ----------------------------------------------------------------------------- properties
@pytest.mark.parametrize("scheme", GROUPING)
def test_every_scheme_gives_a_consistent_plan(scheme, make_random_profile):
    rng = random.Random(SCHEMES.index(scheme))
    for _ in range(60):
        profile = make_random_profile(rng, rng.randint(1, 80), zero_params=True)
        cost = random_cost(rng)
        plan = make_plan(profile, cost, scheme, bucket_bytes=rng.choice([0, 10**6, 10**8]))
        check_plan(plan, profile, cost)
        assert plan.scheme == scheme


def test_wfbp_is_optimal_when_a_is_zero(make_random_profile):
    rng = random.Random(5)
    for _ in range(100):
        profile = make_random_profile(rng, rng.randint(1, 60))
        cost = CostModel(0.0, 10 ** rng.uniform(-10, -8))
        plans = make_plans(profile, cost, GROUPING)
        assert plans["wfbp"].iteration_time == pytest.approx(plans["mgwfbp"].iteration_time,
                                                            rel=REL)
        assert plans["mgwfbp-paper"].iteration_time == pytest.approx(plans["mgwfbp"].iteration_time,
                                                              rel=REL)


def test_everything_merges_when_a_is_huge(make_random_profile):
    rng = random.Random(6)
    for _ in range(50):
        profile = make_random_profile(rng, rng.randint(1, 60))
        cost = CostModel(1e3, 1e-9)  # a start-up far beyond the whole backward pass
        sync = make_plan(profile, cost, "synceasgd")
        for s in ("mgwfbp-paper", "mgwfbp"):
            plan = make_plan(profile, cost, s)
            assert plan.num_messages == 1
            assert plan.groups == sync.groups
            assert plan.iteration_time == sync.iteration_time


def test_synceasgd_formula(make_random_profile):
    profile = make_random_profile(random.Random(8), 30)
    cost = CostModel(1e-3, 1e-9)
    plan = make_plan(profile, cost, "synceasgd")
    assert plan.num_messages == 1
    assert plan.iteration_time == pytest.approx(
        profile.ideal_time + cost.time(4 * profile.total_params), rel=REL)


def test_threshold_buckets(make_random_profile):
    profile = make_random_profile(random.Random(9), 60)
    cost = CostModel(1e-3, 1e-9)
    for bucket in (1, 10**5, 4 * 10**6, 25 * 2**20, 10**12):
        plan = make_plan(profile, cost, "threshold", bucket_bytes=bucket)
        assert plan.bucket_bytes == bucket
        assert all(size >= bucket for size in plan.group_sizes[:-1])
        # minimal: each bucket closes as soon as it reaches the threshold
        for g, group in enumerate(plan.groups[:-1]):
            assert plan.group_sizes[g] - plan.layer_bytes[plan.layer_index[group[-1]] - 1] \
                < bucket
    assert make_plan(profile, cost, "threshold", bucket_bytes=0).groups == \
        make_plan(profile, cost, "wfbp").groups
    assert make_plan(profile, cost, "threshold", bucket_bytes=10**12).groups == \
        make_plan(profile, cost, "synceasgd").groups
    assert make_plan(profile, cost, "threshold").bucket_bytes == DEFAULT_BUCKET_BYTES
    assert make_plan(profile, cost, "wfbp", bucket_bytes=5).bucket_bytes is None


def test_one_layer():
    profile = toy([10], [1.0], forward=0.5)
    for s in SCHEMES:
        plan = make_plan(profile, CostModel(0.1, 0.01), s)
        assert plan.groups == (("l1",),)
        assert plan.iteration_time == pytest.approx(1.5 + 0.1 + 0.4)


# ----------------------------------------------------------------------------- the API
def test_schemes_and_aliases():
    # one name per scheme: the --comm value; the old names are aliases
    assert SCHEMES == ("wfbp", "synceasgd", "mgwfbp", "mgwfbp-paper", "threshold", "overlap",
                       "bytescheduler", "dear")
    assert GROUPING == SCHEMES[:5]
    assert DEFAULT_SCHEME == "mgwfbp"
    assert canonical_scheme("infocom") == "mgwfbp-paper"
    assert canonical_scheme("paper") == "mgwfbp-paper"
    assert canonical_scheme("MG-WFBP") == "mgwfbp"
    assert canonical_scheme("optimal") == "mgwfbp"
    assert canonical_scheme("ddp") == "threshold"
    assert [s.name for s in REGISTRY] == list(SCHEMES)
    assert [s.name for s in REGISTRY if s.baseline] == ["wfbp", "synceasgd"]
    assert all(s.summary for s in REGISTRY)
    profile, cost = toy([4, 1, 1], [4, 3, 4]), CostModel(4.0, 0.25)
    for s in SCHEMES:  # a plan is named as it was asked for, whatever the spelling
        assert make_plan(profile, cost, s).scheme == s
    assert make_plan(profile, cost, "optimal").scheme == "mgwfbp"
    with pytest.raises(PlanError, match="unknown scheme 'fastest'"):
        make_plan(toy([1], [1]), CostModel(0, 0), "fastest")


def test_timeline_rejects_bad_groups():
    profile = toy([1, 2, 3], [1, 1, 1])
    cost = CostModel(0.1, 0.0)
    assert timeline(profile, cost, [["l3", "l2"], ["l1"]]).num_messages == 2
    for groups, msg in [
        ([["l3"], ["l2"]], "layer 'l1' is in no group"),
        ([["l3", "l2"], ["l2", "l1"]], "layer 'l2' appears in more than one place"),
        ([["l3", "l1"], ["l2"]], "not consecutive layers in backward order"),
        ([["l1", "l2", "l3"]], "not consecutive layers in backward order"),
        ([["l2", "l1"], ["l3"]], "not consecutive layers in backward order"),
        ([["l3", "l2", "l1"], []], "empty group"),
        ([["l3", "l2", "x"]], "unknown layer 'x'"),
    ]:
        with pytest.raises(PlanError, match=msg):
            timeline(profile, cost, groups)


def test_plan_is_frozen_and_records_nodes(paper_dir):
    profile = load_profile(paper_dir / "googlenet-k80.json")
    cost = cost_for(load_network(paper_dir / "network-10gbe.json"), 8)
    plan = make_plan(profile, cost, "mgwfbp")
    assert plan.nodes == 8
    assert make_plan(profile, cost, "mgwfbp", nodes=16).nodes == 16
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.iteration_time = 0.0  # type: ignore[misc]


def test_plan_round_trip_and_digest(tmp_path, paper_dir):
    profile = load_profile(paper_dir / "googlenet-k80.json")
    cost = cost_for(load_network(paper_dir / "network-10gbe-paper-constants.json"), 64)
    plans = make_plans(profile, cost)
    for plan in plans.values():
        again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
        assert again == plan
        assert again.digest() == plan.digest()
        path = tmp_path / f"{plan.scheme}.json"
        plan.save(path)
        assert load_plan(path) == plan
    # stable across versions and machines: ranks compare these
    assert plans["mgwfbp"].digest() == \
        "2f7088d0024e846a73713ad370e9ebcb744cc0b8085732472fe4485c499ea106"
    assert plans["mgwfbp-paper"].digest() == \
        "600fbbd999d7ae27f872606835942cd33ada985ededacd91fd84f4f4946d74df"
    assert len({p.digest() for p in plans.values()}) == len(plans)
    # the digest ignores timing (a, b), only what is packed and in which order
    other = make_plan(profile, CostModel(cost.a * 2, cost.b), "wfbp")
    assert other.digest() == plans["wfbp"].digest()


def test_plans_written_under_the_old_names_load_under_the_new(tmp_path):
    """Format 1 called Algorithm 1 `mgwfbp` and the optimum `optimal`; the groups (and so the
    digest) are untouched, the scheme is read under its new name."""
    profile, cost = toy([4, 1, 1], [4, 3, 4]), CostModel(4.0, 0.25)
    for old, new in (("mgwfbp", "mgwfbp-paper"), ("optimal", "mgwfbp"), ("wfbp", "wfbp")):
        d = make_plan(profile, cost, new).to_dict()
        assert d["format"] == "mgcaffe-plan/2" and d["scheme"] == new
        d.update(format="mgcaffe-plan/1", scheme=old)
        path = tmp_path / f"{old}.json"
        path.write_text(json.dumps(d))
        plan = load_plan(path)
        assert plan.scheme == new and plan.digest() == d["digest"]
    # today's format keeps the name it holds
    d = make_plan(profile, cost, "mgwfbp").to_dict()
    assert Plan.from_dict(d).scheme == "mgwfbp"
    with pytest.raises(PlanError, match="format: expected 'mgcaffe-plan/2', got 'x'"):
        Plan.from_dict(dict(d, format="x"))


def test_plan_from_dict_rejects_edits(paper_dir, tmp_path):
    profile = load_profile(paper_dir / "googlenet-k80.json")
    cost = cost_for(load_network(paper_dir / "network-10gbe.json"), 64)
    d = make_plan(profile, cost, "mgwfbp").to_dict()

    def bad(mutate, match):
        dd = json.loads(json.dumps(d))
        mutate(dd)
        path = tmp_path / "plan.json"
        path.write_text(json.dumps(dd))
        with pytest.raises(PlanError, match=match):
            load_plan(path)

    bad(lambda x: x["groups"][-1].pop(), r"plan\.json: groups: layer .* is in no group")
    bad(lambda x: x["groups"].reverse(), r"plan\.json: groups: not consecutive")
    bad(lambda x: x["group_sizes"].__setitem__(0, 1), r"plan\.json: group_sizes\[0\]: 1 bytes")
    bad(lambda x: x.update(digest="0" * 64), r"plan\.json: digest: .* does not match")
    bad(lambda x: x.pop("iteration_time"), r"plan\.json: iteration_time: missing")
    bad(lambda x: x.update(format="other/9"), r"plan\.json: format: expected")
    bad(lambda x: x["layers"][2].pop("bytes"), r"plan\.json: layers\[2\]\.bytes: missing")


def test_planning_500_layers_is_fast(make_random_profile):
    """ResNet-152-sized profiles plan well under a second with every grouping scheme
    (`overlap`'s search: benchmarks/bench_planner.py)."""
    rng = random.Random(11)
    profile = make_random_profile(rng, 500)
    for cost in (CostModel(1e-2, 3e-9), CostModel(1e-5, 1e-10), CostModel(10.0, 1e-9)):
        for s in GROUPING:
            t0 = time.perf_counter()
            make_plan(profile, cost, s)
            assert time.perf_counter() - t0 < 1.0, s


# ----------------------------------------------------------------------------- measured T
def random_curve(rng: random.Random, **terms) -> CostModel:
    """A measured-like T_ar: non-decreasing, often NOT subadditive (steep segments after flat
    ones, as TCP's large messages are), flat stretches and jumps included."""
    sizes = sorted({int(10 ** rng.uniform(1, 7.5)) for _ in range(rng.randint(2, 6))} | {4})
    t, points = 10 ** rng.uniform(-5, -3), []
    for m in sizes:
        points.append((m, t))
        t += rng.choice((0.0, 10 ** rng.uniform(-5, -1.5), 10 ** rng.uniform(-3, -1)))
    if len(points) < 2:
        points.append((points[-1][0] * 2, t))
    return CostModel(10 ** rng.uniform(-5, -3), 10 ** rng.uniform(-10, -8),
                     times=tuple(points), **terms)


def test_random_curves_are_often_not_subadditive():
    # the case the exactness below is about: T(x + y) > T(x) + T(y) for some sizes
    rng = random.Random(4)
    grid = [int(10 ** (k / 4)) for k in range(4, 31)]
    hits = sum(any(c.time(x + y) > c.time(x) + c.time(y) for x in grid for y in grid)
               for c in (random_curve(rng) for _ in range(50)))
    assert hits >= 10


def test_optimal_exact_for_integer_step_curves():
    """T with integer steps (jumps make merging two messages cost more than both): every
    combination."""
    rng = random.Random(8)
    for _ in range(300):
        L = rng.randint(1, 6)
        profile = toy([rng.randint(0, 4) for _ in range(L)], [rng.randint(0, 4) for _ in range(L)],
                      forward=rng.randint(0, 3))
        steps = sorted({4 * rng.randint(1, 24) for _ in range(3)} | {1, 100})
        times, t = [], rng.randint(0, 2)
        for i, m in enumerate(steps):
            times.append((m, t))
            if i % 2 == 0:  # jumps between flat stretches: merging can cost more than both
                t += rng.randint(0, 6)
        cost = CostModel(1, 0, times=tuple(times))
        best = min(timeline(profile, cost, g).iteration_time for g in all_groupings(profile))
        assert make_plan(profile, cost, "mgwfbp").iteration_time == pytest.approx(best,
                                                                                  rel=REL)


def test_plans_record_the_measured_curve(tmp_path):
    profile = toy([10, 20, 30], [1e-3, 2e-3, 3e-3])
    cost = CostModel(1e-4, 1e-8, nodes=2, times=((4, 1e-4), (400, 5e-3)))
    plan = make_plan(profile, cost, "mgwfbp")
    assert plan.times == cost.times
    path = tmp_path / "plan.json"
    plan.save(path)
    again = load_plan(path)
    assert again == plan and again.cost() == cost
    assert again.cost().time(200) == cost.time(200)
    # a plan without a curve (older files) rebuilds the line
    line = make_plan(profile, cost.paper(), "mgwfbp")
    assert "times" not in line.to_dict() and line.cost() == cost.paper()
