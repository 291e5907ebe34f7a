"""All-reduce cost model: formulas, aliases, fits precedence, overrides, least-squares fits."""

from __future__ import annotations

import csv
import json
import math

import pytest

from mgcaffe.comm.model.cost import (
    ALGORITHMS,
    CostModel,
    Network,
    canonical_algorithm,
    cost_for,
    fit_linear,
    fit_relative,
    formula,
    load_network,
)
from mgcaffe.errors import PlanError

ALPHA, BETA, GAMMA = 5e-5, 1e-9, 2e-10


def test_cost_model_time():
    c = CostModel(1e-3, 2e-9)
    assert c.time(0) == 1e-3
    assert c.time(1_000_000) == pytest.approx(1e-3 + 2e-3)
    assert CostModel(1e-3, 2e-9, nodes=8, origin="fit") == c  # informational fields
    with pytest.raises(PlanError, match="a: must be >= 0"):
        CostModel(-1e-3, 0)
    with pytest.raises(PlanError, match="b: must be a finite number"):
        CostModel(0, float("inf"))


@pytest.mark.parametrize("nodes", [2, 8, 64])
def test_formulas_power_of_two(nodes):
    lg = math.log2(nodes)
    n = nodes
    assert formula("ring", n, ALPHA, BETA, GAMMA) == pytest.approx(
        (2 * (n - 1) * ALPHA, 2 * (n - 1) / n * BETA + (n - 1) / n * GAMMA))
    assert formula("binary_tree", n, ALPHA, BETA, GAMMA) == pytest.approx(
        (2 * lg * ALPHA, lg * (2 * BETA + GAMMA)))
    assert formula("recursive_doubling", n, ALPHA, BETA, GAMMA) == pytest.approx(
        (lg * ALPHA, lg * (BETA + GAMMA)))
    assert formula("recursive_halving_doubling", n, ALPHA, BETA, GAMMA) == pytest.approx(
        (2 * lg * ALPHA, 2 * (n - 1) / n * BETA + (n - 1) / n * GAMMA))


def test_formulas_non_power_of_two_round_log_up():
    assert formula("binary_tree", 6, ALPHA, BETA, GAMMA) == pytest.approx(
        (2 * 3 * ALPHA, 3 * (2 * BETA + GAMMA)))
    assert formula("ring", 6, ALPHA, BETA, GAMMA)[0] == pytest.approx(10 * ALPHA)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_one_node_costs_nothing(algorithm):
    assert formula(algorithm, 1, ALPHA, BETA, GAMMA) == (0.0, 0.0)


def test_paper_startups():
    # the paper's measured start-ups 2(N-1) alpha: 90.52, 271.56, 633.64 us for N = 2, 4, 8
    for n, us in ((2, 90.52), (4, 271.56), (8, 633.64)):
        assert formula("ring", n, 45.26e-6, 0)[0] * 1e6 == pytest.approx(us)


@pytest.mark.parametrize("alias, name", [
    ("Ring", "ring"), ("tree", "binary_tree"), ("binary-tree", "binary_tree"),
    ("recursive-doubling", "recursive_doubling"), ("rd", "recursive_doubling"),
    ("Rabenseifner", "recursive_halving_doubling"),
    ("recursive halving doubling", "recursive_halving_doubling"),
])
def test_algorithm_aliases(alias, name):
    assert canonical_algorithm(alias) == name


def test_unknown_algorithm_names_file_and_field(tmp_path):
    path = tmp_path / "net.json"
    path.write_text(json.dumps({"alpha": 1e-5, "beta": 1e-9, "algorithm": "butterfly"}))
    with pytest.raises(PlanError) as exc:
        load_network(path)
    assert str(exc.value).startswith(f"{path}: algorithm: unknown all-reduce algorithm "
                                     f"'butterfly'")


def test_fits_take_precedence_unless_formula(paper_dir):
    net = load_network(paper_dir / "network-10gbe.json")
    raw = json.loads((paper_dir / "network-10gbe.json").read_text())
    for n in (2, 4, 8):
        c = cost_for(net, n)
        assert (c.a, c.b) == (raw["fits"][str(n)]["a"], raw["fits"][str(n)]["b"])
        assert c.nodes == n and c.origin == "fit"
        f = cost_for(net, n, use_formula=True)
        assert (f.a, f.b) == pytest.approx((2 * (n - 1) * raw["alpha"],
                                            2 * (n - 1) / n * raw["beta"]))
    c16 = cost_for(net, 16)
    assert c16.origin == "ring formula"
    assert c16.a == pytest.approx(30 * raw["alpha"])


