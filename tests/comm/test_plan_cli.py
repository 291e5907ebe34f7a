"""`mgcaffe plan`: tables, JSON shape, saved plans, overrides and one-line errors."""

from __future__ import annotations

import itertools
import json
import random
import re
import subprocess
import sys

import pytest

from mgcaffe.cli import main
from mgcaffe.comm.model import interference_search
from mgcaffe.comm.model.cost import CostModel, cost_for, load_network
from mgcaffe.comm.model.interference_search import grouping_lower_bound
from mgcaffe.comm.model.plan import load_plan
from mgcaffe.comm.model.profile import LayerProfile, Profile, load_profile
from mgcaffe.comm.model.schemes import SCHEMES, make_plan
from mgcaffe.comm.model.timeline import timeline as model_timeline


@pytest.fixture
def inputs(paper_dir):
    return ["--profile", str(paper_dir / "googlenet-k80.json"),
            "--network", str(paper_dir / "network-10gbe-paper-constants.json")]


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_table(capsys, inputs):
    rc, out, err = run(capsys, "plan", *inputs, "--nodes", "64")
    assert rc == 0, err
    assert "googlenet: 64 learnable layers" in out
    assert "N = 64: a = 5702.76 us" in out
    # one row per registered scheme, named as --comm names it, ending with its flags
    for s in SCHEMES:
        assert re.search(rf"^{re.escape(s)} .* --comm={re.escape(s)}\b", out, re.M), s
    assert re.search(r"^mgwfbp .* --comm=mgwfbp \(the default\)$", out, re.M)
    # "vs best": each row against the fastest; at 64 nodes the scheduler's overlap plan
    assert re.search(r"^overlap .* \+0\.00% .* --comm=overlap$", out, re.M)
    profile = load_profile(inputs[1])
    cost = cost_for(load_network(inputs[3]), 64)
    best = make_plan(profile, cost, "overlap").iteration_time
    for s in ("mgwfbp", "mgwfbp-paper", "wfbp"):
        above = make_plan(profile, cost, s).iteration_time / best - 1
        assert re.search(rf"^{s} .* \+{100 * above:.2f}% ", out, re.M), s
    # the scheduler's gap: its plan against the bound it computed, which no plan beats
    gap, bound = re.search(r"^overlap: ([\d.]+)% above the lower bound ([\d.]+) ms on any "
                           r"schedule$", out, re.M).groups()
    assert float(bound) * (1 + float(gap) / 100) == pytest.approx(best * 1e3, rel=1e-4)
    assert all(make_plan(profile, cost, s).iteration_time * 1e3 >= float(bound)
               for s in SCHEMES)
    assert re.search(r"^threshold .* --comm=threshold --bucket-mb 25$", out, re.M)
    assert "mgwfbp: 5 messages" in out
    assert "wfbp: each of the 64 layers is its own message" in out


def test_json_shape(capsys, inputs, paper_dir):
    rc, out, _ = run(capsys, "plan", *inputs, "--nodes", "8", "--json")
    assert rc == 0
    d = json.loads(out)
    assert {"nodes", "a", "b", "ideal", "schemes"} <= set(d)
    assert d["nodes"] == 8
    assert list(d["schemes"]) == list(SCHEMES)
    profile = load_profile(paper_dir / "googlenet-k80.json")
    cost = cost_for(load_network(paper_dir / "network-10gbe-paper-constants.json"), 8)
    for s, got in d["schemes"].items():
        assert {"groups", "iteration_time", "non_overlapped_comm"} <= set(got)
        plan = make_plan(profile, cost, s)
        assert got["groups"] == [list(g) for g in plan.groups]
        assert got["iteration_time"] == plan.iteration_time
        assert got["non_overlapped_comm"] == plan.non_overlapped_comm
        assert got["digest"] == plan.digest()
    best = min(got["iteration_time"] for got in d["schemes"].values())
    assert d["schemes"]["overlap"]["iteration_time"] == best  # at 8 nodes too
    assert d["schemes"]["overlap"]["above_best"] == 0 and d["default"] == "mgwfbp"
    assert d["schemes"]["mgwfbp"]["above_best"] == pytest.approx(
        d["schemes"]["mgwfbp"]["iteration_time"] / best - 1)
    assert d["schemes"]["threshold"]["train_flags"] == "--comm=threshold --bucket-mb 25"
    assert d["schemes"]["mgwfbp-paper"]["train_flags"] == "--comm=mgwfbp-paper"


def test_scheme_subset_and_save(capsys, inputs, tmp_path):
    path = tmp_path / "plan.json"
    rc, out, _ = run(capsys, "plan", *inputs, "--nodes", "16", "--scheme", "infocom",
                     "--save-plan", str(path))
    assert rc == 0
    assert "\nmgwfbp-paper " in out and "\nmgwfbp " not in out
    plan = load_plan(path)
    assert plan.scheme == "mgwfbp-paper" and plan.nodes == 16
    assert plan.digest()[:16] in out
    assert f"train it with `mgcaffe train ... --plan {path}` on 16 ranks" in out
    # several schemes: the default's plan is saved
    rc, _, _ = run(capsys, "plan", *inputs, "--nodes", "16", "--save-plan", str(path))
    assert rc == 0 and load_plan(path).scheme == "mgwfbp"


