"""The scheduler's simulated targets on the paper's study: does `overlap` close the gap?

    .venv/bin/python benchmarks/bench_sched_targets.py [--nodes 4 8 16 32 64]

For GoogleNet and ResNet-50 (the authors' K80 profiles) on three networks (the paper's 10GbE
and 56 Gb InfiniBand constants, and the measured 10GbE fit), at each N, every registered
scheme is planned (`mgcaffe simulate`'s planning) beside the lower bound no schedule beats.
Targets (the scheduling issue): on every row where `mgwfbp` (the optimum of the paper's model)
is more than 5% above the bound, `overlap` closes at least half of that gap; and `overlap` is
never slower than the best of the other schemes on any row. Pure computation: the numbers do
not depend on the machine. Exit status 0 either way; the verdict line says which rows miss.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mgcaffe.comm.model.cost import load_network  # noqa: E402
from mgcaffe.comm.model.profile import load_profile  # noqa: E402
from mgcaffe.comm.model.simulate import ScalingPoint, weak_scaling  # noqa: E402

PAPER = REPO / "models" / "paper"
MODELS = ("googlenet", "resnet50")
NETWORKS = {"10GbE (paper)": "network-10gbe-paper-constants.json",
            "56Gb IB (paper)": "network-56gb-ib-paper-constants.json",
            "10GbE (measured)": "network-10gbe.json"}
GAP = 0.05  # mgwfbp this far above the bound: overlap must close half of it


def judge(point: ScalingPoint) -> tuple[float, float, float | None, bool, str]:
    """(mgwfbp above the bound, overlap above it, the share of mgwfbp's gap overlap closes
    (None where mgwfbp is within GAP), whether the row meets both targets, the best other
    scheme)."""
    t = {s: p.iteration_time for s, p in point.schemes.items()}
    bound = point.bound
    mg, ov = t["mgwfbp"] / bound - 1, t["overlap"] / bound - 1
    others = {s: v for s, v in t.items() if s != "overlap"}
    best_other = min(others, key=others.get)
    never_slower = t["overlap"] <= others[best_other] * (1 + 1e-12)
    closed = None if mg <= GAP else (t["mgwfbp"] - t["overlap"]) / (t["mgwfbp"] - bound)
    ok = never_slower and (closed is None or closed >= 0.5)
    return mg, ov, closed, ok, best_other


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    args = parser.parse_args(argv)
    print(f"{'model':<10} {'network':<17} {'N':>3} {'bound ms':>9} {'mgwfbp':>8} "
          f"{'overlap':>8} {'closed':>7}  best other  verdict")
    missed = []
    rows = 0
    for model in MODELS:
        profile = load_profile(PAPER / f"{model}-k80.json")
        for label, file in NETWORKS.items():
            scaling = weak_scaling(profile, load_network(PAPER / file), args.nodes)
            for point in scaling.points:
                mg, ov, closed, ok, best = judge(point)
                rows += 1
                share = "-" if closed is None else f"{100 * closed:.0f}%"
                print(f"{model:<10} {label:<17} {point.nodes:>3} {point.bound * 1e3:>9.1f} "
                      f"{100 * mg:>+7.1f}% {100 * ov:>+7.1f}% {share:>7}  {best:<11} "
                      f"{'met' if ok else 'MISSED'}")
                if not ok:
                    missed.append(f"{model} {label} N={point.nodes}")
    print(f"\n(mgwfbp, overlap: above the lower bound; closed: the share of mgwfbp's gap "
          f"overlap closes, where mgwfbp is more than {100 * GAP:.0f}% above the bound)")
    print(f"targets met on {rows - len(missed)} of {rows} rows"
          + (": missed " + ", ".join(missed) if missed else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
