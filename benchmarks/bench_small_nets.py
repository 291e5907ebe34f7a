"""LeNet and CIFAR-10 quick, previous and current CPU paths side by side in one process.

Builds each net twice from the same prototxt and seed: once with the previous layer paths
switched back on (`bench_small_layers.BEFORE`) and once as it is now, then alternates
forward+backward passes between the two, so both see the same load. Prints the median and
best pass per net and way, and the per-layer medians where the two differ most.
Usage: python benchmarks/bench_small_nets.py PROTOTXT... [--iterations N] [--threads T]
[--before CLASS,...] (the prototxt files of bench_vs_caffe.py's --out folder: Input layers,
force_backward; --before: switch back only these layer types, e.g. Scale).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "18")

import numpy as np  # noqa: E402
from bench_small_layers import BEFORE, class_switches, rules_of  # noqa: E402 - same folder

from mgcaffe.cpu import threads  # noqa: E402
from mgcaffe.formats.protoio import read_net_param  # noqa: E402
from mgcaffe.layer_types.base import TRAIN  # noqa: E402
from mgcaffe.net import Net  # noqa: E402


def build(path: str, settings: dict) -> Net:
    """The net under the rules and class switches of `settings` (BEFORE's form)."""
    switches = class_switches(settings)
    saved = {cls: {k: getattr(cls, k) for k in values} for cls, values in switches.items()}
    for cls, values in switches.items():
        for k, v in values.items():
            setattr(cls, k, v)
    try:
        net = Net(read_net_param(path), TRAIN, seed=1, rules=rules_of(settings))
    finally:
        for cls, values in saved.items():
            for k, v in values.items():
                setattr(cls, k, v)
    for layer in net.layers:  # switches read at call time: keep them on the instances
        for cls, values in switches.items():
            if isinstance(layer, cls):
                for k, v in values.items():
                    setattr(layer, k, v)
    return net


def one_pass(net: Net, layer_times: np.ndarray) -> float:
    """One forward+backward (diffs cleared untimed, as `mgcaffe time`); per-layer seconds."""
    net.clear_param_diffs_for_pass()
    start = time.perf_counter()
    for i in range(len(net.layers)):
        t = time.perf_counter()
        net.forward_layer(i)
        layer_times[i] = time.perf_counter() - t
    for i in range(len(net.layers) - 1, -1, -1):
        t = time.perf_counter()
        if net.layer_need_backward[i]:
            net.backward_layer(i)
        layer_times[i] += time.perf_counter() - t
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prototxt", nargs="+")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--threads", default=None, help="as mgcaffe's --threads")
    parser.add_argument("--before", default=None,
                        help="comma-separated layer types: switch back only these")
    args = parser.parse_args(argv)
    threads.configure(args.threads)
    before = BEFORE
    if args.before:
        names = set(args.before.split(","))
        before = {kind: v for kind, v in BEFORE.items() if kind in names}
        if len(before) != len(names):
            parser.error(f"--before: choose from {', '.join(BEFORE)}")
    for path in args.prototxt:
        nets = [build(path, before), build(path, {})]
        count = len(nets[1].layers)
        totals = [[], []]
        layers = [np.zeros((args.iterations, count)) for _ in nets]
        for net in nets:  # warm-up: buffers, and the runners' first trials
            for _ in range(3):
                one_pass(net, np.zeros(count))
        for it in range(args.iterations):
            for k in (it % 2, 1 - it % 2):  # alternate which goes first
                totals[k].append(one_pass(nets[k], layers[k][it]))
        med = [np.median(t) * 1e3 for t in totals]
        print(f"{path}: median ms before {med[0]:.2f} after {med[1]:.2f} "
              f"(after/before {med[1] / med[0]:.2f}); best {min(totals[0]) * 1e3:.2f} / "
              f"{min(totals[1]) * 1e3:.2f}")
        per = [np.median(lt, axis=0) * 1e3 for lt in layers]
        order = np.argsort(-np.abs(per[0] - per[1]))[:6]
        for i in order:
            print(f"  {nets[1].layer_names[i]:<8} {nets[1].layers[i].type:<16} "
                  f"{per[0][i]:8.3f} -> {per[1][i]:8.3f} ms")


if __name__ == "__main__":
    main()
