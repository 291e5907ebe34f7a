"""Convolution's direct 1x1 path (kernel 1, pad 0, dilation 1; any stride): forward against
a naive loop, float64 central-difference gradients, param-diff accumulation, groups, bias."""

from __future__ import annotations

import numpy as np
import pytest
from conv_layers import conv_rules
from google.protobuf import text_format
from gradient_check import check_layer_gradients, make_layer

from mgcaffe.proto import caffe_pb2


@pytest.fixture(params=["in GEMM", "scratch and add"])
def rules(request):
    """Every 1x1 convolution on the direct path, whatever its plane size; each test with
    the weight gradient added inside the GEMM (beta = 1) and with a scratch product and an
    add (Convolution picks one per weight shape)."""
    return conv_rules(direct_from=0, weight_diff_in_gemm=request.param == "in GEMM",
                      weight_diff_in_gemm_from=0)


def conv_param(body: str) -> caffe_pb2.LayerParameter:
    text = ('name: "pw" type: "Convolution" top: "t" convolution_param { ' + body +
            ' weight_filler { type: "gaussian" } bias_filler { type: "gaussian" } }')
    return text_format.Parse(text, caffe_pb2.LayerParameter())


# body, bottom shape, stride, group
CASES = [
    ("num_output: 4 kernel_size: 1", (2, 3, 4, 5), (1, 1), 1),
    ("num_output: 4 kernel_size: 1 bias_term: false", (2, 3, 4, 5), (1, 1), 1),
    ("num_output: 6 kernel_size: 1 group: 3", (2, 6, 3, 4), (1, 1), 3),
    ("num_output: 4 kernel_size: 1 stride: 2", (2, 3, 5, 6), (2, 2), 1),
    ("num_output: 4 kernel_size: 1 stride: 2 group: 2 bias_term: false", (3, 4, 6, 5),
     (2, 2), 2),
    ("num_output: 3 kernel_size: 1 stride_h: 1 stride_w: 3", (2, 2, 4, 7), (1, 3), 1),
]


@pytest.mark.parametrize("body,shape,stride,group", CASES)
def test_forward_matches_naive(body, shape, stride, group, naive_conv, rules):
    layer, bottom, top = make_layer(conv_param(body), [shape], rules=rules)
    assert layer.choice.path == "direct"
    layer.forward(bottom, top)
    b = layer.blobs[1].data if len(layer.blobs) > 1 else None
    expected = naive_conv(bottom[0].data, layer.blobs[0].data, b, stride, (0, 0), (1, 1),
                          group)
    assert top[0].shape == expected.shape
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("body,shape,stride,group", CASES)
def test_gradients_match_central_differences(body, shape, stride, group, rules):
    """Every element of the bottom, weight and bias, against (f(x+e) - f(x-e)) / 2e of the
    objective sum(top * R) in float64."""
    layer, bottom, top = make_layer(conv_param(body), [shape], rules=rules)
    # every element, from stale diffs (lazily cleared NaN params, junk bottom diffs)
    check_layer_gradients(layer, bottom, top, eps=1e-6, rtol=1e-6, atol=1e-7,
                          max_checks=10**6)


@pytest.mark.parametrize("body,shape,stride,group", CASES[::2] + CASES[3:5])
def test_param_diffs_accumulate_over_two_backwards(body, shape, stride, group, rules):
    layer, bottom, top = make_layer(conv_param(body), [shape], rules=rules)
    layer.forward(bottom, top)
    top[0].diff[...] = np.random.default_rng(3).standard_normal(top[0].shape)
    start = [np.random.default_rng(4 + i).standard_normal(p.shape)
             for i, p in enumerate(layer.blobs)]
    for p, s in zip(layer.blobs, start):
        p.diff[...] = s
    layer.backward(top, [True], bottom)
    first_bottom = bottom[0].diff.copy()
    layer.backward(top, [True], bottom)
    # The weight gradient by hand: sum over samples and positions of dtop * x (subsampled).
    x = bottom[0].data[:, :, ::stride[0], ::stride[1]]
    n, c = x.shape[:2]
    o = top[0].shape[1]
    dy = top[0].diff.reshape(n, group, o // group, -1)
    xs = x.reshape(n, group, c // group, -1)
    grad_w = np.einsum("ngop,ngcp->goc", dy, xs).reshape(layer.blobs[0].shape)
    np.testing.assert_allclose(layer.blobs[0].diff, start[0] + 2 * grad_w, rtol=1e-12)
    if len(layer.blobs) > 1:
        grad_b = top[0].diff.sum(axis=(0, 2, 3))
        np.testing.assert_allclose(layer.blobs[1].diff, start[1] + 2 * grad_b, rtol=1e-12)
    np.testing.assert_allclose(bottom[0].diff, first_bottom, rtol=1e-12)


def test_strided_bottom_diff_is_zero_off_the_sampled_grid(rules):
    layer, bottom, top = make_layer(conv_param("num_output: 2 kernel_size: 1 stride: 2"),
                                    [(1, 2, 5, 5)], rules=rules)
    layer.forward(bottom, top)
    top[0].diff[...] = 1.0
    bottom[0].diff[...] = 9.0
    layer.backward(top, [True], bottom)
    mask = np.zeros((5, 5), bool)
    mask[::2, ::2] = True
    assert np.all(bottom[0].diff[:, :, ~mask] == 0)
    expected = layer.blobs[0].data[:, :, 0, 0].sum(axis=0)  # sum over outputs of w[o, c]
    np.testing.assert_allclose(bottom[0].diff[0][:, mask],
                               np.repeat(expected[:, None], mask.sum(), axis=1), rtol=1e-12)


def test_float32_matches_float64(rules):
    body = "num_output: 8 kernel_size: 1 stride: 2 group: 2"
    l64, b64, t64 = make_layer(conv_param(body), [(2, 4, 7, 6)], rules=rules)
    l32, b32, t32 = make_layer(conv_param(body), [(2, 4, 7, 6)], dtype=np.float32, rules=rules)
    for p32, p64 in zip(l32.blobs, l64.blobs):
        p32.data[...] = p64.data
    b32[0].data[...] = b64[0].data
    for layer, bottom, top in ((l64, b64, t64), (l32, b32, t32)):
        layer.forward(bottom, top)
        top[0].diff[...] = np.arange(top[0].count).reshape(top[0].shape) % 5 - 2.0
        for p in layer.blobs:
            p.diff[...] = 0
        layer.backward(top, [True], bottom)
    np.testing.assert_allclose(t32[0].data, t64[0].data, rtol=1e-4, atol=1e-5)
    for p32, p64 in zip(l32.blobs, l64.blobs):
        np.testing.assert_allclose(p32.diff, p64.diff, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(b32[0].diff, b64[0].diff, rtol=1e-4, atol=1e-5)
