"""Planning time of every scheme against the number of learnable layers L (random profiles).

    .venv/bin/python benchmarks/bench_planner.py [--layers 50 100 200 500 1000 2000]

Three cost regimes, because the work of the two O(L^2) planners depends on it:
- latency-bound (a = 5.7 ms, b = 4.4 ns/B: 64 nodes on the paper's 10GbE cluster): Algorithm 1
  merges almost everything, and each merge recomputes the start times (its worst case);
- balanced (a = 0.27 ms, b = 3.4 ns/B: 4 nodes);
- bandwidth-bound (a = 10 us, b = 100 ns/B): communication lags far behind backward, so the
  exact DP cannot stop its inner loop early (its worst case, L(L+1)/2 candidates).

Times are the best of a few runs, in milliseconds, of `make_plan` (which includes building the
plan's timeline). Exits with status 1 if, at L = 500 (about ResNet-152's learnable layers) in
these three regimes, a scheme that only groups (or follows another system's fixed rules) takes
a second or more, or `overlap`'s search takes 5 s or more (it then prints its gap to the lower
bound: 0% is proven optimal).

Then the extended model (docs/planner.md: backward slowed by rho while a message is in flight,
messages slowed by sigma while backward runs) in the balanced and latency-bound regimes, where
`mgwfbp` (the exact optimum) is a bounded search over Pareto fronts of states: its time, and
"cut" where the search hit its budget (the plan then says it is not proven optimal). Also the
paper's GoogleNet and ResNet-50 profiles. Reported, not judged: the budget bounds the time.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mgcaffe.comm.model.cost import CostModel  # noqa: E402
from mgcaffe.comm.model.profile import LayerProfile, Profile  # noqa: E402
from mgcaffe.comm.model.schemes import SCHEMES, make_plan  # noqa: E402

REGIMES = {
    "latency-bound (a 5.7 ms, b 4.4 ns/B)": CostModel(5.70276e-3, 4.4167e-9),
    "balanced (a 0.27 ms, b 3.4 ns/B)": CostModel(2.7156e-4, 3.365e-9),
    "bandwidth-bound (a 10 us, b 100 ns/B)": CostModel(1e-5, 1e-7),
}
LIMIT_L, LIMIT_S = 500, 1.0
SEARCH_LIMIT_S = {"overlap": 5.0}  # the scheduler's search: a budget of work, not of time
EXTENDED = {  # (rho, sigma) points
    "rho +100%, sigma x1.3": (((4, 1.0),), ((4, 1.3),)),
    "rho +460..880%, sigma x1.6..1.1 per size": (((1 << 20, 4.6), (16 << 20, 8.8)),
                                                  ((1 << 20, 1.57), (16 << 20, 1.06))),
}
PAPER_PROFILES = ("googlenet-k80", "resnet50-k80")


def random_profile(L: int, seed: int = 0) -> Profile:
    """Sizes log-uniform over 1e2..5e6 parameters, backward 0.1..20 ms, t_f = t_b / 2."""
    rng = random.Random(seed)
    layers = [LayerProfile(f"layer{i + 1}", int(10 ** rng.uniform(2, 6.7)),
                           rng.uniform(1e-4, 2e-2)) for i in range(L)]
    return Profile("random", 32, 4, sum(x.backward_time for x in layers) / 2, tuple(layers))


def best_time(profile: Profile, cost: CostModel, scheme: str, repeats: int) -> tuple[float, int]:
    best, plan = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        plan = make_plan(profile, cost, scheme)
        best = min(best, time.perf_counter() - t0)
    return best, plan.num_messages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[50, 100, 200, 500, 1000, 2000])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    slow = []
    for regime, cost in REGIMES.items():
        print(f"\nplanning time (ms), {regime}; [messages of mgwfbp-paper / mgwfbp]")
        head = f"{'L':>6} " + " ".join(f"{s:>10}" for s in SCHEMES) + f" {'messages':>12}"
        print(head)
        print("-" * len(head))
        for L in args.layers:
            profile = random_profile(L, seed=L)
            repeats = args.repeats if L <= 500 else 1
            cells, msgs = [], {}
            for s in SCHEMES:
                t, m = best_time(profile, cost, s, repeats)
                msgs[s] = m
                cells.append(f"{t * 1e3:>10.2f}")
                if L == LIMIT_L and t >= SEARCH_LIMIT_S.get(s, LIMIT_S):
                    slow.append(f"{s} at L = {L} ({regime}): {t:.2f} s")
            print(f"{L:>6} " + " ".join(cells)
                  + f" {msgs['mgwfbp-paper']:>5} / {msgs['mgwfbp']:<5}")
            if L == LIMIT_L and "overlap" in SCHEMES:
                plan = make_plan(profile, cost, "overlap")
                print(f"{'':>6} overlap at L = {L}: {plan.num_messages} messages, "
                      f"{100 * (plan.iteration_time / plan.schedule.bound - 1):.2f}% above "
                      f"its lower bound "
                      f"{plan.schedule.bound * 1e3:.2f} ms")
    extended(args.layers)
    if slow:
        print(f"\nTOO SLOW at L = {LIMIT_L} (limits: {LIMIT_S:g} s, {SEARCH_LIMIT_S}):\n  "
              + "\n  ".join(slow))
        return 1
    print(f"\nevery scheme plans L = {LIMIT_L} in under {LIMIT_S:g} s (the searches: "
          f"{SEARCH_LIMIT_S})")
    return 0


def extended(layer_counts: list[int]) -> None:
    """`mgwfbp` under the extended model: ms per plan, and whether the search was cut."""
    from mgcaffe.comm.model.profile import load_profile  # noqa: PLC0415

    paper = Path(__file__).resolve().parents[1] / "models" / "paper"
    for regime in ("latency-bound (a 5.7 ms, b 4.4 ns/B)", "balanced (a 0.27 ms, b 3.4 ns/B)"):
        base = REGIMES[regime]
        print(f"\nmgwfbp under the extended model, {regime}: ms (messages; cut = not proven)")
        rows = [(f"L = {L}", random_profile(L, seed=L)) for L in layer_counts if L <= 500]
        rows += [(name, load_profile(paper / f"{name}.json")) for name in PAPER_PROFILES]
        print(f"{'profile':>16} " + " ".join(f"{label:>42}" for label in EXTENDED))
        for label, profile in rows:
            cells = []
            for rho, sigma in EXTENDED.values():
                cost = CostModel(base.a, base.b, interference=rho, comm_slowdown=sigma)
                t0 = time.perf_counter()
                plan = make_plan(profile, cost, "mgwfbp")
                t = time.perf_counter() - t0
                cut = "" if plan.exact else ", cut"
                cells.append(f"{t * 1e3:10.1f} ({plan.num_messages}{cut})")
            print(f"{label:>16} " + " ".join(f"{c:>42}" for c in cells))


if __name__ == "__main__":
    sys.exit(main())
