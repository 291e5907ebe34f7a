"""Deconvolution: output size formula, forward against naive scatter loops, gradients."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from google.protobuf import text_format
from gradient_check import check_layer_gradients, make_layer

from mgcaffe.errors import LayerError
from mgcaffe.proto import caffe_pb2


def deconv_param(body: str, name: str = "deconv", n_top: int = 1) -> caffe_pb2.LayerParameter:
    tops = " ".join(f'top: "t{i}"' for i in range(n_top))
    text = (f'name: "{name}" type: "Deconvolution" {tops} convolution_param {{ {body} '
            'weight_filler { type: "gaussian" } bias_filler { type: "gaussian" } }')
    return text_format.Parse(text, caffe_pb2.LayerParameter())


def naive_deconv(x, w, b, stride, pad, dilation, group):
    """Each input cell scatters weight * value onto the output window it came from."""
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    o = og * group
    cg = c // group
    oh = stride[0] * (h - 1) + dilation[0] * (kh - 1) + 1 - 2 * pad[0]
    ow = stride[1] * (wd - 1) + dilation[1] * (kw - 1) + 1 - 2 * pad[1]
    out = np.zeros((n, o, oh, ow))
    for ni, ci, y, z, oo, i, j in itertools.product(range(n), range(c), range(h), range(wd),
                                                    range(og), range(kh), range(kw)):
        hi = y * stride[0] - pad[0] + i * dilation[0]
        wi = z * stride[1] - pad[1] + j * dilation[1]
        if 0 <= hi < oh and 0 <= wi < ow:
            out[ni, (ci // cg) * og + oo, hi, wi] += w[ci, oo, i, j] * x[ni, ci, y, z]
    if b is not None:
        out += b[None, :, None, None]
    return out


CASES = [
    # body, bottom shape, (kernel, stride, pad, dilation), group
    ("num_output: 3 kernel_size: 3", (2, 2, 4, 4), ((3, 3), (1, 1), (0, 0), (1, 1)), 1),
    ("num_output: 2 kernel_size: 4 stride: 2 pad: 1", (2, 3, 3, 4),
     ((4, 4), (2, 2), (1, 1), (1, 1)), 1),
    ("num_output: 4 kernel_size: 3 stride: 2 group: 2", (1, 4, 3, 3),
     ((3, 3), (2, 2), (0, 0), (1, 1)), 2),
    ("num_output: 2 kernel_h: 2 kernel_w: 3 stride_h: 3 stride_w: 1 pad_h: 1 pad_w: 1",
     (2, 1, 3, 4), ((2, 3), (3, 1), (1, 1), (1, 1)), 1),
    ("num_output: 6 kernel_size: 3 dilation: 2 pad: 1 group: 3 bias_term: false",
     (1, 3, 4, 3), ((3, 3), (1, 1), (1, 1), (2, 2)), 3),
]


@pytest.mark.parametrize("body,shape,geometry,group", CASES)
def test_forward_matches_naive(body, shape, geometry, group):
    layer, bottom, top = make_layer(deconv_param(body), [shape])
    kernel, stride, pad, dilation = geometry
    w = layer.blobs[0].data
    assert w.shape == (shape[1], layer.num_output // group) + kernel
    b = layer.blobs[1].data if len(layer.blobs) > 1 else None
    layer.forward(bottom, top)
    expected = naive_deconv(bottom[0].data, w, b, stride, pad, dilation, group)
    assert top[0].shape == expected.shape
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("body,shape,geometry,group", CASES)
def test_gradients(body, shape, geometry, group):
    layer, bottom, top = make_layer(deconv_param(body), [shape])
    check_layer_gradients(layer, bottom, top, max_checks=60)


@pytest.mark.parametrize("body,shape,out_hw", [
    ("num_output: 1 kernel_size: 4 stride: 2 pad: 1", (1, 1, 5, 5), (10, 10)),
    ("num_output: 1 kernel_size: 3 stride: 3 dilation: 2", (1, 1, 2, 3), (8, 11)),
    ("num_output: 1 kernel_h: 1 kernel_w: 5 stride_h: 1 stride_w: 4 pad_h: 0 pad_w: 2",
     (1, 1, 3, 3), (3, 9)),
])
def test_output_size(body, shape, out_hw):
    _, _, top = make_layer(deconv_param(body), [shape])
    assert top[0].shape[2:] == out_hw


def test_param_diffs_accumulate_and_bottom_diff_is_overwritten():
    layer, bottom, top = make_layer(deconv_param("num_output: 2 kernel_size: 3 stride: 2"),
                                    [(2, 2, 3, 3)])
    layer.forward(bottom, top)
    top[0].diff[...] = np.random.default_rng(5).standard_normal(top[0].shape)
    bottom[0].diff[...] = 9.0
    layer.backward(top, [True], bottom)
    first = [p.diff.copy() for p in layer.blobs]
    first_bottom = bottom[0].diff.copy()
    layer.backward(top, [True], bottom)
    for p, f in zip(layer.blobs, first):
        np.testing.assert_allclose(p.diff, 2 * f, rtol=1e-12)
    np.testing.assert_allclose(bottom[0].diff, first_bottom, rtol=1e-12)


def test_propagate_down_false_leaves_bottom_diff_alone():
    layer, bottom, top = make_layer(deconv_param("num_output: 2 kernel_size: 2"), [(1, 2, 3, 3)])
    layer.forward(bottom, top)
    top[0].diff[...] = 1.0
    bottom[0].diff[...] = 9.0
    layer.backward(top, [False], bottom)
    np.testing.assert_array_equal(bottom[0].diff, 9.0)
    assert np.abs(layer.blobs[0].diff).sum() > 0


def test_bilinear_upsampling_interpolates():
    # FCN's upsampling recipe: bilinear weights, stride f, kernel 2f - f % 2, pad ceil((f-1)/2).
    text = ('name: "up" type: "Deconvolution" convolution_param { num_output: 1 kernel_size: 4 '
            'stride: 2 pad: 1 bias_term: false weight_filler { type: "bilinear" } }')
    x = np.arange(16, dtype=np.float64).reshape(1, 1, 4, 4)
    layer, bottom, top = make_layer(text_format.Parse(text, caffe_pb2.LayerParameter()), [x])
    layer.forward(bottom, top)
    assert top[0].shape == (1, 1, 8, 8)
    # Interior cells lie a quarter of the way between input cells.
    np.testing.assert_allclose(top[0].data[0, 0, 2, 2], 0.75 * 0.75 * 5 + 0.75 * 0.25 * (4 + 1)
                               + 0.25 * 0.25 * 0)


def test_kernel_h_rejected_for_three_spatial_axes():
    with pytest.raises(LayerError, match="'d3'.*only be used for 2D"):
        make_layer(deconv_param("num_output: 2 kernel_h: 2 kernel_w: 2", name="d3"),
                   [(1, 1, 3, 3, 3)])