def test_expected_cost_models(paper_dir):
    """expected.json's a and b: `paper` = paper constants + ring, `ring` = alpha/beta of
    network-10gbe.json, `fits` = its fits where listed, ring beyond."""
    expected = json.loads((paper_dir / "expected.json").read_text())
    nets = {"paper": (load_network(paper_dir / "network-10gbe-paper-constants.json"), True),
            "ring": (load_network(paper_dir / "network-10gbe.json"), True),
            "fits": (load_network(paper_dir / "network-10gbe.json"), False)}
    for model in expected["models"].values():
        for name, (net, use_formula) in nets.items():
            for n, point in model["cost_models"][name].items():
                c = cost_for(net, int(n), use_formula)
                assert c.a == pytest.approx(point["a"], rel=1e-12)
                assert c.b == pytest.approx(point["b"], rel=1e-12)


def test_overrides():
    net = Network.from_dict({"alpha": ALPHA, "beta": BETA})
    assert cost_for(net, 8, a=1e-3).a == 1e-3
    assert cost_for(net, 8, a=1e-3).b == pytest.approx(2 * 7 / 8 * BETA)
    assert cost_for(net, 8, b=3e-9).b == 3e-9
    both = cost_for(None, 8, a=1e-3, b=3e-9)
    assert (both.a, both.b, both.nodes) == (1e-3, 3e-9, 8)
    with pytest.raises(PlanError, match="both --a and --b"):
        cost_for(None, 8, a=1e-3)


def test_network_only_fits(tmp_path):
    path = tmp_path / "fits.json"
    path.write_text(json.dumps({"fits": {"8": {"a": 1e-3, "b": 1e-9, "rms_s": 1}},
                                "whatever": [1, 2]}))
    net = load_network(path)
    assert cost_for(net, 8) == CostModel(1e-3, 1e-9)
    with pytest.raises(PlanError, match=r"fits\.json: alpha: missing, needed for the formula "
                                        r"at N=16 \(fits list only N = 8\)"):
        cost_for(net, 16)


@pytest.mark.parametrize("d, field", [
    ({"beta": 1e-9}, "alpha: missing"),
    ({"alpha": 1e-5}, "beta: missing"),
    ({}, "alpha: missing"),
    ({"alpha": -1e-5, "beta": 1e-9}, "alpha: must be >= 0"),
    ({"alpha": 1e-5, "beta": "x"}, "beta: must be a number"),
    ({"alpha": 1e-5, "beta": 1e-9, "gamma": -1}, "gamma: must be >= 0"),
    ({"fits": {"eight": {"a": 1, "b": 1}}}, "fits: key 'eight' is not a number of nodes"),
    ({"fits": {"8": {"a": 1}}}, "fits.8.b: missing"),
    ({"fits": {"8": {"a": -1, "b": 0}}}, "fits.8.a: must be >= 0"),
    ({"fits": [1]}, "fits: must be a JSON object"),
])
def test_bad_networks(tmp_path, d, field):
    path = tmp_path / "net.json"
    path.write_text(json.dumps(d))
    with pytest.raises(PlanError) as exc:
        load_network(path)
    assert str(exc.value).startswith(f"{path}: {field}"), str(exc.value)


def test_nodes_must_be_positive():
    net = Network.from_dict({"alpha": ALPHA, "beta": BETA}, source="n.json")
    with pytest.raises(PlanError, match=r"n\.json: nodes: must be >= 1"):
        cost_for(net, 0)


def test_network_round_trip(paper_dir):
    net = load_network(paper_dir / "network-10gbe.json")
    again = Network.from_dict(net.to_dict())
    assert again == net


def test_fit_linear_exact_line():
    sizes = [0, 1000, 2000, 5000]
    c, rms = fit_linear(sizes, [1e-4 + 2e-9 * m for m in sizes])
    assert c.a == pytest.approx(1e-4) and c.b == pytest.approx(2e-9)
    assert rms == pytest.approx(0, abs=1e-15)


