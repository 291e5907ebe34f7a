"""Convolution: shapes, forward against naive loops, gradients, accumulation, errors."""

from __future__ import annotations

import numpy as np
import pytest
from conv_layers import conv_rules
from google.protobuf import text_format
from gradient_check import check_layer_gradients, make_layer

from mgcaffe.errors import LayerError
from mgcaffe.proto import caffe_pb2


def conv_param(body: str, name: str = "conv", n_top: int = 1) -> caffe_pb2.LayerParameter:
    tops = " ".join(f'top: "t{i}"' for i in range(n_top))
    text = (f'name: "{name}" type: "Convolution" {tops} convolution_param {{ {body} '
            'weight_filler { type: "gaussian" } bias_filler { type: "gaussian" } }')
    return text_format.Parse(text, caffe_pb2.LayerParameter())


@pytest.fixture(params=["in GEMM", "scratch and add"])
def rules(request):
    """Rules that run a test with the weight gradient added inside the GEMM (beta = 1) and
    with a scratch product and an add (Convolution picks one per weight shape)."""
    return conv_rules(weight_diff_in_gemm=request.param == "in GEMM",
                      weight_diff_in_gemm_from=0)


CASES = [
    # body, bottom shape, (kernel, stride, pad, dilation), group
    ("num_output: 3 kernel_size: 3", (2, 2, 5, 5), ((3, 3), (1, 1), (0, 0), (1, 1)), 1),
    ("num_output: 4 kernel_size: 3 pad: 1 stride: 2 group: 2", (2, 4, 6, 5),
     ((3, 3), (2, 2), (1, 1), (1, 1)), 2),
    ("num_output: 2 kernel_h: 2 kernel_w: 3 stride_h: 1 stride_w: 2 pad_h: 1 pad_w: 0",
     (1, 3, 5, 7), ((2, 3), (1, 2), (1, 0), (1, 1)), 1),
    ("num_output: 3 kernel_size: 3 dilation: 2 pad: 2", (2, 3, 6, 6),
     ((3, 3), (1, 1), (2, 2), (2, 2)), 1),
    ("num_output: 6 kernel_size: 2 kernel_size: 3 stride: 2 stride: 1 pad: 0 pad: 1 "
     "dilation: 1 dilation: 2 group: 3", (2, 3, 7, 6), ((2, 3), (2, 1), (0, 1), (1, 2)), 3),
    ("num_output: 4 kernel_size: 1 bias_term: false", (3, 5, 3, 4),
     ((1, 1), (1, 1), (0, 0), (1, 1)), 1),
    ("num_output: 4 kernel_size: 1 stride: 2 group: 2", (2, 4, 5, 6),
     ((1, 1), (2, 2), (0, 0), (1, 1)), 2),
]


#: Rules that put every layer of the tests below on one GEMM layout; "direct" is the 1x1
#: path (other kernels then run whole batch).
NEVER = 10**9
LAYOUTS = {
    "whole batch": dict(direct_from=NEVER, per_sample_from=NEVER,
                        per_sample_from_pointwise=NEVER, per_sample_upto_rows=0,
                        batch_last_upto=0),
    "per sample": dict(direct_from=NEVER, per_sample_from=1, per_sample_from_pointwise=1,
                       batch_last_upto=0),
    "batch last": dict(direct_from=NEVER, per_sample_from=NEVER,
                       per_sample_from_pointwise=NEVER, per_sample_upto_rows=0,
                       batch_last_upto=NEVER),
    "direct": dict(direct_from=0, per_sample_from=NEVER, per_sample_from_pointwise=NEVER,
                   per_sample_upto_rows=0, batch_last_upto=0),
}
PATH_OF = {"whole batch": "im2col-whole-batch", "per sample": "im2col-per-sample",
           "batch last": "im2col-batch-last", "direct": "direct"}


