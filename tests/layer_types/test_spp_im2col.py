"""SPP (pyramid bins against naive max/mean over each bin) and Im2col (against naive window
copies), with gradients."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from google.protobuf import text_format
from gradient_check import check_layer_gradients, make_layer

from mgcaffe.errors import LayerError
from mgcaffe.proto import caffe_pb2


def lp(text):
    return text_format.Parse(text, caffe_pb2.LayerParameter())


def naive_spp(x, levels, reduce):
    n, c, h, w = x.shape
    parts = []
    for level in range(levels):
        bins = 2 ** level
        kh, kw = math.ceil(h / bins), math.ceil(w / bins)
        ph, pw = (kh * bins - h + 1) // 2, (kw * bins - w + 1) // 2
        out = np.zeros((n, c, bins, bins))
        for i, j in itertools.product(range(bins), range(bins)):
            r0, c0 = i * kh - ph, j * kw - pw
            region = x[:, :, max(r0, 0):min(r0 + kh, h), max(c0, 0):min(c0 + kw, w)]
            out[:, :, i, j] = reduce(region.reshape(n, c, -1), axis=2)
        parts.append(out.reshape(n, -1))
    return np.concatenate(parts, axis=1)


@pytest.mark.parametrize("pool,shape,levels,reduce", [
    ("MAX", (2, 3, 5, 6), 2, np.max),
    ("MAX", (1, 2, 8, 8), 3, np.max),
    ("AVE", (2, 2, 4, 4), 3, np.mean),
])
def test_spp_forward_and_gradients(pool, shape, levels, reduce):
    layer, bottom, top = make_layer(
        lp(f'name: "spp" type: "SPP" spp_param {{ pyramid_height: {levels} pool: {pool} }}'),
        [shape])
    layer.forward(bottom, top)
    want = naive_spp(bottom[0].data, levels, reduce)
    assert top[0].shape == want.shape
    np.testing.assert_allclose(top[0].data, want, rtol=1e-12)
    check_layer_gradients(layer, bottom, top)


def test_spp_height_one_keeps_the_pooling_shape_and_follows_reshape():
    layer, bottom, top = make_layer(lp('name: "spp" type: "SPP" spp_param { pyramid_height: 1 }'),
                                    [(2, 3, 4, 5)])
    assert top[0].shape == (2, 3, 1, 1)
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data[:, :, 0, 0], bottom[0].data.max(axis=(2, 3)))
    bottom[0].reshape((1, 3, 7, 3))
    bottom[0].data[...] = np.random.default_rng(0).standard_normal((1, 3, 7, 3))
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data[:, :, 0, 0], bottom[0].data.max(axis=(2, 3)))


def test_spp_needs_4_axes():
    with pytest.raises(LayerError, match="4 axes"):
        make_layer(lp('name: "spp" type: "SPP" spp_param { pyramid_height: 2 }'), [(2, 3, 4)])


def naive_im2col(x, k, p, s, d):
    """Per item: rows (c, offsets), columns the output positions (Caffe's column buffer)."""
    n, c, *spatial = x.shape
    out = [(sz + 2 * pp - (dd * (kk - 1) + 1)) // ss + 1
           for sz, kk, pp, ss, dd in zip(spatial, k, p, s, d)]
    cols = np.zeros((n, c * math.prod(k), *out))
    for ni, ci in itertools.product(range(n), range(c)):
        for ko, offs in enumerate(itertools.product(*(range(kk) for kk in k))):
            for pos in itertools.product(*(range(m) for m in out)):
                idx = [q * ss - pp + o * dd for q, ss, pp, o, dd in zip(pos, s, p, offs, d)]
                if all(0 <= i < sz for i, sz in zip(idx, spatial)):
                    cols[(ni, ci * math.prod(k) + ko) + pos] = x[(ni, ci) + tuple(idx)]
    return cols


@pytest.mark.parametrize("body,shape,geom", [
    ("kernel_size: 3 pad: 1 stride: 2", (2, 2, 5, 6), ((3, 3), (1, 1), (2, 2), (1, 1))),
    ("kernel_h: 2 kernel_w: 3 dilation: 2", (1, 3, 6, 7), ((2, 3), (0, 0), (1, 1), (2, 2))),
    ("kernel_size: 2 stride: 1", (2, 2, 5), ((2,), (0,), (1,), (1,))),
    ("kernel_size: 2 pad: 1 stride: 2", (1, 2, 3, 4, 3), ((2, 2, 2), (1, 1, 1), (2, 2, 2),
                                                         (1, 1, 1))),
])
def test_im2col_forward_and_gradients(body, shape, geom):
    layer, bottom, top = make_layer(
        lp(f'name: "i2c" type: "Im2col" convolution_param {{ {body} }}'), [shape])
    layer.forward(bottom, top)
    want = naive_im2col(bottom[0].data, *geom)
    assert top[0].shape == want.shape
    np.testing.assert_allclose(top[0].data, want)
    check_layer_gradients(layer, bottom, top)