def test_a_b_override(capsys, paper_dir):
    rc, out, _ = run(capsys, "plan", "--profile", str(paper_dir / "resnet50-k80.json"),
                     "--a", "0", "--b", "1e-9", "--json")
    assert rc == 0
    d = json.loads(out)
    assert (d["a"], d["b"], d["nodes"]) == (0.0, 1e-9, None)
    s = d["schemes"]
    assert s["wfbp"]["iteration_time"] == pytest.approx(s["mgwfbp"]["iteration_time"])
    rc, out, _ = run(capsys, "plan", "--profile", str(paper_dir / "resnet50-k80.json"),
                     "--network", str(paper_dir / "network-10gbe.json"), "--nodes", "8",
                     "--a", "0.5", "--json")
    d = json.loads(out)
    assert d["a"] == 0.5 and d["b"] == pytest.approx(3.337284927836494e-09)
    assert d["schemes"]["mgwfbp"]["messages"] == 1


def test_use_formula_and_bucket(capsys, paper_dir):
    base = ["plan", "--profile", str(paper_dir / "resnet50-k80.json"),
            "--network", str(paper_dir / "network-10gbe.json"), "--nodes", "8", "--json"]
    fit = json.loads(run(capsys, *base)[1])
    formula = json.loads(run(capsys, *base, "--use-formula")[1])
    assert fit["cost_origin"] == "fit" and formula["cost_origin"] == "ring formula"
    assert fit["a"] != formula["a"]
    small = json.loads(run(capsys, *base, "--scheme", "threshold", "--bucket-mb", "1")[1])
    assert small["schemes"]["threshold"]["bucket_bytes"] == 2**20


@pytest.mark.parametrize("mutate, argv_extra, expect", [
    (lambda d: d["layers"][3].update(backward_time=-1), [],
     "{profile}: layers[3].backward_time: must be >= 0, got -1"),
    (lambda d: d["layers"][5].update(name=d["layers"][0]["name"]), [],
     "{profile}: layers[5].name: 'conv1/7x7_s2' repeats layers[0].name"),
    (lambda d: d.update(layers=[]), [], "{profile}: layers: must not be empty"),
    (lambda d: d.pop("forward_time"), [], "{profile}: forward_time: missing"),
    (None, ["--scheme", "bogus"], "scheme: unknown scheme 'bogus'"),
])
def test_errors_are_one_line(capsys, tmp_path, paper_dir, mutate, argv_extra, expect):
    d = json.loads((paper_dir / "googlenet-k80.json").read_text())
    if mutate:
        mutate(d)
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(d))
    rc, out, err = run(capsys, "plan", "--profile", str(profile), "--network",
                       str(paper_dir / "network-10gbe.json"), "--nodes", "8", *argv_extra)
    assert rc == 1
    assert err.startswith(f"mgcaffe plan: error: {expect.format(profile=profile)}")
    assert err.count("\n") == 1


def test_network_errors(capsys, tmp_path, paper_dir):
    net = tmp_path / "net.json"
    net.write_text(json.dumps({"alpha": 1e-5, "beta": 1e-9, "algorithm": "carrier-pigeon"}))
    prof = str(paper_dir / "googlenet-k80.json")
    rc, _, err = run(capsys, "plan", "--profile", prof, "--network", str(net), "--nodes", "8")
    assert rc == 1 and err.startswith(f"mgcaffe plan: error: {net}: algorithm: unknown")
    assert err.count("\n") == 1
    rc, _, err = run(capsys, "plan", "--profile", prof, "--nodes", "8")
    assert rc == 1 and "--network: missing" in err
    rc, _, err = run(capsys, "plan", "--profile", prof, "--network", str(net))
    assert rc == 1
    rc, _, err = run(capsys, "plan", "--profile", prof,
                     "--network", str(paper_dir / "network-10gbe.json"))
    assert rc == 1 and "--nodes: missing" in err
    rc, _, err = run(capsys, "plan", "--profile", prof,
                     "--network", str(paper_dir / "network-10gbe.json"), "--nodes", "0")
    assert rc == 1 and "nodes: must be >= 1" in err


