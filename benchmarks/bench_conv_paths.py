"""Convolution's GEMM paths against the layouts they replaced, interleaved in one process.

For ResNet-50 (batch 4), GoogleNet (batch 8) and AlexNet (batch 8) convolution shapes,
times forward and backward (bottom diff included) of two layers built side by side:
"before" and "after", the defaults. `--compare direct`: before has the direct 1x1 path and
the in-GEMM weight-gradient accumulation switched off (the whole-batch / per-sample layouts
with a scratch and an add). `--compare split`: before runs the per-sample GEMMs as one
multi-threaded BLAS call each (kernels.sample_gemm off). `--compare shift`: the stride-1
kxk layers of the benchmark nets on the im2col paths (before) and forced onto the shifted
GEMMs (after, kernels.shift_conv); `--compare stack`: shifted GEMMs one per kernel offset
(before) against the width offsets stacked into one reduction (after). `--compare
winograd`: the 3x3 stride-1 layers of GoogleNet, AlexNet and ResNet-50 on the im2col paths
(before) and forced onto Winograd F(2x2, 3x3) (after, kernels.winograd); `--compare
winograd-loops`: Winograd with its transforms as GEMMs (before) and as compiled loops
(after, kernels.winograd_loops); `--compare winograd-tile`: Winograd F(2x2, 3x3) (before)
against F(4x4, 3x3) (after, kernels.winograd4_loops), both forced, on the same layers;
`--compare sample-columns`: every kxk layer of the five
nets on the defaults without (before) and forced onto (after) the per-sample columns
(kernels.sample_columns). The two run in alternation,
repetition by repetition, so a change in the machine's load hits both; the best of R is
printed. `--busy K` keeps K single-threaded busy-loop processes running meanwhile (a loaded
node). Usage: python benchmarks/bench_conv_paths.py [--repeats R] [--only 1x1|kxk]
[--compare direct|split|shift|stack|winograd|winograd-loops|winograd-tile|sample-columns]
[--busy K].
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "18")  # as bench_layers.py: park idle threads

from bench_layers import build  # noqa: E402 - same folder
from busy_load import BusyLoad  # noqa: E402 - same folder

from mgcaffe.kernels import winograd  # noqa: E402
from mgcaffe.layer_types.choice.rules import LayerRules  # noqa: E402

# name, parameter body, bottom shape (without batch), batch
POINTWISE = [
    ("res2a_branch2c 1x1 64->256 @56", "num_output: 256 kernel_size: 1", (64, 56, 56), 4),
    ("res2b_branch2a 1x1 256->64 @56", "num_output: 64 kernel_size: 1", (256, 56, 56), 4),
    ("res3a_branch1 1x1/2 256->512 @56", "num_output: 512 kernel_size: 1 stride: 2",
     (256, 56, 56), 4),
    ("res3d_branch2c 1x1 128->512 @28", "num_output: 512 kernel_size: 1", (128, 28, 28), 4),
    ("res4a_branch1 1x1/2 512->1024 @28", "num_output: 1024 kernel_size: 1 stride: 2",
     (512, 28, 28), 4),
    ("res4b_branch2c 1x1 256->1024 @14", "num_output: 1024 kernel_size: 1", (256, 14, 14), 4),
    ("res5a_branch1 1x1/2 1024->2048 @14", "num_output: 2048 kernel_size: 1 stride: 2",
     (1024, 14, 14), 4),
    ("res5b_branch2a 1x1 2048->512 @7", "num_output: 512 kernel_size: 1", (2048, 7, 7), 4),
    ("inception_4a/1x1 480->192 @14", "num_output: 192 kernel_size: 1", (480, 14, 14), 8),
    ("inception_5b/1x1 832->384 @7", "num_output: 384 kernel_size: 1", (832, 7, 7), 8),
]
SPATIAL = [
    ("res2a_branch2b 3x3 64->64 @56", "num_output: 64 kernel_size: 3 pad: 1", (64, 56, 56), 4),
    ("res5b_branch2b 3x3 512->512 @7", "num_output: 512 kernel_size: 3 pad: 1", (512, 7, 7), 4),
    ("conv2/3x3 64->192 @56", "num_output: 192 kernel_size: 3 pad: 1", (64, 56, 56), 8),
    ("inception_3b/3x3 128->192 @28", "num_output: 192 kernel_size: 3 pad: 1", (128, 28, 28), 8),
    ("inception_4e/3x3 160->320 @14", "num_output: 320 kernel_size: 3 pad: 1", (160, 14, 14), 8),
    ("inception_3b/5x5 32->96 @28", "num_output: 96 kernel_size: 5 pad: 2", (32, 28, 28), 8),
    ("conv1/7x7_s2 3->64 @224", "num_output: 64 kernel_size: 7 stride: 2 pad: 3",
     (3, 224, 224), 8),
    ("AlexNet conv1 11x11/4 3->96 @227", "num_output: 96 kernel_size: 11 stride: 4",
     (3, 227, 227), 8),
    ("AlexNet conv2 5x5 g2 96->256 @27", "num_output: 256 kernel_size: 5 pad: 2 group: 2",
     (96, 27, 27), 8),
]
# Stride-1 kxk layers of the five benchmark nets (the shifted-GEMM candidates).
SHIFTED = [
    ("CIFAR conv1 5x5 3->32 @32", "num_output: 32 kernel_size: 5 pad: 2", (3, 32, 32), 100),
    ("CIFAR conv2 5x5 32->32 @16", "num_output: 32 kernel_size: 5 pad: 2", (32, 16, 16), 100),
    ("CIFAR conv3 5x5 32->64 @8", "num_output: 64 kernel_size: 5 pad: 2", (32, 8, 8), 100),
    ("LeNet conv2 5x5 20->50 @12", "num_output: 50 kernel_size: 5", (20, 12, 12), 64),
    ("AlexNet conv2 5x5 g2 96->256 @27", "num_output: 256 kernel_size: 5 pad: 2 group: 2",
     (96, 27, 27), 8),
    ("AlexNet conv3 3x3 256->384 @13", "num_output: 384 kernel_size: 3 pad: 1",
     (256, 13, 13), 8),
    ("AlexNet conv4 3x3 g2 384->384 @13", "num_output: 384 kernel_size: 3 pad: 1 group: 2",
     (384, 13, 13), 8),
    ("AlexNet conv5 3x3 g2 384->256 @13", "num_output: 256 kernel_size: 3 pad: 1 group: 2",
     (384, 13, 13), 8),
    ("conv2/3x3 64->192 @56", "num_output: 192 kernel_size: 3 pad: 1", (64, 56, 56), 8),
    ("inception_3a/3x3 96->128 @28", "num_output: 128 kernel_size: 3 pad: 1", (96, 28, 28), 8),
    ("inception_3a/5x5 16->32 @28", "num_output: 32 kernel_size: 5 pad: 2", (16, 28, 28), 8),
    ("inception_4e/3x3 160->320 @14", "num_output: 320 kernel_size: 3 pad: 1", (160, 14, 14), 8),
    ("inception_5b/3x3 192->384 @7", "num_output: 384 kernel_size: 3 pad: 1", (192, 7, 7), 8),
    ("res2a_branch2b 3x3 64->64 @56", "num_output: 64 kernel_size: 3 pad: 1", (64, 56, 56), 4),
    ("res3a_branch2b 3x3 128->128 @28", "num_output: 128 kernel_size: 3 pad: 1",
     (128, 28, 28), 4),
    ("res4a_branch2b 3x3 256->256 @14", "num_output: 256 kernel_size: 3 pad: 1",
     (256, 14, 14), 4),
    ("res5a_branch2b 3x3 512->512 @7", "num_output: 512 kernel_size: 3 pad: 1", (512, 7, 7), 4),
]
# The 3x3 stride-1 layers of GoogleNet (batch 8), AlexNet (batch 8), ResNet-50 (batch 4):
# those among the shifted-GEMM candidates, and GoogleNet's others.
WINOGRAD = [case for case in SHIFTED if "kernel_size: 3 " in case[1]] + [
    ("inception_3b/3x3 128->192 @28", "num_output: 192 kernel_size: 3 pad: 1", (128, 28, 28), 8),
    ("inception_4a/3x3 96->208 @14", "num_output: 208 kernel_size: 3 pad: 1", (96, 14, 14), 8),
    ("inception_4b/3x3 112->224 @14", "num_output: 224 kernel_size: 3 pad: 1",
     (112, 14, 14), 8),
    ("inception_4c/3x3 128->256 @14", "num_output: 256 kernel_size: 3 pad: 1",
     (128, 14, 14), 8),
    ("inception_4d/3x3 144->288 @14", "num_output: 288 kernel_size: 3 pad: 1",
     (144, 14, 14), 8),
    ("inception_5a/3x3 160->320 @7", "num_output: 320 kernel_size: 3 pad: 1", (160, 7, 7), 8),
]
BEFORE = {"direct": {"direct_from": 10**9, "weight_diff_in_gemm": False},
          "split": {"split_sample_gemms": False},
          "shift": {"shift_gemm": False},
          "stack": {"shift_gemm": True, "shift_stack": False},
          "winograd": {"winograd": False},
          "winograd-loops": {"winograd": True},
          "winograd-tile": {"winograd": True, "winograd_tile": 2},
          "sample-columns": {"sample_columns": False}}
#: The "after" side for each comparison ({}: the defaults).
AFTER = {"shift": {"shift_gemm": True}, "stack": {"shift_gemm": True, "shift_stack": True},
         "winograd": {"winograd": True}, "winograd-loops": {"winograd": True},
         "winograd-tile": {"winograd": True, "winograd_tile": 4},
         "sample-columns": {"sample_columns": True, "winograd": False}}
#: kernels.winograd's COMPILED (the transforms as compiled loops) before and after, where a
#: comparison sets it.
COMPILED = {"winograd-loops": (False, True)}


def build_with(settings: dict, body: str, shape, batch: int):
    """A layer set up under the default rules with Convolution's `settings` changed."""
    rules = LayerRules()
    rules = replace(rules, convolution=replace(rules.convolution, **settings))
    return build("Convolution", body, shape, batch, rules)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--only", choices=("1x1", "kxk", "shifted"), default=None)
    parser.add_argument("--compare", choices=sorted(BEFORE), default="direct")
    parser.add_argument("--match", default="",
                        help="only the layers whose name contains this text")
    parser.add_argument("--busy", type=int, default=0,
                        help="busy-loop processes to run meanwhile (default 0)")
    args = parser.parse_args(argv)
    default = SHIFTED if args.compare in ("shift", "stack") else POINTWISE + SPATIAL
    default = WINOGRAD if args.compare.startswith("winograd") else default
    if args.compare == "sample-columns":  # every kxk layer of the five nets
        default = SHIFTED + [c for c in SPATIAL + WINOGRAD if c not in SHIFTED]
    cases = {"1x1": POINTWISE, "kxk": SPATIAL, "shifted": SHIFTED}.get(args.only, default)
    cases = [case for case in cases if args.match in case[0]]
    with BusyLoad(args.busy):
        run(cases, BEFORE[args.compare], AFTER.get(args.compare, {}), args)


