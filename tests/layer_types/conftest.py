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
