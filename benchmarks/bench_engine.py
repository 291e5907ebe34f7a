"""Net-level speed on the CPU (issue 2, "Speed"): LeNet, CIFAR-10 quick and GoogleNet.

For each model (TRAIN phase, random data of the declared shape) prints the forward+backward
time per iteration (mean and best of the timed iterations, and the sum of each layer's best
time), the achieved GFLOP/s of the Convolution/InnerProduct layers over the GFLOP/s of one
2048^3 float32 matmul measured in the same run (target >= 0.5 on GoogleNet), and the share of
the iteration taken by the slowest layer that is not conv/ip (target <= 25%). Usage:
    python benchmarks/bench_engine.py [--iterations N] [--models lenet,cifar10_quick,googlenet]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# Idle OpenBLAS threads spin on a core for ~0.1 s after each GEMM (2^28 cycles by default),
# which starves the threads mgcaffe splits copies and element-wise loops over
# (mgcaffe/cpu/parallel.py). 2^18 cycles parks them within ~0.1 ms. It must be set
# before numpy loads OpenBLAS.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "18")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mgcaffe.cpu.parallel import default_threads  # noqa: E402
from mgcaffe.formats.protoio import read_net_param  # noqa: E402
from mgcaffe.layer_types.base import TRAIN  # noqa: E402
from mgcaffe.net import Net  # noqa: E402
from mgcaffe.net.profiling import profile_net, timing_propagate_down  # noqa: E402
from mgcaffe.net.synthetic_data import fill_labels, synthesize_data_layers  # noqa: E402

# name, prototxt, synthetic data shape, iterations by default
MODELS = {
    "lenet": ("models/lenet/lenet_train_test.prototxt", (64, 1, 28, 28), 20),
    "cifar10_quick": ("models/cifar10_quick/cifar10_quick_train_test.prototxt",
                      (100, 3, 32, 32), 10),
    "googlenet": ("models/googlenet/train_val.prototxt", (8, 3, 224, 224), 5),
}
GEMM_TYPES = ("Convolution", "Deconvolution", "InnerProduct")


def matmul_gflops(repeats: int = 5, n: int = 2048) -> float:
    """Best-of GFLOP/s of one n^3 float32 matmul (the BLAS's practical peak here)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    out = np.empty((n, n), dtype=np.float32)
    np.matmul(a, b, out=out)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.matmul(a, b, out=out)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def gemm_flops(net, propagate) -> list[float]:
    """Per layer: the GEMM flops of one forward+backward (0 for layers that are not conv/ip).

    Forward and the weight gradient cost 2*weights*positions each; the bottom gradient as
    much again when that bottom gets a diff.
    """
    flops = []
    for i, layer in enumerate(net.layers):
        if layer.type not in GEMM_TYPES:
            flops.append(0.0)
            continue
        bottom = net.blobs[net.bottom_names[net.layer_names[i]][0]]
        top = net.blobs[net.top_names[net.layer_names[i]][0]]
        if layer.type == "InnerProduct":
            positions = layer.m
        elif layer.type == "Convolution":
            positions = top.count // (layer.num_output)
        else:  # Deconvolution: the GEMMs run over the input positions
            positions = bottom.count // layer.channels
        one = 2.0 * layer.blobs[0].count * positions
        passes = 1 + int(layer.param_propagate_down[0]) + int(any(propagate[i]))
        flops.append(one * passes)
    return flops


def bench_model(name: str, iterations: int) -> dict:
    path, shape, _ = MODELS[name]
    param = read_net_param(str(ROOT / path))
    data_top = next(layer.top[0] for layer in param.layer
                    if layer.type in ("Data", "ImageData", "Input", "DummyData"))
    param, labels = synthesize_data_layers(param, {data_top: shape}, shape[0])
    net = Net(param, TRAIN, seed=0)
    fill_labels(net, labels, num_classes=10, seed=0)
    net.forward_backward()  # warm-up: buffers allocated, caches filled
    runs = [profile_net(net, 1, warmup=0) for _ in range(iterations)]
    per_layer = np.array([[r["forward"][i] + r["backward"][i] for i in range(len(net.layers))]
                          for r in runs])
    iteration = per_layer.sum(axis=1)
    # Per-layer best over the iterations: what the layers cost when nothing else runs on the
    # machine (a shared machine adds large, random stalls, worst for threaded BLAS calls).
    layer_best = per_layer.min(axis=0)
    flops = np.array(gemm_flops(net, timing_propagate_down(net)))
    is_gemm = flops > 0
    others = [(layer_best[i], net.layer_names[i], net.layers[i].type)
              for i in range(len(net.layers)) if not is_gemm[i]]
    slowest = max(others)
    return {
        "name": name, "batch": shape[0], "mean_ms": iteration.mean() * 1e3,
        "best_ms": iteration.min() * 1e3, "layer_best_ms": layer_best.sum() * 1e3,
        "gemm_gflops": flops.sum() / layer_best[is_gemm].sum() / 1e9,
        "gemm_share": layer_best[is_gemm].sum() / layer_best.sum(),
        "slowest_other": f"{slowest[1]} ({slowest[2]})",
        "slowest_share": slowest[0] / layer_best.sum(),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=None,
                        help="timed iterations per model (default: 20 / 10 / 5)")
    parser.add_argument("--models", default=",".join(MODELS),
                        help="comma-separated subset of " + ", ".join(MODELS))
    args = parser.parse_args(argv)
    peak = matmul_gflops()
    results = [bench_model(name, args.iterations or MODELS[name][2])
               for name in args.models.split(",")]
    # The matmul is measured again at the end and the better rate kept: a conservative ratio.
    peak = max(peak, matmul_gflops())
    print(f"2048^3 float32 matmul: {peak:.1f} GFLOP/s (best, before and after the runs); "
          f"{default_threads()} chunk threads, OPENBLAS_THREAD_TIMEOUT="
          f"{os.environ.get('OPENBLAS_THREAD_TIMEOUT')}\n")
    print(f"{'model':<15}{'batch':>6}{'mean ms':>9}{'best ms':>9}{'layers ms':>10}"
          f"{'conv+ip GF/s':>13}{'/matmul':>8}{'conv+ip':>8}  slowest other layer (share)")
    for r in results:
        print(f"{r['name']:<15}{r['batch']:>6}{r['mean_ms']:>9.1f}{r['best_ms']:>9.1f}"
              f"{r['layer_best_ms']:>10.1f}{r['gemm_gflops']:>13.1f}"
              f"{r['gemm_gflops'] / peak:>8.2f}{100 * r['gemm_share']:>7.0f}%  "
              f"{r['slowest_other']} ({100 * r['slowest_share']:.0f}%)")
    print("\nmean/best ms: forward+backward per iteration; layers ms: the sum of each layer's "
          "best time,\nwhich the GFLOP/s and shares use (robust to other load on the machine).")


if __name__ == "__main__":
    main()