@pytest.fixture(params=list(LAYOUTS))
def gemm_layout(request, rules):
    """(layout, rules) for each of Convolution's GEMM layouts, with each weight gradient
    way."""
    return request.param, conv_rules(rules, **LAYOUTS[request.param])


@pytest.mark.parametrize("body,shape,geometry,group", CASES)
def test_forward_matches_naive(body, shape, geometry, group, gemm_layout, naive_conv):
    layout, rules = gemm_layout
    layer, bottom, top = make_layer(conv_param(body), [shape], rules=rules)
    kernel, stride, pad, dilation = geometry
    pointwise = kernel == (1, 1) and pad == (0, 0) and dilation == (1, 1)
    direct = layout == "direct" and pointwise
    assert layer.choice.path == ("direct" if direct else
                                 PATH_OF["whole batch" if layout == "direct" else layout])
    w = layer.blobs[0].data
    b = layer.blobs[1].data if len(layer.blobs) > 1 else None
    assert w.shape == (layer.num_output, shape[1] // group) + kernel
    layer.forward(bottom, top)
    expected = naive_conv(bottom[0].data, w, b, stride, pad, dilation, group)
    assert top[0].shape == expected.shape
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("body,shape,geometry,group", CASES)
def test_gradients(body, shape, geometry, group, gemm_layout):
    layer, bottom, top = make_layer(conv_param(body), [shape], rules=gemm_layout[1])
    check_layer_gradients(layer, bottom, top, max_checks=60)


def test_layout_follows_output_size(rules, naive_conv):
    # The real thresholds: large outputs go per sample; 1x1 convolutions (pad 0, dilation 1,
    # any stride) with 14x14 outputs or more run as direct GEMMs on their input. (The
    # few-row rule is off here: these 1-channel layers would all qualify; see below.)
    rules = conv_rules(rules, per_sample_upto_rows=0)
    cases = [("num_output: 2 kernel_size: 3 pad: 1", (1, 1, 46, 46), "per sample"),
             ("num_output: 2 kernel_size: 3 pad: 1", (1, 1, 44, 44), "whole batch"),
             # at most 256 positions: batch last
             ("num_output: 2 kernel_size: 1", (1, 1, 14, 14), "direct"),
             ("num_output: 2 kernel_size: 1", (1, 1, 7, 7), "batch last"),
             ("num_output: 2 kernel_size: 1 stride: 2", (1, 1, 28, 28), "direct"),
             ("num_output: 2 kernel_size: 1 stride: 2", (1, 1, 26, 26), "batch last"),
             ("num_output: 2 kernel_size: 1 pad: 1", (1, 1, 14, 14), "batch last"),
             ("num_output: 2 kernel_size: 1 dilation: 2", (1, 1, 14, 14), "per sample")]
    for body, shape, layout in cases:
        layer, bottom, top = make_layer(conv_param(body), [shape], rules=rules)
        assert layer.choice.path == PATH_OF[layout], (body, shape)
        layer.forward(bottom, top)
        expected = naive_conv(bottom[0].data, layer.blobs[0].data, layer.blobs[1].data,
                              layer.stride, layer.pad, layer.dilation, 1)
        np.testing.assert_allclose(top[0].data, expected, rtol=1e-10)


@pytest.mark.parametrize("shape, layout", [((2, 1, 16, 16), "batch last"),
                                           ((2, 1, 17, 17), "whole batch"),
                                           ((2, 1, 46, 46), "per sample")])
def test_small_planes_use_the_batch_last_layout(shape, layout, rules):
    layer, bottom, top = make_layer(conv_param("num_output: 2 kernel_size: 3 pad: 1"), [shape],
                                    rules=conv_rules(rules, per_sample_upto_rows=0))  # as above
    assert layer.choice.path == PATH_OF[layout]


@pytest.mark.parametrize("body, shape, per_sample", [
    ("kernel_size: 5", (2, 1, 20, 20), True),          # 25 rows, 16x16 outputs
    ("kernel_size: 3 pad: 1", (2, 3, 16, 16), True),   # 27 rows, 16x16
    ("kernel_size: 3 pad: 1", (2, 3, 15, 15), False),  # 27 rows, 15x15: too few outputs
    ("kernel_size: 3 pad: 1", (2, 4, 16, 16), False),  # 36 rows
    ("kernel_size: 3 pad: 1 group: 2", (2, 6, 16, 16), True),  # 27 rows per group
])
def test_few_row_kernels_go_per_sample_from_256_outputs(body, shape, per_sample, naive_conv,
                                                        rules):
    layer, bottom, top = make_layer(conv_param(f"num_output: 2 {body}"), [shape], rules=rules)
    assert (layer.choice.path == "im2col-per-sample") is per_sample
    layer.forward(bottom, top)
    expected = naive_conv(bottom[0].data, layer.blobs[0].data, layer.blobs[1].data,
                          layer.stride, layer.pad, layer.dilation, layer.group)
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-10, atol=1e-10)


