"""Forward+backward speed of the Convolution and InnerProduct layers at GoogleNet-like shapes.

Prints, per layer, the best-of-R forward and backward times and the achieved GFLOP/s, next
to the GFLOP/s of one 2048^3 float32 matmul measured in the same run; the target is conv+ip
at >= 0.5 of the matmul rate. Usage: python benchmarks/bench_layers.py [--repeats R]
[--batch N].
"""

from __future__ import annotations

import argparse
import os
import time

# Idle OpenBLAS threads spin on a core for ~0.1 s after each GEMM (2^28 cycles by default),
# which starves the threads mgcaffe splits copies and element-wise loops over
# (mgcaffe/cpu/parallel.py). 2^18 cycles parks them within ~0.1 ms. It must be set
# before numpy loads OpenBLAS.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "18")

import numpy as np  # noqa: E402
from bench_engine import matmul_gflops  # noqa: E402 - same folder: one matmul reference
from google.protobuf import text_format

from mgcaffe.blob import Blob
from mgcaffe.cpu.engine import CpuEngine
from mgcaffe.layer_types import LayerContext, create_layer
from mgcaffe.proto import caffe_pb2

# name, layer type, parameter body, bottom shape (without batch), backprop into the bottom
CASES = [
    ("conv1 7x7/2 3->64 @224", "Convolution",
     "num_output: 64 kernel_size: 7 stride: 2 pad: 3", (3, 224, 224), False),
    ("conv2 3x3 64->192 @56", "Convolution",
     "num_output: 192 kernel_size: 3 pad: 1", (64, 56, 56), True),
    ("3x3 192->384 @28", "Convolution",
     "num_output: 384 kernel_size: 3 pad: 1", (192, 28, 28), True),
    ("1x1 480->192 @14", "Convolution", "num_output: 192 kernel_size: 1", (480, 14, 14), True),
    ("5x5 32->96 @14", "Convolution",
     "num_output: 96 kernel_size: 5 pad: 2", (32, 14, 14), True),
    ("1x1 832->384 @7", "Convolution", "num_output: 384 kernel_size: 1", (832, 7, 7), True),
    ("fc 1024->1000", "InnerProduct", "num_output: 1000", (1024,), True),
]


#: The layers' chunk runner, as a library-default net's (`cores.choose`'s thread count).
RUNNER = CpuEngine.library_default().runner


def build(kind: str, body: str, shape, batch: int, rules=None):
    """The layer (float32, seeded), its bottom and top, set up; `rules`: a LayerRules."""
    field = "convolution_param" if kind == "Convolution" else "inner_product_param"
    text = (f'name: "l" type: "{kind}" {field} {{ {body} weight_filler {{ type: "gaussian" '
            'std: 0.01 } }')
    context = LayerContext(dtype=np.float32, seed=0, chunk_runner=RUNNER)
    if rules is not None:
        context.rules = rules
    layer = create_layer(text_format.Parse(text, caffe_pb2.LayerParameter()), context)
    bottom = [Blob((batch,) + shape, name="x")]
    bottom[0].data[...] = np.random.default_rng(1).standard_normal(bottom[0].shape)
    top = [Blob((), name="y")]
    layer.setup(bottom, top)
    top[0].diff[...] = np.random.default_rng(2).standard_normal(top[0].shape)
    return layer, bottom, top


def time_layer(layer, bottom, top, down: bool, repeats: int) -> tuple[float, float]:
    """Best-of forward and backward seconds of one layer, each backward after a forward (as
    in training: a backward may reuse what its forward left behind)."""
    best_forward = best_backward = float("inf")
    for _ in range(repeats + 1):  # the first pass allocates buffers: a warm-up
        start = time.perf_counter()
        layer.forward(bottom, top)
        middle = time.perf_counter()
        layer.backward(top, [down], bottom)
        end = time.perf_counter()
        best_forward = min(best_forward, middle - start)
        best_backward = min(best_backward, end - middle)
    return best_forward, best_backward


def gemm_flops(layer, bottom, top) -> float:
    """Multiply-adds x 2 of one forward GEMM (per-group sizes summed)."""
    weight = layer.blobs[0]
    if layer.type == "InnerProduct":
        return 2.0 * weight.count * layer.m
    spatial = top[0].count // (top[0].shape[0] * top[0].shape[1])
    return 2.0 * weight.count * spatial * top[0].shape[0]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args(argv)
    peak = matmul_gflops(args.repeats)
    rows = []
    for name, kind, body, shape, down in CASES:
        layer, bottom, top = build(kind, body, shape, args.batch)
        forward, backward = time_layer(layer, bottom, top, down, args.repeats)
        rows.append((name, forward, backward, gemm_flops(layer, bottom, top) * (3 if down else 2)))
    # The matmul is measured again at the end and the better rate kept: a conservative ratio.
    peak = max(peak, matmul_gflops(args.repeats))
    print(f"2048^3 float32 matmul: {peak:.1f} GFLOP/s (best of {args.repeats}, before and "
          f"after); {RUNNER.threads} chunk threads, OPENBLAS_THREAD_TIMEOUT="
          f"{os.environ.get('OPENBLAS_THREAD_TIMEOUT')}\n")
    title = f"layer (batch {args.batch})"
    print(f"{title:<26}{'fwd ms':>9}{'bwd ms':>9}{'GFLOP':>8}{'GFLOP/s':>9}{'/matmul':>9}")
    for name, forward, backward, flops in rows:
        rate = flops / (forward + backward) / 1e9
        print(f"{name:<26}{forward * 1e3:9.2f}{backward * 1e3:9.2f}{flops / 1e9:8.2f}"
              f"{rate:9.1f}{rate / peak:9.2f}")
    overall = sum(r[3] for r in rows) / sum(r[1] + r[2] for r in rows) / 1e9
    print(f"\nconv+ip overall: {overall:.1f} GFLOP/s = {overall / peak:.2f} of the matmul rate "
          f"(target >= 0.50)")


if __name__ == "__main__":
    main()