def run(cases, before: dict, after: dict, args) -> None:
    """Print the table for `cases`, `before` against `after` (over the defaults)."""
    print(f"best of {args.repeats}, ms, before/after interleaved ({args.compare}, "
          f"{args.busy} busy processes)")
    print("| layer | batch | fwd before | fwd after | bwd before | bwd after | after/before |")
    print("|---|---|---|---|---|---|---|")
    for name, body, shape, batch in cases:
        pair = [build_with(before, body, shape, batch), build_with(after, body, shape, batch)]
        best = [[float("inf")] * 2 for _ in pair]
        for repeat in range(args.repeats + 1):  # the first pass is a warm-up
            for k, (layer, bottom, top) in enumerate(pair):
                winograd.COMPILED = COMPILED.get(args.compare, (True, True))[k]
                start = time.perf_counter()
                layer.forward(bottom, top)
                middle = time.perf_counter()
                layer.backward(top, [True], bottom)
                end = time.perf_counter()
                if repeat:
                    best[k] = [min(best[k][0], middle - start), min(best[k][1], end - middle)]
        (fb, bb), (fa, ba) = best
        print(f"| {name} | {batch} | {fb * 1e3:.2f} | {fa * 1e3:.2f} | {bb * 1e3:.2f} | "
              f"{ba * 1e3:.2f} | {(fa + ba) / (fb + bb):.2f} |", flush=True)


if __name__ == "__main__":
    main()
