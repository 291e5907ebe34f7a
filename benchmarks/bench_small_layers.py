"""The non-GEMM layers of LeNet and CIFAR-10 quick: previous and current CPU paths side by side.

Each case builds the layer twice, once with the previous path switched back on (its layer
rules) and once as it is now, and times forward
and backward alternately in one process, repetition by repetition, so that both see the same
load. Prints best-of-R ms and after/before. Between calls it writes `--evict-mb` of memory,
as the rest of a net does.
Usage: python benchmarks/bench_small_layers.py [--repeats R] [--only WORD] [--evict-mb MB].
Pooling's "before" is its numpy path (PoolingRules.compiled False), "after" the compiled loops
(`--only pool` for the pooling cases alone); LRN's likewise (LRNRules.compiled False,
`--only LRN`).
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace

# See bench_layers.py: park OpenBLAS's idle threads quickly (before numpy loads it).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "18")

import numpy as np  # noqa: E402
from google.protobuf import text_format  # noqa: E402

from mgcaffe.blob import Blob  # noqa: E402
from mgcaffe.cpu.engine import CpuEngine  # noqa: E402
from mgcaffe.layer_types import LayerContext, create_layer  # noqa: E402
from mgcaffe.layer_types.choice.rules import LayerRules  # noqa: E402
from mgcaffe.proto import caffe_pb2  # noqa: E402

#: The previous paths, per layer type: (the LayerRules field, the rule changes).
BEFORE = {
    # the numpy passes (MAX backward by index, AVE GEMM)
    "Pooling": ("pooling", {"compiled": False}),
    "LRN": ("lrn", {"compiled": False}),  # the numpy passes
    "SoftmaxWithLoss": ("softmax_loss", {"plain_path": False}),
    "Convolution": ("convolution", {"per_sample_upto_rows": 0}),
    "Scale": ("scale", {"fused_rows": False}),
    "InnerProduct": ("inner_product", {"weight_major_upto": 0, "overwrite_block_elements": 0,
                                       "dx_block_rows": 0}),
}


def rules_of(settings: dict) -> LayerRules:
    """LayerRules with the rule changes of `settings` (BEFORE's form)."""
    rules = LayerRules()
    for where, values in settings.values():
        rules = replace(rules, **{where: replace(getattr(rules, where), **values)})
    return rules


#: ResNet-50's Scale after each BatchNorm: in place, with a bias.
SCALE = 'type: "Scale" scale_param { bias_term: true }'



def pool(method: str, k: int, s: int) -> str:
    return f'type: "Pooling" pooling_param {{ pool: {method} kernel_size: {k} stride: {s} }}'


#: GoogleNet's inception pools.
POOL_S1 = 'type: "Pooling" pooling_param { pool: MAX kernel_size: 3 stride: 1 pad: 1 }'


#: GoogleNet's and AlexNet's LRN.
LRN5 = 'type: "LRN" lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 }'


def ip(out: int) -> str:
    return (f'type: "InnerProduct" inner_product_param {{ num_output: {out} '
            f'weight_filler {{ type: "xavier" }} }}')


def conv(out: int, k: int, pad: int = 0) -> str:
    return (f'type: "Convolution" convolution_param {{ num_output: {out} kernel_size: {k} '
            f'pad: {pad} weight_filler {{ type: "xavier" }} }}')


# name, layer text (without name), bottom shapes (the first is the data; others are labels)
CASES = [
    ("LeNet conv1 1->20 5x5 @28 (25 rows)", conv(20, 5), [(64, 1, 28, 28)]),
    ("LeNet pool1 MAX 2/2 20x24x24", pool("MAX", 2, 2), [(64, 20, 24, 24)]),
    ("LeNet pool2 MAX 2/2 50x8x8", pool("MAX", 2, 2), [(64, 50, 8, 8)]),
    ("CIFAR pool1 MAX 3/2 32x32x32", pool("MAX", 3, 2), [(100, 32, 32, 32)]),
    ("CIFAR pool2 AVE 3/2 32x16x16", pool("AVE", 3, 2), [(100, 32, 16, 16)]),
    ("CIFAR pool3 AVE 3/2 64x8x8", pool("AVE", 3, 2), [(100, 64, 8, 8)]),
    ("LeNet loss SoftmaxWithLoss 64x10", 'type: "SoftmaxWithLoss"', [(64, 10), (64,)]),
    # The larger nets' pools: the CPU paths must not lose there.
    ("AlexNet pool1 MAX 3/2 96x55x55 b8", pool("MAX", 3, 2), [(8, 96, 55, 55)]),
    ("AlexNet pool2 MAX 3/2 256x27x27 b8", pool("MAX", 3, 2), [(8, 256, 27, 27)]),
    ("AlexNet pool5 MAX 3/2 256x13x13 b8", pool("MAX", 3, 2), [(8, 256, 13, 13)]),
    ("GoogleNet pool1 MAX 3/2 64x112x112 b8", pool("MAX", 3, 2), [(8, 64, 112, 112)]),
    ("GoogleNet pool2 MAX 3/2 192x56x56 b8", pool("MAX", 3, 2), [(8, 192, 56, 56)]),
    ("GoogleNet 3a pool MAX 3/1p1 192x28x28 b8", POOL_S1, [(8, 192, 28, 28)]),
    ("GoogleNet 3b pool MAX 3/1p1 256x28x28 b8", POOL_S1, [(8, 256, 28, 28)]),
    ("GoogleNet pool3 MAX 3/2 480x28x28 b8", pool("MAX", 3, 2), [(8, 480, 28, 28)]),
    ("GoogleNet 4a pool MAX 3/1p1 480x14x14 b8", POOL_S1, [(8, 480, 14, 14)]),
    ("GoogleNet 4e pool MAX 3/1p1 528x14x14 b8", POOL_S1, [(8, 528, 14, 14)]),
    ("GoogleNet pool4 MAX 3/2 832x14x14 b8", pool("MAX", 3, 2), [(8, 832, 14, 14)]),
    ("GoogleNet 5a pool MAX 3/1p1 832x7x7 b8", POOL_S1, [(8, 832, 7, 7)]),
    ("GoogleNet pool5 AVE global 1024x7x7 b8", pool("AVE", 7, 1), [(8, 1024, 7, 7)]),
    ("ResNet pool1 MAX 3/2p1 64x112x112 b4",
     'type: "Pooling" pooling_param { pool: MAX kernel_size: 3 stride: 2 pad: 1 }',
     [(4, 64, 112, 112)]),
    ("GoogleNet loss1 AVE 5/3 512x14x14 b8", pool("AVE", 5, 3), [(8, 512, 14, 14)]),
    # LRN across channels, local_size 5, beta 0.75 (GoogleNet's and AlexNet's norms).
    ("GoogleNet pool1/norm1 LRN 64x56x56 b8", LRN5, [(8, 64, 56, 56)]),
    ("GoogleNet conv2/norm2 LRN 192x56x56 b8", LRN5, [(8, 192, 56, 56)]),
    ("AlexNet norm1 LRN 96x55x55 b8", LRN5, [(8, 96, 55, 55)]),
    ("AlexNet norm2 LRN 256x27x27 b8", LRN5, [(8, 256, 27, 27)]),
    # Cases named "(in place)" run with the top blob being the bottom blob.
    ("ResNet scale_conv1 64x112x112 b4 (in place)", SCALE, [(4, 64, 112, 112)]),
    ("ResNet scale2a 256x56x56 b4 (in place)", SCALE, [(4, 256, 56, 56)]),
    ("ResNet scale4a 1024x14x14 b4 (in place)", SCALE, [(4, 1024, 14, 14)]),
    ("ResNet scale5a 2048x7x7 b4 (in place)", SCALE, [(4, 2048, 7, 7)]),
    ("LeNet ip1 800->500 b64", ip(500), [(64, 50, 4, 4)]),
    ("LeNet ip2 500->10 b64", ip(10), [(64, 500)]),
    ("AlexNet fc6 9216->4096 b8", ip(4096), [(8, 256, 6, 6)]),
    ("AlexNet fc7 4096->4096 b8", ip(4096), [(8, 4096)]),
    ("AlexNet fc8 4096->1000 b8", ip(1000), [(8, 4096)]),
    # Eltwise: every bottom gets a diff.
    ("ResNet res2a Eltwise SUM 256x56x56 b4", 'type: "Eltwise"', [(4, 256, 56, 56)] * 2),
    ("ResNet res4a Eltwise SUM 1024x14x14 b4", 'type: "Eltwise"', [(4, 1024, 14, 14)] * 2),
]


#: The layers' chunk runner, as a library-default net's (`cores.choose`'s thread count).
RUNNER = CpuEngine.library_default().runner


def build(text: str, shapes, settings: dict, in_place: bool = False):
    """The layer, bottoms and tops, built with the rule changes in `settings`."""
    param = text_format.Parse(f'name: "l" {text}', caffe_pb2.LayerParameter())
    layer = create_layer(param, LayerContext(dtype=np.float32, seed=0, rules=rules_of(settings),
                                             chunk_runner=RUNNER))
    rng = np.random.default_rng(1)
    bottom = [Blob(shape, name=f"x{i}") for i, shape in enumerate(shapes)]
    bottom[0].data[...] = rng.standard_normal(shapes[0])
    for blob in bottom[1:]:
        blob.data[...] = rng.integers(0, 10, size=blob.shape)
    top = bottom[:1] if in_place else [Blob((), name="y")]
    layer.setup(bottom, top)
    top[0].diff[...] = rng.standard_normal(top[0].shape)
    return layer, bottom, top


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--only", default=None, help="only cases whose name has this word")
    parser.add_argument("--evict-mb", type=int, default=64,
                        help="write this many MB between layer calls, as the other layers of "
                             "a net do between a layer's calls (0: keep the cache warm)")
    args = parser.parse_args(argv)
    evict = np.ones(args.evict_mb << 18, dtype=np.float32)
    cases = [c for c in CASES if args.only is None or args.only in c[0]]
    print(f"best of {args.repeats}, ms, before/after interleaved")
    print("| layer | fwd before | fwd after | bwd before | bwd after | after/before |")
    print("|---|---|---|---|---|---|")
    for name, text, shapes in cases:
        in_place = name.endswith("(in place)")
        pair = [build(text, shapes, BEFORE, in_place), build(text, shapes, {}, in_place)]
        down = [True] + [text.endswith('"Eltwise"')] * (len(shapes) - 1)
        best = [[float("inf")] * 2 for _ in pair]
        for repeat in range(args.repeats + 1):  # the first pass is a warm-up
            for k, (layer, bottom, top) in enumerate(pair):
                evict += 1
                start = time.perf_counter()
                layer.forward(bottom, top)
                middle = time.perf_counter()
                evict += 1
                for blob in layer.blobs:  # as a solver or `mgcaffe time` does per pass
                    blob.clear_diff_lazily()
                back = time.perf_counter()
                layer.backward(top, down, bottom)
                end = time.perf_counter() - back + middle
                if repeat:
                    best[k] = [min(best[k][0], middle - start), min(best[k][1], end - middle)]
        (fb, bb), (fa, ba) = best
        print(f"| {name} | {fb * 1e3:.3f} | {fa * 1e3:.3f} | {bb * 1e3:.3f} | {ba * 1e3:.3f} | "
              f"{(fa + ba) / (fb + bb):.2f} |", flush=True)


if __name__ == "__main__":
    main()
