"""Parameter-diff clearing: the eager fill against the lazy mark, side by side in one process.

One net, its diffs flattened into one buffer as in distributed training; each repetition
times the solver's clear (clear_param_diffs_for_pass) + forward + backward, alternating the
eager fill
(`lazy_param_diff_clear = False`: fill, then the GEMMs add with beta = 1) and the lazy mark
(the first GEMM writes with beta = 0). Reports best and median ms of each and their ratio.

    python benchmarks/bench_lazy_clear.py [--net alexnet] [--batch 8] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def build(net_name: str, batch: int):
    import bench_vs_caffe  # noqa: PLC0415 - the same generated nets as the Caffe comparison

    from mgcaffe.formats.protoio import read_net_param  # noqa: PLC0415
    from mgcaffe.layer_types.base import TRAIN  # noqa: PLC0415
    from mgcaffe.net import Net  # noqa: PLC0415

    path, shapes, iters = bench_vs_caffe.NETS[net_name]
    shapes = {k: (batch,) + tuple(v[1:]) for k, v in shapes.items()}
    bench_vs_caffe.NETS[net_name] = (path, shapes, iters)
    with tempfile.TemporaryDirectory() as tmp:
        prototxt = bench_vs_caffe.generate(net_name, Path(tmp))
        param = read_net_param(prototxt)
    net = Net(param, TRAIN, seed=1)
    net.flatten_param_diffs()
    return net


def one(net, lazy: bool) -> tuple[float, float]:
    """(clear ms, clear + forward + backward ms)."""
    net.lazy_param_diff_clear = lazy
    t0 = time.perf_counter()
    way = net.clear_param_diffs_for_pass()
    assert way == ("lazy" if lazy else "eager"), way
    t1 = time.perf_counter()
    net.forward()
    net.backward()
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t0) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--net", default="alexnet")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    net = build(args.net, args.batch)
    mb = net.param_diff_buffer.nbytes / 1e6
    for lazy in (False, True):  # warm-up: allocations, first-touch pages
        one(net, lazy)
    res = {False: [], True: []}
    for r in range(args.repeats):
        for lazy in ((False, True) if r % 2 == 0 else (True, False)):
            res[lazy].append(one(net, lazy))
    print(f"{args.net} b{args.batch}, {mb:.0f} MB of parameter diffs, {args.repeats} "
          f"alternated repetitions (ms)")
    print(f"{'':8} {'clear best':>11} {'total best':>11} {'total median':>13}")
    for lazy, label in ((False, "eager"), (True, "lazy")):
        clears, totals = zip(*res[lazy])
        print(f"{label:8} {min(clears):11.1f} {min(totals):11.1f} "
              f"{statistics.median(totals):13.1f}")
    best = {k: min(t for _, t in v) for k, v in res.items()}
    med = {k: statistics.median(t for _, t in v) for k, v in res.items()}
    print(f"lazy/eager: best {best[True] / best[False]:.3f}, "
          f"median {med[True] / med[False]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