def test_float32_forward(naive_conv, rules):
    layer, bottom, top = make_layer(conv_param("num_output: 4 kernel_size: 3 pad: 1 group: 2"),
                                    [(2, 4, 5, 5)], dtype=np.float32, rules=rules)
    layer.forward(bottom, top)
    assert top[0].data.dtype == np.float32
    w, b = layer.blobs[0].data, layer.blobs[1].data
    expected = naive_conv(bottom[0].data.astype(np.float64), w, b, (1, 1), (1, 1), (1, 1), 2)
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("body,shape,out_shape", [
    ("num_output: 7 kernel_size: 3", (2, 3, 10, 9), (2, 7, 8, 7)),
    ("num_output: 5 kernel_size: 3 stride: 2 pad: 1", (1, 2, 8, 8), (1, 5, 4, 4)),
    ("num_output: 2 kernel_h: 7 kernel_w: 1 pad_h: 3 pad_w: 0", (1, 1, 9, 4), (1, 2, 9, 4)),
    ("num_output: 2 kernel_size: 3 dilation: 3", (1, 1, 9, 10), (1, 2, 3, 4)),
    ("num_output: 64 kernel_size: 7 stride: 2 pad: 3", (1, 3, 224, 224), (1, 64, 112, 112)),
])
def test_shapes(body, shape, out_shape, rules):
    _, _, top = make_layer(conv_param(body), [shape], rules=rules)
    assert top[0].shape == out_shape


def test_axis_puts_batch_axes_before_the_channel_axis(gemm_layout, naive_conv):
    # axis 2 on a 5-D bottom: axes 0 and 1 are both batch axes.
    body = "num_output: 3 kernel_size: 2 axis: 2"
    layer, bottom, top = make_layer(conv_param(body), [(2, 3, 2, 4, 5)], rules=gemm_layout[1])
    assert top[0].shape == (2, 3, 3, 3, 4)
    layer.forward(bottom, top)
    x = bottom[0].data.reshape(6, 2, 4, 5)
    expected = naive_conv(x, layer.blobs[0].data, layer.blobs[1].data, (1, 1), (0, 0),
                          (1, 1), 1)
    np.testing.assert_allclose(top[0].data.reshape(expected.shape), expected, rtol=1e-10)
    check_layer_gradients(layer, bottom, top, max_checks=40)


def test_several_bottoms_share_the_weights(gemm_layout, naive_conv):
    param = conv_param("num_output: 2 kernel_size: 3 pad: 1", n_top=2)
    layer, bottom, top = make_layer(param, [(1, 2, 4, 4), (1, 2, 4, 4)], seed=3,
                                    rules=gemm_layout[1])
    layer.forward(bottom, top)
    for b, t in zip(bottom, top):
        expected = naive_conv(b.data, layer.blobs[0].data, layer.blobs[1].data, (1, 1), (1, 1),
                              (1, 1), 1)
        np.testing.assert_allclose(t.data, expected, rtol=1e-10)
    check_layer_gradients(layer, bottom, top, max_checks=30)


