"""Whole nets with one convolution choice off and on, alternated pass by pass.

`--compare split` (the default): the convolutions' per-sample GEMMs split over threads or
not (ConvolutionRules.split_sample_gemms, kernels.sample_gemm). `--compare shift`: the
shifted-GEMM path (`shift_gemm`, kernels.shift_conv) never (before) or by its rule (after).
`--compare keep`: the shifted layers keep their stacked input for backward (before) or
rebuild it there (after). `--compare winograd`: the Winograd path (`winograd`,
kernels.winograd) never (before) or by its rule (after). Builds each net twice, once under
each way's rules (random input of the benchmark batch, the same seed), and times forward +
backward passes (as `mgcaffe time`: every layer's backward, parameter diffs cleared before
each pass), alternating between the two pass by pass, so that a change in the machine's
load hits both ways. Prints the
best and the median pass of each way, their ratio, and the conv+ip GEMM rate of each way's
median pass beside numpy's matmul rate measured in the same run. `--rss`: each way also
once in a fresh process (two passes), its peak RSS. `--busy K` keeps K busy-loop
processes running meanwhile. Usage: python benchmarks/bench_conv_split_net.py
[--nets alexnet,googlenet,resnet50] [--compare split|shift|keep|winograd] [--passes P] [--busy K]
[--same] [--rss]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "18")  # as bench_layers.py: park idle threads

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_engine import gemm_flops, matmul_gflops  # noqa: E402 - same folder
from bench_vs_caffe import peak_rss_mb  # noqa: E402
from busy_load import BusyLoad  # noqa: E402 - same folder

from mgcaffe.formats.protoio import read_net_param  # noqa: E402
from mgcaffe.layer_types.base import TRAIN  # noqa: E402
from mgcaffe.layer_types.choice.rules import LayerRules  # noqa: E402
from mgcaffe.net import Net  # noqa: E402
from mgcaffe.net.profiling import timing_propagate_down  # noqa: E402
from mgcaffe.net.synthetic_data import synthesize_data_layers  # noqa: E402

NETS = {
    "alexnet": ("models/alexnet/deploy.prototxt", (8, 3, 227, 227)),
    "googlenet": ("models/googlenet/deploy.prototxt", (8, 3, 224, 224)),
    "resnet50": ("models/resnet50/deploy.prototxt", (4, 3, 224, 224)),
    "cifar10_quick": ("models/cifar10_quick/cifar10_quick_train_test.prototxt",
                      (100, 3, 32, 32)),
    "lenet": ("models/lenet/lenet_train_test.prototxt", (64, 1, 28, 28)),
}
#: Per comparison: the ConvolutionRules field switched, its "before" and "after" values.
SWITCHES = {"split": ("split_sample_gemms", False, True), "shift": ("shift_gemm", False, None),
            "keep": ("shift_keep_input", True, False), "winograd": ("winograd", False, None)}


def build(name: str, compare: str, after: bool) -> Net:
    """Net `name` with the compared rule set its `after` (or before) way."""
    path, shape = NETS[name]
    param = read_net_param(str(ROOT / path))
    param, _ = synthesize_data_layers(param, {"data": shape}, shape[0])
    field, off, on = SWITCHES[compare]
    rules = LayerRules()
    rules = replace(rules, convolution=replace(rules.convolution,
                                               **{field: on if after else off}))
    return Net(param, TRAIN, seed=0, rules=rules)


def one_pass(net, propagate) -> float:
    net.clear_param_diffs_for_pass()
    start = time.perf_counter()
    for i in range(len(net.layers)):
        net.forward_layer(i)
    for i in range(len(net.layers) - 1, -1, -1):
        net.backward_layer(i, propagate[i])
    return time.perf_counter() - start


def peak_rss_child(name: str, compare: str, after: bool) -> float:
    """Peak RSS (MB) of a fresh process that builds `name` and runs two passes one way."""
    code = f"import bench_conv_split_net as b; b.child({name!r}, {compare!r}, {after!r})"
    out = subprocess.run([sys.executable, "-c", code], cwd=str(Path(__file__).parent),
                         capture_output=True, text=True, timeout=900, check=True).stdout
    return float(out.split()[-1])


def child(name: str, compare: str, after: bool) -> None:
    """Two passes of `name` one way, then print this process's peak RSS in MB (VmHWM)."""
    net = build(name, compare, after)
    propagate = timing_propagate_down(net)
    for _ in range(2):
        one_pass(net, propagate)
    print(peak_rss_mb(os.getpid()))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", default="alexnet,googlenet,resnet50")
    parser.add_argument("--compare", choices=sorted(SWITCHES), default="split")
    parser.add_argument("--passes", type=int, default=6, help="timed passes per way")
    parser.add_argument("--busy", type=int, default=0,
                        help="busy-loop processes to run meanwhile (default 0)")
    parser.add_argument("--same", action="store_true",
                        help="both ways 'after' (an A/A run: the noise of the comparison)")
    parser.add_argument("--rss", action="store_true",
                        help="also each way's peak RSS, in a fresh process")
    args = parser.parse_args(argv)
    with BusyLoad(args.busy):
        print(f"ms per forward+backward pass, {args.passes} per way, alternated "
              f"({args.compare}), {args.busy} busy processes; numpy matmul "
              f"{matmul_gflops(repeats=3, n=1024):.0f} GFLOP/s before")
        print("| net | best before | best after | median before | median after | "
              "after/before (median) | conv+ip GFLOP/s before / after |"
              + (" peak RSS MB before / after |" if args.rss else ""))
        print("|---|---|---|---|---|---|---|" + ("---|" if args.rss else ""))
        for name in args.nets.split(","):
            nets = {after: build(name, args.compare, after or args.same)
                    for after in (False, True)}
            propagate = timing_propagate_down(nets[True])
            flops = sum(gemm_flops(nets[True], propagate))
            times = {False: [], True: []}
            for k in range(2 * args.passes + 2):  # the first pass of each way: a warm-up
                after = bool(k % 2)
                seconds = one_pass(nets[after], propagate)
                if k >= 2:
                    times[after].append(seconds * 1e3)
            for net in nets.values():
                net.close()
            off, on = statistics.median(times[False]), statistics.median(times[True])
            line = (f"| {name} | {min(times[False]):.0f} | {min(times[True]):.0f} | "
                    f"{off:.0f} | {on:.0f} | {on / off:.2f} | "
                    f"{flops / off / 1e6:.0f} / {flops / on / 1e6:.0f} |")
            if args.rss:
                line += (f" {peak_rss_child(name, args.compare, False):.0f} / "
                         f"{peak_rss_child(name, args.compare, not args.same):.0f} |")
            print(line, flush=True)
        print(f"numpy matmul {matmul_gflops(repeats=3, n=1024):.0f} GFLOP/s after")


if __name__ == "__main__":
    main()
