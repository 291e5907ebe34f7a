"""Every number of expected.json (computed independently from the model) to 1e-9 relative.

Cost models: `paper` = network-10gbe-paper-constants.json with the ring formula; `ring` =
network-10gbe.json's alpha and beta (formula everywhere); `fits` = its per-N fits where listed
(N = 2, 4, 8), the ring formula beyond. Schemes: wfbp, synceasgd, mgwfbp-paper (expected's
`infocom`, Algorithm 1) and mgwfbp (expected's `optimal`, the exact DP).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mgcaffe.comm.model.cost import cost_for, load_network
from mgcaffe.comm.model.profile import load_profile
from mgcaffe.comm.model.simulate import weak_scaling

PAPER = Path(__file__).resolve().parents[2] / "models" / "paper"
REL = 1e-9
OURS = {"wfbp": "wfbp", "synceasgd": "synceasgd", "infocom": "mgwfbp-paper",
        "optimal": "mgwfbp"}
COST_MODELS = {"paper": ("network-10gbe-paper-constants.json", True),
               "ring": ("network-10gbe.json", True),
               "fits": ("network-10gbe.json", False)}


def _close(got: float, want: float) -> bool:
    # relative 1e-9; values that are 0 in exact arithmetic (greedy == optimal) get an
    # absolute floor of a few ulps of 1
    return abs(got - want) <= REL * abs(want) + 1e-14


def _cases():
    expected = json.loads((PAPER / "expected.json").read_text())
    return [(model, cm) for model, data in expected["models"].items()
            for cm in data["cost_models"]]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c[0]}-{c[1]}")
def test_expected_numbers(case, paper_dir):
    model, cm = case
    expected = json.loads((paper_dir / "expected.json").read_text())["models"][model]
    profile = load_profile(paper_dir / expected["profile"])
    assert profile.ideal_time == pytest.approx(expected["single_worker_time"], rel=REL)
    fname, use_formula = COST_MODELS[cm]
    network = load_network(paper_dir / fname)
    points = expected["cost_models"][cm]
    nodes = [int(n) for n in points]
    scaling = weak_scaling(profile, network, nodes, tuple(OURS.values()),
                           use_formula=use_formula)
    checked = 0
    for n, want in points.items():
        got = scaling.point(int(n))
        cost = cost_for(network, int(n), use_formula)
        assert _close(got.cost.a, want["a"]) and _close(cost.b, want["b"])
        for theirs, ours in OURS.items():
            sp = got.schemes[ours]
            where = f"{model}/{cm}/{n}/{theirs}"
            assert _close(sp.iteration_time, want["iteration_time"][theirs]), where
            assert _close(sp.efficiency, want["efficiency"][theirs]), where
            assert _close(sp.speedup, want["speedup_vs_1_worker"][theirs]), where
            assert sp.messages == want["messages"][theirs], where
            checked += 4
        assert _close(got.ideal, want["iteration_time"]["ideal"])
        for theirs in ("infocom", "optimal"):
            ours = OURS[theirs]
            assert _close(got.ratio(ours, "wfbp"), want["mgwfbp_over_wfbp"][theirs])
            assert _close(got.ratio(ours, "synceasgd"), want["mgwfbp_over_synceasgd"][theirs])
            checked += 2
        assert _close(got.ratio("mgwfbp", "mgwfbp-paper") - 1,
                      want["greedy_over_optimal_minus_1"]["infocom"])
        checked += 1
    assert checked == len(points) * 21


def test_repo_copy_matches_shared(shared_paper_dir, paper_dir):
    """models/paper/ holds byte-identical copies of the measured data in ../shared/paper."""
    for name in ("googlenet-k80.json", "resnet50-k80.json", "network-10gbe.json",
                 "network-10gbe-paper-constants.json", "expected.json",
                 "osu-allreduce-10gbe.csv"):
        assert (paper_dir / name).read_bytes() == (shared_paper_dir / name).read_bytes(), name
