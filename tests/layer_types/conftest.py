"""Shared fixtures of the layer tests."""

from __future__ import annotations

import itertools

import numpy as np
import pytest


def _reference_conv(x, w, b, stride, pad, dilation, group):
    """Caffe's 2-D convolution (cross-correlation) by loops over every output element."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    oh = (h + 2 * pad[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + 2 * pad[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow))
    og = o // group
    for ni, oi, y, z in itertools.product(range(n), range(o), range(oh), range(ow)):
        g = oi // og
        total = b[oi] if b is not None else 0.0
        for ci, i, j in itertools.product(range(cg), range(kh), range(kw)):
            hi = y * stride[0] - pad[0] + i * dilation[0]
            wi = z * stride[1] - pad[1] + j * dilation[1]
            if 0 <= hi < h and 0 <= wi < wd:
                total += w[oi, ci, i, j] * x[ni, g * cg + ci, hi, wi]
        out[ni, oi, y, z] = total
    return out


@pytest.fixture
def naive_conv():
    """The loop-by-loop reference convolution: naive_conv(x, w, b, stride, pad, dilation,
    group), the kernel taken from w's shape, b None for no bias."""
    return _reference_conv


def _reference_layer_top(layer, x):
    b = layer.blobs[1].data if layer.bias_term else None
    return _reference_conv(x, layer.blobs[0].data, b, layer.stride, layer.pad, layer.dilation,
                           layer.group)


@pytest.fixture
def naive_layer_top():
    """naive_layer_top(layer, x): the loop reference of a Convolution layer's top for input
    x, with the layer's own weight, bias and geometry."""
    return _reference_layer_top


def _passes(layer, bottom, top, start=None):
    """Forward, then two backwards from seeded top diffs (the param diffs accumulate onto
    `start`; by default seeded draws): copies of every top, bottom diff and param diff."""
    if start is None:
        start = [np.random.default_rng(9 + i).standard_normal(p.shape).astype(p.diff.dtype)
                 for i, p in enumerate(layer.blobs)]
    layer.forward(bottom, top)
    rng = np.random.default_rng(5)
    for t in top:
        t.diff[...] = rng.standard_normal(t.shape)
    for p, s in zip(layer.blobs, start):
        p.diff[...] = s
    layer.backward(top, [True] * len(bottom), bottom)
    layer.backward(top, [True] * len(bottom), bottom)
    return ([t.data.copy() for t in top] + [b.diff.copy() for b in bottom]
            + [p.diff.copy() for p in layer.blobs])


@pytest.fixture
def conv_passes():
    """passes(layer, bottom, top, start=None): one forward and two backwards of a layer
    (the param diffs accumulate), every result copied, for comparing paths bit for bit."""
    return _passes