def test_python_dash_m_discovers_the_command(paper_dir):
    out = subprocess.run(
        [sys.executable, "-m", "mgcaffe", "plan", "--profile",
         str(paper_dir / "googlenet-k80.json"), "--network",
         str(paper_dir / "network-10gbe.json"), "--nodes", "4", "--scheme", "wfbp", "--json"],
        capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["schemes"]["wfbp"]["messages"] == 64


def test_plan_and_simulate_show_rho_and_sigma(capsys, paper_dir, tmp_path):
    net = tmp_path / "net.json"
    net.write_text(json.dumps({"fits": {"2": {"a": 2.3e-3, "b": 9.2e-9,
                                              "interference": [[65536, 1.0]],
                                              "comm_slowdown": 1.25}}}))
    args = ["--profile", str(paper_dir / "googlenet-k80.json"), "--network", str(net),
            "--nodes", "2"]
    rc, out, err = run(capsys, "plan", *args)
    assert rc == 0, err
    assert ("backward slowed during an all-reduce: every size +100%; all-reduces slowed "
            "while backward runs: every size x1.25") in out
    rc, out, err = run(capsys, "plan", *args, "--json")
    d = json.loads(out)
    assert d["comm_slowdown"] == [[1, 1.25]] and d["interference"] == [[65536, 1.0]]
    # the predicted times are the extended model's: slower than with sigma = 1
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"fits": {"2": {"a": 2.3e-3, "b": 9.2e-9,
                                                "interference": [[65536, 1.0]]}}}))
    rc, out, err = run(capsys, "plan", "--profile", str(paper_dir / "googlenet-k80.json"),
                       "--network", str(plain), "--nodes", "2", "--json")
    base = json.loads(out)
    assert (d["schemes"]["wfbp"]["iteration_time"]
            > base["schemes"]["wfbp"]["iteration_time"])
    rc, out, err = run(capsys, "simulate", *args)
    assert rc == 0, err
    assert "N = 2: backward slowed during an all-reduce" in out and "x1.25" in out
    rc, out, err = run(capsys, "simulate", *args, "--json")
    assert json.loads(out)["points"][0]["comm_slowdown"] == [[1, 1.25]]


def test_the_schedulers_schemes_by_name_with_the_gap_to_the_lower_bound(capsys, inputs):
    rc, out, err = run(capsys, "plan", *inputs, "--nodes", "64", "--scheme", "mgwfbp",
                       "overlap", "bytescheduler", "dear")
    assert rc == 0, err
    rows = {m[1]: float(m[2]) for m in re.finditer(r"^(\S+) +\d+ +([\d.]+) ", out, re.M)}
    assert set(rows) == {"mgwfbp", "overlap", "bytescheduler", "dear"}
    assert rows["overlap"] < min(rows["mgwfbp"], rows["bytescheduler"], rows["dear"])
    gap = re.search(r"^overlap: ([\d.]+)% above the lower bound ([\d.]+) ms", out, re.M)
    assert gap and float(gap[2]) <= rows["overlap"]
    assert float(gap[1]) == pytest.approx((rows["overlap"] / float(gap[2]) - 1) * 100, abs=0.01)
    assert "the search was cut" not in out


def test_a_cut_search_says_how_far_above_the_lower_bound_it_is(capsys, paper_dir, tmp_path,
                                                              monkeypatch):
    # a budget too small for GoogleNet under rho/sigma cuts the search: the plan says its gap
    # to a lower bound on any grouping, which no grouping beats
    monkeypatch.setattr(interference_search, "FRONT_BUDGET", 200)
    net = tmp_path / "net.json"
    net.write_text(json.dumps({"fits": {"2": {"a": 2.3e-3, "b": 9.2e-9,
                                              "interference": [[65536, 1.0]],
                                              "comm_slowdown": 1.25}}}))
    rc, out, err = run(capsys, "plan", "--profile", str(paper_dir / "googlenet-k80.json"),
                       "--network", str(net), "--nodes", "2", "--scheme", "mgwfbp", "wfbp",
                       "synceasgd")
    assert rc == 0, err
    rows = {m[1]: float(m[2]) for m in re.finditer(r"^(\S+) +\d+ +([\d.]+) ", out, re.M)}
    gap = re.search(r"^mgwfbp: the search was cut \(too many states\): ([\d.]+)% above the "
                    r"lower bound ([\d.]+) ms on any grouping", out, re.M)
    assert gap, out
    assert float(gap[2]) <= min(rows.values())
    assert float(gap[1]) == pytest.approx((rows["mgwfbp"] / float(gap[2]) - 1) * 100, abs=0.01)


def test_the_grouping_bound_holds_for_every_grouping():
    rng = random.Random(3)
    for _ in range(60):
        L = rng.randint(1, 7)
        prof = Profile("r", 1, 4, rng.uniform(0, 0.02), tuple(
            LayerProfile(f"l{i}", rng.choice([1, 300, 40000, 2000000]), rng.uniform(0, 0.01))
            for i in range(L)))
        cost = CostModel(rng.uniform(0, 3e-3), rng.uniform(0, 1e-8))
        if rng.random() < 0.7:
            cost = cost.with_interference([(1, rng.uniform(0, 5))], [(1, rng.uniform(1, 2))])
        bound = grouping_lower_bound(prof, cost)
        for cuts in itertools.product([False, True], repeat=L - 1):
            groups, group = [], [prof.names[-1]]
            for name, cut in zip(reversed(prof.names[:-1]), cuts):
                if cut:
                    groups.append(group)
                    group = []
                group.append(name)
            groups.append(group)
            t = model_timeline(prof, cost, groups).iteration_time
            assert bound <= t * (1 + 1e-12), (bound, t, groups)
