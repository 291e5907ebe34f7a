"""Convolution layers for the tests of its CPU paths (shifted, Winograd, split GEMMs)."""

from __future__ import annotations

import numpy as np
from google.protobuf import text_format
from layer_rules import changed

from mgcaffe.blob import Blob
from mgcaffe.cpu.parallel import ChunkRunner
from mgcaffe.layer_types import LayerContext, create_layer
from mgcaffe.layer_types.choice.rules import LayerRules
from mgcaffe.proto import caffe_pb2


def conv_rules(base: LayerRules | None = None, **changes) -> LayerRules:
    """`base` (default LayerRules()) with Convolution's rules changed by `changes`."""
    return changed(base, convolution=changes)


def threaded_conv(body, shape, rules=None, threads=2, dtype=np.float64, seed=0, bottoms=1):
    """A Convolution (`body`: its convolution_param fields) on a non-adaptive runner of
    `threads` threads with tiny chunks, so that the threaded hand-out runs on small shapes;
    `rules`: ConvolutionRules fields to change (a dict) or a LayerRules; `bottoms` bottoms
    of `shape` filled with seeded normal values. Returns (layer, bottom, top)."""
    text = ('name: "c" type: "Convolution" convolution_param { ' + body +
            ' weight_filler { type: "gaussian" } bias_filler { type: "gaussian" } }')
    param = text_format.Parse(text, caffe_pb2.LayerParameter())
    param.top.extend([f"t{i}" for i in range(bottoms)])
    runner = ChunkRunner(threads, chunk_elements=1, serial_below=1, adaptive=False)
    if not isinstance(rules, LayerRules):
        rules = conv_rules(**(rules or {}))
    layer = create_layer(param, LayerContext(xp=np, dtype=dtype, seed=seed, chunk_runner=runner,
                                             rules=rules))
    rng = np.random.default_rng(seed + 1)
    bottom = [Blob(shape, dtype=dtype, name=f"x{i}") for i in range(bottoms)]
    for b in bottom:
        b.data[...] = rng.standard_normal(shape)
    top = [Blob((), dtype=dtype, name=f"y{i}") for i in range(bottoms)]
    layer.setup(bottom, top)
    return layer, bottom, top
