"""What the trainer says at INFO and when it warns: rho and sigma in words, the warning
when an iteration runs far above its prediction and its likely cause, a plan in one line."""

from __future__ import annotations

from types import SimpleNamespace

from mgcaffe.comm.model.cost import CostModel
from mgcaffe.comm.model.profile import LayerProfile, Profile
from mgcaffe.comm.model.schemes import make_plan
from mgcaffe.comm.training.notices import in_situ_summary, likely_causes, overrun_warning
from mgcaffe.comm.training.options import Options
from mgcaffe.comm.training.startup import describe_groups, plan_summary


def test_rho_and_sigma_are_said_in_words_and_a_capped_estimate_says_so():
    text = in_situ_summary(2.89, 3.38, 2)
    assert text == ("Measured in situ on 2 ranks: backward takes 3.89x as long while an "
                    "all-reduce is in flight (rho = 2.89); an all-reduce takes 3.38x its "
                    "T(M) while backward runs (sigma = 3.38); the model now uses them")
    capped = in_situ_summary(None, 20.0, 2)
    assert "(sigma = 20.00, at its cap)" in capped and "the model now uses it;" in capped
    assert capped.endswith("; a capped estimate means at least that much")
    # both at their caps, the longest it gets: one log line
    assert len(in_situ_summary(19.0, 20.0, 1024)) <= 300


def test_a_run_far_above_its_prediction_warns_with_the_likeliest_cause():
    assert overrun_warning(0.149, 0.100, ["x"]) is None  # +49%: not far
    assert overrun_warning(0.175, 0.100, ["the cause"]) == (
        "the measured iteration is 75% above the prediction; likely cause: the cause")
    assert "other processes on these cores" in overrun_warning(0.3, 0.1, [])
    plan8 = Options(plan="p8.json", origin={"plan": "--plan"})
    causes = likely_causes(plan8, 8, 2, cores=2, load=0.5, ranks_here=2, interferes=False)
    assert causes[0] == "--plan p8.json was made for 8 nodes, this run has 2; plan again for 2"
    assert "2 ranks and their communication threads share 2 cores" in causes[1]
    # every cause keeps the warning one log line (the INFO/WARNING lines stay under 300)
    busy_everything = likely_causes(Options(plan="p8.json", profile="elsewhere/p.json",
                                            origin={"plan": "--plan"}), 64, 2, cores=2,
                                    load=99.0, ranks_here=16, interferes=False)
    assert len(busy_everything) == 4
    assert all(len(overrun_warning(99.9, 0.1, [c])) <= 300 for c in busy_everything)
    quiet = likely_causes(Options(), None, 2, cores=16, load=1.0, ranks_here=2,
                          interferes=False)
    assert quiet == []
    busy = likely_causes(Options(), None, 2, cores=2, load=6.0, ranks_here=1, interferes=True)
    assert busy == ["the machine is busy (load average 6.0 on 2 cores): other processes take "
                    "the cores backward needs"]
    # two emulated hosts on one 2-core machine, a CPU each: the load average of 3.1 is their
    # own ranks' compute and communication threads, not a busy machine
    assert likely_causes(Options(), None, 2, cores=1, load=3.1, ranks_here=1,
                         interferes=True, machine_cores=2) == []
    # one busy process per core beside two ranks on 2 cores is a busy machine
    assert likely_causes(Options(), None, 2, cores=2, load=6.0, ranks_here=2,
                         interferes=True, machine_cores=2)[0].startswith(
        "the machine is busy (load average 6.0 on 2 cores)")


def test_a_plan_in_one_line():
    profile = Profile("toy", 1, 4, 0.01, tuple(LayerProfile(f"l{i}", 10, 0.004)
                                              for i in range(1, 6)))
    plan = make_plan(profile, CostModel(1e-3, 1e-9), "mgwfbp")
    line = plan_summary(plan, "made from P.json")
    assert line.startswith(f"Plan mgwfbp ({plan.digest()[:12]}) made from P.json: ")
    assert "\n" not in line and f"({describe_groups(plan)})" in line
    assert describe_groups(make_plan(profile, CostModel(0, 1e-9), "wfbp")) == "one per layer"
    assert describe_groups(make_plan(profile, CostModel(1, 1e-9), "synceasgd")) == \
        "l5..l1 (5)"
    few = SimpleNamespace(groups=[("a", "b"), ("c",)])
    assert describe_groups(few) == "a+b | c"
    many = SimpleNamespace(groups=[(f"g{i}", f"h{i}") for i in range(8)])
    assert describe_groups(many) == "8 groups of 2-2 layers"
