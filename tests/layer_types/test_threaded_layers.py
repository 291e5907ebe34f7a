"""Layers whose CPU work is split into chunks (kernels.parallel) give the same bits threaded.

Each layer runs twice on the same data: with a runner that makes one chunk of everything on
one thread (the path the other layer tests check against naive loops) and with one that cuts
the minibatch into one-sample chunks, and pooling's cells into blocks of a few cells that
straddle planes and samples, on three threads. Tops, masks and every diff must be equal.
"""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from layer_rules import changed

from mgcaffe.blob import Blob
from mgcaffe.cpu.parallel import ChunkRunner
from mgcaffe.layer_types import LayerContext, create_layer
from mgcaffe.proto import caffe_pb2

WHOLE = ChunkRunner(1, chunk_elements=10**9, serial_below=0)
THREADED = ChunkRunner(3, chunk_elements=7, serial_below=0)


def run_layer(text, shapes, runner, *, n_top=1, in_place=False, seed=0, rules=None):
    """Forward and backward of a float32 layer on seeded data: (tops, top masks, diffs)."""
    param = text_format.Parse(text, caffe_pb2.LayerParameter())
    layer = create_layer(param, LayerContext(dtype=np.float32, seed=0, chunk_runner=runner,
                                             rules=rules or changed()))
    rng = np.random.default_rng(seed)
    bottom = [Blob(shape, name=f"x{i}") for i, shape in enumerate(shapes)]
    top = bottom if in_place else [Blob((), name=f"t{i}") for i in range(n_top)]
    layer.setup(bottom, top)
    for _ in range(2):  # the second pass reuses what the first left in the layer's buffers
        for blob in bottom:
            # Small integers: ties everywhere (MAX pooling's first-maximum rule is exercised).
            blob.data[...] = rng.integers(-3, 4, size=blob.shape)
        layer.forward(bottom, top)
        outputs = [t.data.copy() for t in top]
        top[0].diff[...] = rng.standard_normal(top[0].shape)
        layer.backward(top, [True] * len(bottom), bottom)
    diffs = [b.diff.copy() for b in bottom] + [p.diff.copy() for p in layer.blobs]
    return outputs, diffs


def assert_same(text, shapes, **options):
    whole = run_layer(text, shapes, WHOLE, **options)
    threaded = run_layer(text, shapes, THREADED, **options)
    for expected, got in zip(whole[0] + whole[1], threaded[0] + threaded[1]):
        np.testing.assert_array_equal(got, expected)


POOLS = [
    ("kernel_size: 3 stride: 2", (4, 3, 9, 9)),
    ("kernel_size: 3 stride: 2 pad: 1", (3, 2, 8, 7)),
    ("kernel_size: 3 stride: 1 pad: 1", (4, 3, 5, 6)),
    ("kernel_size: 2 stride: 2", (5, 2, 6, 6)),
    ("kernel_size: 2 stride: 3", (3, 2, 8, 8)),  # stride > kernel: unread cells
    ("kernel_size: 1 stride: 3", (3, 2, 5, 5)),  # windows past the input: empty
    ("kernel_h: 3 kernel_w: 2 stride_h: 1 stride_w: 3 pad_h: 1 pad_w: 1", (3, 2, 7, 8)),
]


@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("body, shape", POOLS)
def test_pooling(method, body, shape):
    n_top = 2 if method == "MAX" else 1
    text = ('name: "p" type: "Pooling" ' + " ".join(f'top: "t{i}"' for i in range(n_top))
            + f" pooling_param {{ pool: {method} {body} }}")
    assert_same(text, [shape], n_top=n_top)


@pytest.mark.parametrize("region", ["ACROSS_CHANNELS", "WITHIN_CHANNEL"])
def test_lrn(region):
    text = (f'name: "n" type: "LRN" lrn_param {{ local_size: 3 alpha: 0.5 beta: 0.75 '
            f"norm_region: {region} }}")
    assert_same(text, [(5, 4, 3, 3)])


@pytest.mark.parametrize("in_place", [False, True])
def test_relu(in_place):
    assert_same('name: "r" type: "ReLU"', [(5, 3, 4, 2)], in_place=in_place)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_concat(axis):
    shapes = [(3, 2, 4, 3), (3, 2, 4, 3)]
    assert_same(f'name: "c" type: "Concat" concat_param {{ axis: {axis} }}', shapes)


@pytest.mark.parametrize("layout", ["whole batch", "per sample", "batch last"])
@pytest.mark.parametrize("body", ["kernel_size: 3 pad: 1 stride: 2", "kernel_size: 1",
                                  "kernel_size: 2 group: 2"])
@pytest.mark.parametrize("kind", ["Convolution", "Deconvolution"])
def test_convolution(layout, body, kind):
    threshold = 1 if layout == "per sample" else 10**9
    rules = changed(convolution={"per_sample_from": threshold,
                                 "per_sample_from_pointwise": threshold,
                                 "batch_last_upto": 10**9 if layout == "batch last" else 0})
    text = (f'name: "c" type: "{kind}" convolution_param {{ num_output: 4 {body} '
            'weight_filler { type: "gaussian" std: 1 } bias_filler { type: "gaussian" } }')
    assert_same(text, [(5, 4, 6, 5)], rules=rules)
