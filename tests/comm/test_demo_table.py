"""tools/demo.py: one shared profile for every scheme, the table it prints, and its words
about noise, from the trainer's own closing lines."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from mgcaffe.comm.model.cost import cost_for, load_network
from mgcaffe.comm.model.profile import LayerProfile, Profile, load_profile
from mgcaffe.comm.model.schemes import SCHEMES, make_plan

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "demo.py"
spec = importlib.util.spec_from_file_location("demo_tool", TOOL)
demo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(demo)

CLOSING = ("I1201 x trainer.py:3] iteration (forward start to reduced gradients): measured "
           "35.50 ms (median of 39), predicted 34.00 ms by plan mgwfbp-paper (+4.4%); whole "
           "iteration with the update 36.9 ms\n")

def digits(tf, ip2, ip1, conv2, conv1):
    """The digits net's profile (ms): t_f, then each layer's backward, output side first."""
    layers = (("conv1", 200, conv1), ("conv2", 9050, conv2), ("ip1", 100500, ip1),
              ("ip2", 5010, ip2))
    return Profile("DigitsLeNet", 64, 4, tf * 1e-3,
                   tuple(LayerProfile(n, p, t * 1e-3) for n, p, t in layers))


# shared profiles the trainer measured on a 2-core machine, idle to loaded
MEASURED = [digits(15.15, 2.965, 2.741, 8.140, 1.810), digits(15.82, 1.273, 2.086, 5.025, 1.274),
            digits(17.80, 0.703, 4.077, 7.493, 1.787), digits(16.17, 0.394, 9.869, 4.299, 1.303),
            digits(23.57, 1.700, 7.834, 11.723, 3.446)]
DIGITS = MEASURED[0]


def demo_cost():
    return cost_for(load_network(REPO / demo.NETWORK), demo.NODES)


def test_the_measured_time_is_the_trainer_s_own_closing_line(tmp_path):
    assert demo.measured(CLOSING, tmp_path / "x.log") == (35.5, 36.9)
    per_layer = ("I1201 x trainer.py:3] iteration (forward start to the next forward start, "
                 "update included): measured 21.49 ms (median of 38), predicted 22.94 ms by "
                 "plan overlap (-6.3%)\n")
    assert demo.measured(per_layer, tmp_path / "x.log") == (21.49, 21.49)
    with pytest.raises(SystemExit, match="no timing summary in"):
        demo.measured("nothing here\n", tmp_path / "x.log")


def test_every_scheme_is_planned_from_one_profile_read_from_the_trained_plan(tmp_path,
                                                                          monkeypatch):
    """The trained run's saved plan holds the profile it was made from; every registered
    scheme is planned from it, so predictions compare."""
    cost = demo_cost()
    trained = tmp_path / "plan-trained.json"
    make_plan(DIGITS, cost, "mgwfbp", nodes=demo.NODES).save(trained)
    monkeypatch.setattr(demo, "OUT", tmp_path)
    plans = demo.plan_every_scheme(load_profile(trained), cost)
    assert list(plans) == list(SCHEMES)
    for s, plan in plans.items():
        direct = make_plan(DIGITS, cost, s, nodes=demo.NODES)
        assert plan.groups == direct.groups
        assert plan.iteration_time == pytest.approx(direct.iteration_time, rel=1e-12)
        assert (tmp_path / f"plan-{s}.json").is_file()


@pytest.mark.parametrize("profile", MEASURED, ids=range(len(MEASURED)))
def test_the_comparison_s_network_makes_merging_beat_both_extremes(profile, tmp_path):
    """On every profile measured, idle or loaded, the network the demo chooses makes
    mgwfbp's plan differ from wfbp's and synceasgd's and be predicted at least 5% faster than
    both, also when the layer times move by a quarter."""
    cost, lead = demo.merging_network(profile)
    plans = {s: make_plan(profile, cost, s) for s in ("wfbp", "synceasgd", "mgwfbp")}
    mg = plans["mgwfbp"]
    assert mg.groups not in (plans["wfbp"].groups, plans["synceasgd"].groups)
    assert lead == pytest.approx(min(plans["wfbp"].iteration_time,
                                     plans["synceasgd"].iteration_time) / mg.iteration_time)
    assert lead > 1.05
    assert 0 < cost.a < profile.backward_time and cost.b > 0
    demo.write_network(cost, tmp_path / "net.json")
    back = cost_for(load_network(tmp_path / "net.json"), demo.NODES)
    assert (back.a, back.b) == (cost.a, cost.b)


def test_plans_of_the_same_groups_share_one_measurement():
    cost = demo_cost()
    plans = {s: make_plan(DIGITS, cost, s) for s in SCHEMES}
    measure_of = demo.distinct(plans)
    assert measure_of["wfbp"] == "wfbp" and measure_of["mgwfbp"] == "mgwfbp"
    # a 25 MiB bucket holds the whole 448 KiB gradient: threshold is synceasgd here
    assert measure_of["threshold"] == "synceasgd"


def test_the_table_says_what_stands_out_of_the_noise():
    cost = demo.merging_network(DIGITS)[0]
    plans = {s: make_plan(DIGITS, cost, s) for s in SCHEMES}
    measure_of = demo.distinct(plans)
    rounds = {s: [] for s in set(measure_of.values())}
    for s in rounds:  # measured: the prediction, +3% in round 1, +5% in round 2
        t = plans[s].iteration_time * 1e3
        rounds[s] = [t * 1.03, t * 1.05]
    wholes = {s: [v + 1.0 for v in r] for s, r in rounds.items()}  # the update: 1 ms
    wholes[measure_of["overlap"]] = rounds[measure_of["overlap"]]  # its own line: whole
    text = demo.table(plans, measure_of, rounds, wholes)
    lines = text.splitlines()
    assert lines[0].startswith("--comm") and "meas/pred" in lines[0]
    rows = {line.split()[0]: line for line in lines[1:len(SCHEMES) + 1]}
    assert set(rows) == set(SCHEMES)
    assert "(= synceasgd's plan)" in rows["threshold"]
    assert rows["mgwfbp"].split()[4] == "1.04"  # meas/pred: the mean of the two rounds
    assert "ip2+ip1 | conv2+conv1" in rows["mgwfbp"]
    # noise: the largest difference between rounds, about 2%; mgwfbp is ~10% faster: beyond
    assert "noise: the largest difference between rounds, 1.9%" in text
    verdicts = [line for line in lines if line.startswith("mgwfbp over ")]
    assert len(verdicts) == 2 and all("beyond the noise of 1.9%" in v for v in verdicts)
    ratio = plans["wfbp"].iteration_time / plans["mgwfbp"].iteration_time
    assert f"mgwfbp over wfbp: measured {ratio:.2f}x, predicted {ratio:.2f}x" in text
    # overlap against the others over the whole iteration (its prediction includes the
    # per-layer updates, theirs does not: measured only)
    assert rows["overlap"].split()[4].endswith("*")
    overlap = [line for line in lines if line.startswith("overlap over ")]
    bases = [b for b in ("mgwfbp", "synceasgd", "wfbp") if measure_of[b] != measure_of["overlap"]]
    assert [line.split()[2].rstrip(",") for line in overlap] == bases
    for base in bases:
        gain = (sum(wholes[measure_of[base]]) / sum(wholes[measure_of["overlap"]]))
        assert f"overlap over {base}, whole iteration: measured {gain:.2f}x" in text


def test_a_difference_smaller_than_the_spread_is_within_the_noise():
    t, pred = {"a": 10.0, "b": 10.3}, {"a": 10.0, "b": 10.0}
    assert demo.noise({"a": [9.8, 10.2], "b": [10.3, 10.3]}) == pytest.approx(0.04)
    assert demo.verdict("a", "b", t, pred, 0.04) == (
        "a over b: measured 1.03x, predicted 1.00x (within the noise of 4.0%)")
    assert "beyond" in demo.verdict("a", "b", {"a": 10.0, "b": 12.0}, pred, 0.04)
    text = demo.measured_only({"wfbp": [10.0, 10.2], "mgwfbp": [10.1, 10.0]})
    assert "0.5% slower than the fastest: within the noise of 2.0%" in text


def test_the_shared_profile_is_taken_with_backward_not_overlapped(tmp_path):
    """The trained run saves its start-up plan and never re-plans: a re-plan profiles while
    mgwfbp's all-reduces overlap backward, and that slower backward would be charged to
    synceasgd too, which never overlaps."""
    cmd = demo.training_command(["mgcaffe", "train"], [], tmp_path / "plan.json", 2)
    assert cmd[cmd.index("--save-plan") + 1] == str(tmp_path / "plan.json")
    assert cmd[cmd.index("--replan-after") + 1] == "0"
    assert "--save-plan" not in demo.training_command(["mgcaffe", "train"], [],
                                                      tmp_path / "plan.json", 1)
