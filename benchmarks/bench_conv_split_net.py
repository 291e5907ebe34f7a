"""Whole nets with the convolutions' per-sample GEMMs split over threads or not, alternated.

Builds each net once (deploy prototxt, random input of the given batch) and times forward +
backward passes (as `mgcaffe time`: every layer's backward, parameter diffs cleared before
each pass), switching `Convolution.split_sample_gemms` (kernels.sample_gemm) off and on
pass by pass, so that a change in the machine's load hits both ways. Prints the best and
the median pass of each way and their ratio. `--busy K` keeps K busy-loop processes running
meanwhile (a loaded node). Usage: python benchmarks/bench_conv_split_net.py
[--nets alexnet,googlenet,resnet50] [--passes P] [--busy K] [--same]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "18")  # as bench_layers.py: park idle threads

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mgcaffe.layer_types.base import TRAIN  # noqa: E402
from mgcaffe.layer_types.convolution import Convolution  # noqa: E402
from mgcaffe.net import Net  # noqa: E402
from mgcaffe.profiling import timing_propagate_down  # noqa: E402
from mgcaffe.protoio import read_net_param  # noqa: E402
from mgcaffe.synthetic_data import synthesize_data_layers  # noqa: E402

NETS = {
    "alexnet": ("models/alexnet/deploy.prototxt", (8, 3, 227, 227)),
    "googlenet": ("models/googlenet/deploy.prototxt", (8, 3, 224, 224)),
    "resnet50": ("models/resnet50/deploy.prototxt", (4, 3, 224, 224)),
}


def build(name: str) -> Net:
    path, shape = NETS[name]
    param = read_net_param(str(ROOT / path))
    param, _ = synthesize_data_layers(param, {"data": shape}, shape[0])
    return Net(param, TRAIN, seed=0)


def one_pass(net, propagate) -> float:
    net.clear_param_diffs()
    start = time.perf_counter()
    for i in range(len(net.layers)):
        net.forward_layer(i)
    for i in range(len(net.layers) - 1, -1, -1):
        net.backward_layer(i, propagate[i])
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", default=",".join(NETS))
    parser.add_argument("--passes", type=int, default=6, help="timed passes per way")
    parser.add_argument("--busy", type=int, default=0,
                        help="busy-loop processes to run meanwhile (default 0)")
    parser.add_argument("--same", action="store_true",
                        help="both ways split (an A/A run: the noise of the comparison)")
    args = parser.parse_args(argv)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.busy)]
    try:
        print(f"ms per forward+backward pass, {args.passes} per way, alternated, "
              f"{args.busy} busy processes")
        print("| net | best unsplit | best split | median unsplit | median split | "
              "split/unsplit (median) |")
        print("|---|---|---|---|---|---|")
        for name in args.nets.split(","):
            net = build(name)
            propagate = timing_propagate_down(net)
            times = {False: [], True: []}
            for k in range(2 * args.passes + 2):  # the first pass of each way: a warm-up
                split = bool(k % 2)
                Convolution.split_sample_gemms = split or args.same
                seconds = one_pass(net, propagate)
                if k >= 2:
                    times[split].append(seconds * 1e3)
            Convolution.split_sample_gemms = True
            off, on = times[False], times[True]
            print(f"| {name} | {min(off):.0f} | {min(on):.0f} | {statistics.median(off):.0f} | "
                  f"{statistics.median(on):.0f} | "
                  f"{statistics.median(on) / statistics.median(off):.2f} |", flush=True)
    finally:
        for process in busy:
            process.kill()
            process.wait()


if __name__ == "__main__":
    main()