@pytest.mark.parametrize("key, min_bytes", [("fits", 12288), ("fits_all_sizes", 0)])
def test_fit_linear_reproduces_network_fits(paper_dir, key, min_bytes):
    """network-10gbe.json's per-N fits are least squares of the OSU data in the CSV."""
    rows = list(csv.DictReader((paper_dir / "osu-allreduce-10gbe.csv").open()))
    net = json.loads((paper_dir / "network-10gbe.json").read_text())
    for n, fit in net[key].items():
        pts = [(int(r["bytes"]), float(r["microseconds"]) * 1e-6) for r in rows
               if r["nodes"] == n and int(r["bytes"]) >= min_bytes]
        assert len(pts) == fit["points"]
        c, rms = fit_linear([p[0] for p in pts], [p[1] for p in pts])
        assert c.a == pytest.approx(fit["a"], rel=1e-9)
        assert c.b == pytest.approx(fit["b"], rel=1e-9)
        assert rms == pytest.approx(fit["rms_s"], rel=1e-9)


def test_fit_linear_nonnegative():
    # a line through the data would have a < 0; the constrained fit puts a at 0
    sizes, times = [1000, 2000, 3000], [0.5e-6, 2.5e-6, 4.5e-6]
    c, rms = fit_linear(sizes, times)
    assert c.a == 0.0
    assert c.b == pytest.approx(sum(s * t for s, t in zip(sizes, times))
                                / sum(s * s for s in sizes))
    assert rms > 0
    # decreasing times: b would be negative; the best constant is their mean
    c, _ = fit_linear([1, 2, 3], [3e-6, 2e-6, 1e-6])
    assert (c.a, c.b) == (pytest.approx(2e-6), 0.0)


def test_fit_linear_errors():
    with pytest.raises(PlanError, match="no points"):
        fit_linear([], [])
    with pytest.raises(PlanError, match="2 sizes but 1 times"):
        fit_linear([1, 2], [1])
    with pytest.raises(PlanError, match="two distinct message sizes"):
        fit_linear([8, 8], [1e-3, 2e-3])


def test_fit_relative_predicts_small_messages_that_plain_least_squares_misses():
    # Small messages cost ~5 us; large ones follow 100 us + 1 ns/B with +-5% noise. Plain
    # least squares is dominated by the large points and misses the small ones by far more
    # than their size; the relative fit must get each small one within 25%.
    sizes = [4, 64, 1024, 16 << 10, 256 << 10, 4 << 20, 16 << 20, 64 << 20]
    times = [5e-6, 5.2e-6, 6e-6, 20e-6, 300e-6, 4.3e-3 * 0.95, 16.9e-3 * 1.05, 67.2e-3 * 0.98]
    plain, _ = fit_linear(sizes, times)
    rel, worst = fit_relative(sizes, times)
    assert abs(plain.time(4) - 5e-6) / 5e-6 > 2  # the failure this fit exists for
    for m, t in zip(sizes[:3], times[:3]):
        assert abs(rel.time(m) - t) / t < 0.25
    assert worst == pytest.approx(max(abs(rel.time(m) - t) / t for m, t in zip(sizes, times)))


def test_fit_linear_weights_reduce_to_a_hand_computed_case():
    # Two points, any weights: the line goes through both. Three points with one weight ~0:
    # the line goes through the other two.
    c, _ = fit_linear([0, 10], [1.0, 3.0], [5.0, 0.1])
    assert (c.a, c.b) == pytest.approx((1.0, 0.2))
    c, _ = fit_linear([0, 10, 20], [1.0, 3.0, 100.0], [1.0, 1.0, 1e-12])
    assert (c.a, c.b) == pytest.approx((1.0, 0.2), rel=1e-6)
    with pytest.raises(PlanError, match="positive finite weights"):
        fit_linear([0, 10], [1.0, 3.0], [1.0, 0.0])
    with pytest.raises(PlanError, match="> 0"):
        fit_relative([0, 10], [0.0, 3.0])


# ----------------------------------------------------------------------------- piecewise T
CURVE = ((4, 50e-6), (1 << 20, 10e-3), (4 << 20, 50e-3))


def test_piecewise_time_by_hand():
    c = CostModel(1e-4, 8e-9, times=CURVE)
    assert c.kind == "piecewise" and CostModel(1e-4, 8e-9).kind == "paper"
    assert c.time(0) == c.time(4) == 50e-6  # flat below the smallest size
    assert c.time(1 << 20) == 10e-3
    mid = (4 + (1 << 20)) / 2
    assert c.time(mid) == pytest.approx(50e-6 + (10e-3 - 50e-6) / 2)
    assert c.time(2.5 * (1 << 20)) == pytest.approx(30e-3)
    # above the largest: the last segment's slope, 40 ms per 3 MiB
    assert c.time(7 << 20) == pytest.approx(90e-3)
    assert c.paper() == CostModel(1e-4, 8e-9) and c.paper().time(1000) == 1e-4 + 8e-6
    assert c.with_times(()) == c.paper()
    assert c.with_interference(((4, 0.5),)).times == CURVE  # every other term is kept


