"""N-D Convolution and Deconvolution (1-D, 3-D): forward against naive loops, gradients."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from google.protobuf import text_format
from gradient_check import check_layer_gradients, make_layer

from mgcaffe.kernels.im2col_nd import col2im_nd, im2col_nd
from mgcaffe.proto import caffe_pb2


def param(kind, body):
    text = (f'name: "c" type: "{kind}" convolution_param {{ {body} '
            'weight_filler { type: "gaussian" } bias_filler { type: "gaussian" } }')
    return text_format.Parse(text, caffe_pb2.LayerParameter())


def geometry(layer):
    return layer.kernel, layer.pad, layer.stride, layer.dilation


def naive_conv(x, w, b, kernel, pad, stride, dilation, group):
    n, c, *spatial = x.shape
    o = w.shape[0]
    out = [(s + 2 * p - (d * (k - 1) + 1)) // st + 1
           for s, k, p, st, d in zip(spatial, kernel, pad, stride, dilation)]
    y = np.zeros((n, o, *out))
    cg, og = c // group, o // group
    for ni, oi in itertools.product(range(n), range(o)):
        g = oi // og
        for pos in itertools.product(*(range(m) for m in out)):
            total = b[oi]
            for ci, offs in itertools.product(range(cg), itertools.product(
                    *(range(k) for k in kernel))):
                idx = [q * st - p + k * d for q, st, p, k, d in
                       zip(pos, stride, pad, offs, dilation)]
                if all(0 <= i < s for i, s in zip(idx, spatial)):
                    total += w[(oi, ci) + offs] * x[(ni, g * cg + ci) + tuple(idx)]
            y[(ni, oi) + pos] = total
    return y


def naive_deconv(x, w, b, kernel, pad, stride, dilation, group):
    """Each input value scatters weight * value into the output (Caffe's deconvolution)."""
    n, c, *spatial = x.shape
    og = w.shape[1]
    o = og * group
    out = [st * (s - 1) + d * (k - 1) + 1 - 2 * p
           for s, k, p, st, d in zip(spatial, kernel, pad, stride, dilation)]
    y = np.zeros((n, o, *out)) + b.reshape((1, -1) + (1,) * len(out))
    cg = c // group
    for ni, ci in itertools.product(range(n), range(c)):
        g = ci // cg
        for pos in itertools.product(*(range(m) for m in spatial)):
            for oj, offs in itertools.product(range(og), itertools.product(
                    *(range(k) for k in kernel))):
                idx = [q * st - p + k * d for q, st, p, k, d in
                       zip(pos, stride, pad, offs, dilation)]
                if all(0 <= i < s for i, s in zip(idx, out)):
                    y[(ni, g * og + oj) + tuple(idx)] += w[(ci, oj) + offs] * x[(ni, ci) + pos]
    return y


CASES = [
    ("num_output: 4 kernel_size: 3", (2, 3, 7)),
    ("num_output: 2 kernel_size: 2 stride: 2 pad: 1 dilation: 1", (2, 2, 6)),
    ("num_output: 4 kernel_size: 2 group: 2 dilation: 2", (1, 4, 7)),
    ("num_output: 3 kernel_size: 2", (2, 2, 3, 4, 3)),
    ("num_output: 2 kernel_size: 3 kernel_size: 1 kernel_size: 2 stride: 2 stride: 1 stride: 1 "
     "pad: 1 pad: 0 pad: 1", (1, 3, 5, 3, 4)),
    ("num_output: 4 kernel_size: 2 group: 2 dilation: 2 pad: 1", (1, 2, 4, 4, 5)),
]


@pytest.mark.parametrize("kind,naive", [("Convolution", naive_conv),
                                        ("Deconvolution", naive_deconv)])
@pytest.mark.parametrize("body,shape", CASES)
def test_nd_forward_and_gradients(kind, naive, body, shape):
    layer, bottom, top = make_layer(param(kind, body), [shape])
    assert layer.nd
    layer.forward(bottom, top)
    want = naive(bottom[0].data, layer.blobs[0].data, layer.blobs[1].data, *geometry(layer),
                 layer.group)
    assert top[0].shape == want.shape
    np.testing.assert_allclose(top[0].data, want, rtol=1e-10, atol=1e-12)
    check_layer_gradients(layer, bottom, top, max_checks=40)


def test_nd_matches_the_2d_path_on_a_2d_problem_made_3d():
    """A 3-D convolution with a depth-1 kernel on a depth-1 input is the 2-D convolution."""
    x = np.random.default_rng(3).standard_normal((2, 3, 1, 5, 6))
    nd, b3, t3 = make_layer(param("Convolution", "num_output: 4 kernel_size: 1 kernel_size: 3 "
                                  "kernel_size: 2 pad: 0 pad: 1 pad: 0"), [x])
    flat, b2, t2 = make_layer(param("Convolution", "num_output: 4 kernel_h: 3 kernel_w: 2 "
                                    "pad_h: 1 pad_w: 0"), [x[:, :, 0]])
    flat.blobs[0].data[...] = nd.blobs[0].data[:, :, 0]
    flat.blobs[1].data[...] = nd.blobs[1].data
    nd.forward(b3, t3)
    flat.forward(b2, t2)
    np.testing.assert_allclose(t3[0].data[:, :, 0], t2[0].data, rtol=1e-12)


def test_col2im_nd_is_the_adjoint_of_im2col_nd():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 2, 5, 4, 3))
    geom = ((2, 3, 1), (1, 0, 1), (2, 1, 1), (1, 1, 2))
    cols = im2col_nd(x, *geom)
    r = rng.standard_normal(cols.shape)
    np.testing.assert_allclose((cols * r).sum(), (x * col2im_nd(r, x.shape[2:], *geom)).sum(),
                               rtol=1e-12)