def run_backward(layer, bottom, top, propagate_down):
    layer.forward(bottom, top)
    top[0].diff[...] = np.random.default_rng(5).standard_normal(top[0].shape)
    layer.backward(top, propagate_down, bottom)


def test_param_diffs_accumulate_and_bottom_diff_is_overwritten(gemm_layout):
    layer, bottom, top = make_layer(conv_param("num_output: 3 kernel_size: 3 pad: 1 group: 1"),
                                    [(2, 2, 5, 5)], rules=gemm_layout[1])
    bottom[0].diff[...] = 7.0
    run_backward(layer, bottom, top, [True])
    first = [p.diff.copy() for p in layer.blobs]
    first_bottom = bottom[0].diff.copy()
    assert np.abs(first[0]).sum() > 0 and np.abs(first[1]).sum() > 0
    layer.backward(top, [True], bottom)
    for p, f in zip(layer.blobs, first):
        np.testing.assert_allclose(p.diff, 2 * f, rtol=1e-12)
    np.testing.assert_allclose(bottom[0].diff, first_bottom, rtol=1e-12)
    # A bottom diff written once must not depend on its stale contents.
    bottom[0].diff[...] = 0.0
    layer.backward(top, [True], bottom)
    np.testing.assert_allclose(bottom[0].diff, first_bottom, rtol=1e-12)


def test_propagate_down_false_leaves_bottom_diff_alone(gemm_layout):
    layer, bottom, top = make_layer(conv_param("num_output: 3 kernel_size: 3"), [(2, 2, 5, 5)],
                                    rules=gemm_layout[1])
    bottom[0].diff[...] = 7.0
    run_backward(layer, bottom, top, [False])
    np.testing.assert_array_equal(bottom[0].diff, 7.0)
    assert np.abs(layer.blobs[0].diff).sum() > 0


def test_param_propagate_down_false_leaves_param_diffs_alone(rules):
    layer, bottom, top = make_layer(conv_param("num_output: 3 kernel_size: 3"), [(2, 2, 5, 5)],
                                    rules=rules)
    layer.param_propagate_down = [False, False]
    run_backward(layer, bottom, top, [True])
    assert all(np.all(p.diff == 0) for p in layer.blobs)
    assert np.abs(bottom[0].diff).sum() > 0


def test_fillers_and_defaults(rules):
    text = ('name: "c" type: "Convolution" convolution_param { num_output: 2 kernel_size: 1 '
            'weight_filler { type: "constant" value: 0.5 } }')
    layer, _, _ = make_layer(text_format.Parse(text, caffe_pb2.LayerParameter()),
                             [(1, 3, 2, 2)])
    np.testing.assert_array_equal(layer.blobs[0].data, 0.5)
    np.testing.assert_array_equal(layer.blobs[1].data, 0.0)  # Caffe's default: constant 0


@pytest.mark.parametrize("body,shape,message", [
    ("num_output: 2 kernel_h: 3 kernel_w: 3", (1, 2, 5, 5, 5), "only be used for 2D"),
    ("num_output: 2 kernel_size: 3 axis: 1", (2, 5), "at least 1 spatial axis"),
    ("num_output: 3 kernel_size: 3 group: 2", (1, 4, 5, 5), "group 2 must divide"),
    ("num_output: 2 kernel_size: 3 kernel_h: 3 kernel_w: 3", (1, 1, 5, 5), "not both"),
    ("num_output: 2 kernel_h: 3", (1, 1, 5, 5), "must be given together"),
    ("num_output: 2", (1, 1, 5, 5), "kernel_size .* is required"),
    ("num_output: 2 kernel_size: 3 kernel_size: 3 kernel_size: 3", (1, 1, 5, 5), "once per"),
    ("num_output: 2 kernel_size: 7", (1, 1, 5, 5), "empty output"),
    ("kernel_size: 3", (1, 1, 5, 5), "num_output must be positive"),
    ("num_output: 2 kernel_size: 3 stride: 0", (1, 1, 5, 5), "stride dimensions"),
])
def test_errors_name_the_layer(body, shape, message, rules):
    with pytest.raises(LayerError, match=message) as info:
        make_layer(conv_param(body, name="bad_conv"), [shape], rules=rules)
    assert "bad_conv" in str(info.value)


