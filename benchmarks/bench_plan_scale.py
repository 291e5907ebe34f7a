"""Planning time at ResNet-152 scale: `mgwfbp` under the extended model and `overlap`.

    .venv/bin/python benchmarks/bench_plan_scale.py [--layers 100 200 300 500] [--nodes 4 64]

The profile is synthetic but shaped like a deep ResNet: a stem, then bottleneck blocks in four
stages (block counts in ResNet-152's 3:8:36:3 proportion, scaled so that the net has L
learnable layers), each convolution followed by its Scale (gamma, beta), a classifier last.
Parameter counts follow the architecture; backward times are 2 x the forward FLOPs at batch 32
over 2 TFLOP/s with a seeded +-20% jitter (a Scale layer: its elementwise work at 20 GB/s);
t_f = t_b / 2. Costs: the paper's 10GbE constants (ring formula) for N nodes, with rho and
sigma like those the trainer measures in situ (rho 1.1..1.5, sigma 3..1.2 from small to large
messages).

For each L and scheme: the time of `make_plan` (one run; the searches are deterministic),
the predicted iteration, a lower bound the planner computes on any grouping / schedule, the
gap between them, and whether the plan is proven optimal. Exits with status 1 when a plan at
the largest L takes `--limit` seconds (default 5) or more.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mgcaffe.comm.model.cost import CostModel, cost_for, load_network  # noqa: E402
from mgcaffe.comm.model.interference_search import grouping_lower_bound  # noqa: E402
from mgcaffe.comm.model.profile import LayerProfile, Profile  # noqa: E402
from mgcaffe.comm.model.schemes import make_plan  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NETWORK = ROOT / "models" / "paper" / "network-10gbe-paper-constants.json"
RHO = ((64 << 10, 1.1), (16 << 20, 1.5))  # backward's slowdown while a message is in flight
SIGMA = ((64 << 10, 3.0), (16 << 20, 1.2))  # a message's slowdown while backward runs
STAGES = ((64, 56, 3), (128, 28, 8), (256, 14, 36), (512, 7, 3))  # width, spatial, blocks
FLOPS, MEMBW, BATCH = 2e12, 20e9, 32


def resnet_profile(L: int, seed: int = 0) -> Profile:
    """A ResNet-style bottleneck net of exactly L learnable layers (L >= 20), seeded."""
    rng = random.Random(seed)
    layers: list[LayerProfile] = []

    def add(name: str, params: int, flops: float) -> None:
        t = 2 * flops * BATCH / FLOPS * rng.uniform(0.8, 1.2)
        layers.append(LayerProfile(name, params, t))

    def conv(name: str, cin: int, cout: int, k: int, hw: int) -> None:
        add(name, cin * cout * k * k, cin * cout * k * k * hw * hw)
        # a Scale's work is memory-bound: read and write the activations
        layers.append(LayerProfile(f"scale_{name}", 2 * cout,
                                   2 * 4 * cout * hw * hw * BATCH / MEMBW
                                   * rng.uniform(0.8, 1.2)))

    # 2 (stem) + 4 x 2 (projections) + 1 (classifier) + 6 per block
    blocks = max(4, (L - 11) // 6)
    weight = sum(n for *_, n in STAGES)
    counts = [max(1, round(blocks * n / weight)) for *_, n in STAGES]
    counts[2] += blocks - sum(counts)
    conv("conv1", 3, 64, 7, 112)
    cin = 64
    for s, ((width, hw, _), n) in enumerate(zip(STAGES, counts)):
        conv(f"res{s + 2}_proj", cin, 4 * width, 1, hw)
        for b in range(n):
            conv(f"res{s + 2}_{b}a", cin, width, 1, hw)
            conv(f"res{s + 2}_{b}b", width, width, 3, hw)
            conv(f"res{s + 2}_{b}c", width, 4 * width, 1, hw)
            cin = 4 * width
    while len(layers) < L - 1:  # the remainder of L - 11 over 6: Scale-sized extras
        conv_hw = STAGES[-1][1]
        layers.append(LayerProfile(f"extra{len(layers)}", 2 * cin,
                                   2 * 4 * cin * conv_hw ** 2 * BATCH / MEMBW))
    add("fc1000", cin * 1000 + 1000, cin * 1000)
    layers = layers[:L - 1] + layers[-1:] if len(layers) > L else layers
    return Profile(f"resnet-style-{L}", BATCH, 4,
                   sum(x.backward_time for x in layers) / 2, tuple(layers))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[100, 200, 300, 500])
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 64])
    parser.add_argument("--schemes", nargs="+", default=["mgwfbp", "overlap"])
    parser.add_argument("--limit", type=float, default=5.0)
    args = parser.parse_args(argv)
    network = load_network(NETWORK)
    slow = []
    print(f"{'nodes':>5} {'L':>5} {'scheme':>8} {'plan s':>8} {'iter ms':>9} {'bound ms':>9} "
          f"{'gap %':>7} {'msgs':>5}  proven")
    for nodes in args.nodes:
        base = cost_for(network, nodes, use_formula=True)
        cost = CostModel(base.a, base.b, nodes=nodes, interference=RHO, comm_slowdown=SIGMA)
        for L in args.layers:
            profile = resnet_profile(L, seed=L)
            assert profile.num_layers == L, profile.num_layers
            for scheme in args.schemes:
                t0 = time.perf_counter()
                plan = make_plan(profile, cost, scheme)
                took = time.perf_counter() - t0
                bound = (plan.schedule.bound if plan.schedule is not None
                         else grouping_lower_bound(profile, cost))
                gap = 100 * (plan.iteration_time / bound - 1)
                print(f"{nodes:>5} {L:>5} {scheme:>8} {took:>8.2f} "
                      f"{plan.iteration_time * 1e3:>9.2f} {bound * 1e3:>9.2f} {gap:>7.2f} "
                      f"{plan.num_messages:>5}  {'yes' if plan.exact else 'no'}", flush=True)
                if L == max(args.layers) and took >= args.limit:
                    slow.append(f"{scheme} at N = {nodes}, L = {L}: {took:.2f} s")
    if slow:
        print(f"TOO SLOW (limit {args.limit:g} s):\n  " + "\n  ".join(slow))
        return 1
    print(f"every plan at L = {max(args.layers)} took under {args.limit:g} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