def test_piecewise_time_never_decreases_and_is_refused_otherwise():
    with pytest.raises(PlanError, match=r"times: 1048576 bytes take 0.001 s, less than 4 "
                                        r"bytes \(0.002 s\): T\(M\) must not decrease"):
        CostModel(0, 0, times=((4, 2e-3), (1 << 20, 1e-3)))
    with pytest.raises(PlanError, match="times: need at least two distinct sizes"):
        CostModel(0, 0, times=((4, 2e-3),))
    with pytest.raises(PlanError, match="times: need at least two distinct sizes"):
        CostModel(0, 0, times=((4, 2e-3), (4, 3e-3)))
    with pytest.raises(PlanError, match=r"times\[1\]\[1\]: must be >= 0"):
        CostModel(0, 0, times=((4, 2e-3), (8, -1.0)))
    flat = CostModel(0, 0, times=((4, 2e-3), (8, 2e-3), (16, 5e-3)))  # equal times are fine
    xs = [0, 3, 4, 5, 8, 9, 16, 100]
    assert all(flat.time(x) <= flat.time(y) for x, y in zip(xs, xs[1:]))


def test_network_json_times_round_trip_and_old_files_load_as_lines(tmp_path):
    doc = {"fits": {"2": {"a": 1e-4, "b": 8e-9, "times": [list(p) for p in CURVE]}}}
    path = tmp_path / "net.json"
    path.write_text(json.dumps(doc))
    net = load_network(path)
    cost = cost_for(net, 2)
    assert cost.kind == "piecewise" and cost.times == CURVE and cost.origin == "fit"
    assert cost.time(1 << 20) == 10e-3
    again = Network.from_dict(json.loads(json.dumps(net.to_dict())))
    assert again == net
    paper = cost_for(net, 2, model="paper")
    assert paper.kind == "paper" and paper == cost.paper() and "paper" in paper.origin
    assert cost_for(net, 2, a=2e-4).times == ()  # --a/--b give a line
    with pytest.raises(PlanError, match="unknown form 'linear' .*piecewise, paper"):
        cost_for(net, 2, model="linear")
    # a file written before the measured curve existed: the line, unchanged
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"fits": {"2": {"a": 1e-4, "b": 8e-9}}}))
    line = cost_for(load_network(old), 2)
    assert line.kind == "paper" and line == CostModel(1e-4, 8e-9)


def test_network_json_bad_times_name_the_file_and_field(tmp_path):
    path = tmp_path / "net.json"
    path.write_text(json.dumps({"fits": {"2": {"a": 0, "b": 0,
                                                "times": [[4, 1e-3], [8, 5e-4]]}}}))
    with pytest.raises(PlanError, match=r"net.json: fits.2.times: 8 bytes take"):
        load_network(path)
    path.write_text(json.dumps({"fits": {"2": {"a": 0, "b": 0, "times": 5}}}))
    with pytest.raises(PlanError, match=r"net.json: fits.2.times: must be a list"):
        load_network(path)


def test_scaled_time_keeps_the_sizes_measured_in_training_and_stays_non_decreasing():
    curve = CostModel(0.0, 0.0, times=((4, 1e-5), (1 << 20, 0.01), (8 << 20, 0.05)))
    half = curve.scaled_time(0.5, keep=[8 << 20])
    assert half.times == ((4, 5e-6), (1 << 20, 0.005), (8 << 20, 0.05))
    # x10, the 1 MB point would pass the kept 8 MB one: it stays at it
    ten = curve.scaled_time(10.0, keep=[8 << 20])
    assert ten.times == ((4, 1e-4), (1 << 20, 0.05), (8 << 20, 0.05))
    # halved, the 8 MB point would drop below the kept 1 MB one: it stays at it
    flat = CostModel(0.0, 0.0, times=((4, 1e-5), (1 << 20, 0.04), (8 << 20, 0.05)))
    assert flat.scaled_time(0.5, keep=[1 << 20]).times == ((4, 5e-6), (1 << 20, 0.04),
                                                          (8 << 20, 0.04))
    line = CostModel(1e-4, 8e-9).scaled_time(0.5)
    assert (line.a, line.b) == (5e-5, 4e-9)