def test_loaded_blobs_are_kept_and_checked():
    from mgcaffe.blob import Blob
    from mgcaffe.layer_types import LayerContext, create_layer

    param = conv_param("num_output: 2 kernel_size: 3")
    layer = create_layer(param, LayerContext(dtype=np.float64))
    weight = Blob((2, 1, 3, 3), dtype=np.float64)
    weight.data[...] = 1.5
    layer.blobs = [weight, Blob((2,), dtype=np.float64)]
    bottom, top = [Blob((1, 1, 4, 4), dtype=np.float64)], [Blob((), dtype=np.float64)]
    layer.setup(bottom, top)
    np.testing.assert_array_equal(layer.blobs[0].data, 1.5)
    layer = create_layer(param, LayerContext(dtype=np.float64))
    layer.blobs = [Blob((2, 1, 2, 2), dtype=np.float64), Blob((2,), dtype=np.float64)]
    with pytest.raises(LayerError, match="expected parameter blobs"):
        layer.setup(bottom, top)


def test_reshape_follows_new_input_shapes(naive_conv, rules):
    layer, bottom, top = make_layer(conv_param("num_output: 2 kernel_size: 3 pad: 1"),
                                    [(1, 2, 4, 4)], rules=rules)
    bottom[0].reshape(3, 2, 6, 5)
    bottom[0].data[...] = np.random.default_rng(4).standard_normal((3, 2, 6, 5))
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    expected = naive_conv(bottom[0].data, layer.blobs[0].data, layer.blobs[1].data, (1, 1),
                          (1, 1), (1, 1), 1)
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-10)
    bottom[0].reshape(1, 3, 6, 5)
    with pytest.raises(LayerError, match="2 channels"):
        layer.reshape(bottom, top)


def test_weight_gradient_goes_into_the_gemm_for_tall_or_large_weights():
    rules = conv_rules(weight_diff_in_gemm=True, weight_diff_in_gemm_from=1000)
    cases = [("num_output: 8 kernel_size: 1", (1, 4, 3, 3), True),      # 8 x 4: tall
             ("num_output: 4 kernel_size: 1", (1, 8, 3, 3), False),     # 4 x 8: wide, small
             ("num_output: 10 kernel_size: 3", (1, 8, 5, 5), False),    # 10 x 72 < 1000
             ("num_output: 20 kernel_size: 3", (1, 8, 5, 5), True),     # 20 x 72 >= 1000
             ("num_output: 8 kernel_size: 1 group: 2", (1, 16, 3, 3), False)]  # 4 x 8 a group
    for body, shape, expected in cases:
        layer, bottom, top = make_layer(conv_param(body), [shape], rules=rules)
        assert layer.choice.option("weight_diff_in_gemm") == expected, body
    layer, bottom, top = make_layer(conv_param(cases[0][0]), [cases[0][1]],
                                    rules=conv_rules(rules, weight_diff_in_gemm=False))
    assert not layer.choice.option("weight_diff_in_gemm")


def test_the_path_shows_in_the_repr(rules):
    layer, _, _ = make_layer(conv_param("num_output: 2 kernel_size: 3 pad: 1", name="c1"),
                             [(2, 1, 4, 4)], rules=rules)
    assert repr(layer) == "<Convolution 'c1' path=im2col-batch-last>"
