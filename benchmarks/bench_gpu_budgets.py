"""Launch, host-sync and copy budgets of the GPU engine, counted on the CuPy double.

    python benchmarks/bench_gpu_budgets.py [--nets lenet,cifar10_quick,...] [--batch N]
                                           [--json out.json]

For LeNet (b64), CIFAR-10 quick (b100), AlexNet (b32), GoogleNet (b64) and ResNet-50 (b32),
one forward+backward iteration (after an untimed one) on the double
(tests/support/cupy_double): device calls ("launches"), host synchronisations with their
call sites, and bytes copied each way, against the targets: launches within 3x the layer
passes, at most 2 host syncs. Counts are deterministic, so this needs no quiet machine and
no GPU; the GoogleNet table of launches per layer type shows where launches go.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "support"))  # the CuPy double: tests' code

import cupy_double  # noqa: E402
from cupy_double.budget import NETS, measure  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", default=",".join(NETS))
    parser.add_argument("--batch", type=int, help="one batch for every net (default: each "
                        "net's own)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    results = []
    print(f"{'net':<14}{'batch':>6}{'passes':>8}{'launches':>10}{'budget':>8}{'syncs':>7}"
          f"{'h2d B':>10}{'d2h B':>8}  seconds")
    with cupy_double.installed() as double:
        for name in args.nets.split(","):
            t0 = time.perf_counter()
            r = measure(name, args.batch, double, by_type=True)
            r["seconds"] = time.perf_counter() - t0
            results.append(r)
            flag = "" if r["launches"] <= r["launch_budget"] else " over"
            print(f"{name:<14}{r['batch']:>6}{r['layer_passes']:>8}{r['launches']:>10}"
                  f"{r['launch_budget']:>8}{r['syncs']:>7}{r['h2d_bytes']:>10}"
                  f"{r['d2h_bytes']:>8}  {r['seconds']:.0f}{flag}", flush=True)
    for r in results:
        print(f"\n{r['net']} b{r['batch']}: host syncs at")
        for site, n in r["sync_sites"].items():
            print(f"  {n:>4}  {site}")
        print(f"{r['net']} b{r['batch']}: launches per layer type")
        for key, n in r["launches_by_type"].items():
            print(f"  {n:>7}  {key}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
