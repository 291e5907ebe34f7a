"""Convolution's shifted-GEMM path (kernels.shift_conv, no column matrix): forward against a
naive loop, float64 central-difference gradients from stale diffs, the same numbers as the
im2col path, bit-identical on any thread count, and the rule that picks it."""

from __future__ import annotations

import numpy as np
import pytest
from conv_layers import threaded_conv
from gradient_check import check_layer_gradients

from mgcaffe.kernels import shift_conv
from mgcaffe.layer_types.choice.convolution import ConvolutionRules

# body, bottom shape (N, C, H, W): pad 0/1/2, kernels 1..5 and non-square, groups, bias
# off, dilation, batch 1 and 3.
CASES = [
    ("num_output: 4 kernel_size: 3 pad: 1", (3, 2, 5, 4)),
    ("num_output: 3 kernel_size: 5 pad: 2 bias_term: false", (1, 3, 6, 7)),
    ("num_output: 4 kernel_h: 2 kernel_w: 4 pad_h: 0 pad_w: 2 group: 2", (3, 4, 5, 5)),
    ("num_output: 2 kernel_h: 1 kernel_w: 3 pad: 0", (1, 2, 4, 6)),
    ("num_output: 3 kernel_size: 1 pad: 1", (3, 2, 3, 3)),
    ("num_output: 6 kernel_size: 3 pad: 2 group: 3 bias_term: false", (1, 6, 4, 5)),
    ("num_output: 3 kernel_size: 2 dilation: 2 pad: 1", (3, 2, 5, 6)),
    ("num_output: 2 kernel_h: 4 kernel_w: 2 pad_h: 1 pad_w: 0", (3, 3, 6, 4)),
]


def build(body, shape, shift=True, stack=True, threads=2, dtype=np.float64, seed=0,
          bottoms=1, keep=True):
    """A layer forced onto (or off) the shifted path (conv_layers.threaded_conv)."""
    rules = {"shift_gemm": shift, "shift_stack": stack, "shift_keep_input": keep}
    layer, bottom, top = threaded_conv(body, shape, rules, threads, dtype, seed, bottoms)
    if shift is not None:
        assert (layer.choice.path == "shift") == shift
    return layer, bottom, top


@pytest.mark.parametrize("stack", [True, False], ids=["stacked", "per offset"])
@pytest.mark.parametrize("body,shape", CASES)
def test_forward_matches_naive(body, shape, stack, naive_conv):
    layer, bottom, top = build(body, shape, stack=stack)
    layer.forward(bottom, top)
    b = layer.blobs[1].data if layer.bias_term else None
    expected = naive_conv(bottom[0].data, layer.blobs[0].data, b, layer.stride, layer.pad,
                          layer.dilation, layer.group)
    assert top[0].shape == expected.shape
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("stack,keep", [(True, True), (False, True), (True, False)],
                         ids=["stacked", "per offset", "rebuilt in backward"])
@pytest.mark.parametrize("body,shape", CASES)
def test_gradients_match_central_differences(body, shape, stack, keep):
    """Bottom, weight and bias against central differences in float64, from stale diffs
    (lazily cleared NaN params, junk bottom diffs: both must be overwritten)."""
    layer, bottom, top = build(body, shape, stack=stack, keep=keep)
    check_layer_gradients(layer, bottom, top, eps=1e-6, rtol=1e-6, atol=1e-7, max_checks=60)


# A full output long enough for several column blocks and reduction parts (8712 positions).
WIDE = ("num_output: 5 kernel_size: 3 pad: 1", (2, 3, 64, 64))


@pytest.mark.parametrize("body,shape", CASES[:3] + [WIDE])
def test_same_numbers_as_the_im2col_path_and_on_any_thread_count(body, shape, conv_passes):
    """float32, two bottoms: within rounding of the im2col path; bit for bit on 1, 2 and 3
    runner threads (fixed column blocks and reduction parts, one BLAS thread per GEMM) and
    with the input rebuilt in backward instead of kept."""
    old = conv_passes(*build(body, shape, dtype=np.float32, shift=False, bottoms=2))
    shifted = [conv_passes(*build(body, shape, dtype=np.float32, threads=t, bottoms=2))
               for t in (1, 2, 3)]
    shifted.append(conv_passes(*build(body, shape, dtype=np.float32, bottoms=2, keep=False)))
    for a, b in zip(old, shifted[0]):
        np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-4)
    for other in shifted[1:]:
        for a, b in zip(shifted[0], other):
            np.testing.assert_array_equal(a, b)


def test_wide_output_splits_blocks_and_reduction():
    """The WIDE case really takes several column blocks and reduction parts; its weight
    gradient against einsum over sliding windows (float64)."""
    layer, bottom, top = build(*WIDE)
    g = layer.path.geometry
    assert len(shift_conv._blocks(g.length)) > 1 and shift_conv.reduction_parts(g) > 1
    layer.forward(bottom, top)
    top[0].diff[...] = np.random.default_rng(2).standard_normal(top[0].shape)
    layer.blobs[0].clear_diff_lazily()
    layer.backward(top, [False], bottom)
    x = np.pad(bottom[0].data, ((0, 0), (0, 0), (1, 1), (1, 1)))
    patches = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))
    expected = np.einsum("noyz,ncyzij->ocij", top[0].diff, patches)
    np.testing.assert_allclose(layer.blobs[0].diff, expected, rtol=1e-10, atol=1e-10)


def rule_picks(body, shape):
    layer, bottom, top = build(body, shape, shift=None)
    return layer.choice.path == "shift"


def test_the_shifted_path_is_off_by_default():
    layer, bottom, top = build("num_output: 4 kernel_size: 3 pad: 1", (8, 32, 28, 28),
                               shift=ConvolutionRules().shift_gemm)
    assert layer.choice.path != "shift"


def test_rule_takes_mid_size_planes_with_enough_channels():
    # GoogleNet inception_3a/3x3-like: 28x28, pad 1, batch 8 (full output 8 * 30 * 30 = 7200)
    assert rule_picks("num_output: 4 kernel_size: 3 pad: 1", (8, 32, 28, 28))


@pytest.mark.parametrize("body,shape,why", [
    ("num_output: 4 kernel_size: 3 pad: 1", (8, 16, 28, 28), "few channels"),
    ("num_output: 4 kernel_size: 3 pad: 1", (8, 32, 13, 13), "AlexNet conv3-like: 1800"),
    ("num_output: 4 kernel_size: 3 pad: 1 stride: 2", (8, 32, 13, 13), "strided"),
    ("num_output: 4 kernel_size: 1", (8, 32, 13, 13), "1x1"),
    ("num_output: 4 kernel_size: 5 pad: 2", (64, 32, 8, 8), "computes 2.25x"),
    ("num_output: 4 kernel_size: 3 pad: 1", (8, 32, 7, 7), "too few columns"),
    ("num_output: 4 kernel_size: 3 pad: 1", (2, 32, 56, 56), "per-sample plane"),
])
def test_rule_leaves_the_rest_on_the_old_paths(body, shape, why):
    assert not rule_picks(body, shape), why


def test_stride_is_never_forced_onto_the_shifted_path():
    layer, bottom, top = build("num_output: 2 kernel_size: 3 stride: 2", (1, 2, 7, 7),
                               shift=None)
    assert layer.choice.path == "im2col-batch-last"
    layer, bottom, top = threaded_conv("num_output: 2 kernel_size: 3 stride: 2", (1, 2, 7, 7),
                                       {"shift_gemm": True})
    assert layer.choice.path == "im2col-batch-last"


def test_a_reshape_that_switches_paths_frees_the_other_paths_arrays():
    """Under the rule, a plane the shifted path takes and one it leaves to im2col: the
    reshape from one to the other drops the stacked input, and back the column matrix."""
    body, taken, left = "num_output: 4 kernel_size: 3 pad: 1", (8, 32, 28, 28), (8, 32, 7, 7)
    layer, bottom, top = build(body, taken, shift=None)
    assert layer.choice.path == "shift"
    assert any(role.startswith("shift_input") for role in layer._buffers)
    bottom[0].reshape(*left)
    layer.reshape(bottom, top)
    assert layer.choice.path == "im2col-batch-last"
    assert any(role.startswith("columns") for role in layer._buffers)
    assert not any(role.startswith("shift_input") for role in layer._buffers)
    bottom[0].reshape(*taken)
    layer.reshape(bottom, top)
    assert layer.choice.path == "shift"
    assert not any(role.startswith("columns") for role in layer._buffers)


@pytest.mark.parametrize("body,shape", [CASES[2], WIDE])
def test_stale_buffers_do_not_leak_into_results(body, shape, conv_passes):
    """Every kept array and scratch filled with NaN between two runs: the same results
    (the padding, the tails and the garbage positions are written, never assumed zero)."""
    layer, bottom, top = build(body, shape, dtype=np.float32)
    start = [np.zeros(p.shape, np.float32) for p in layer.blobs]
    first = conv_passes(layer, bottom, top, start)
    for array in list(layer._buffers.values()) + list(layer.__dict__["_scratch"].values()):
        array[...] = np.nan
    for a, b in zip(first, conv_passes(layer, bottom, top, start)):
        np.testing.assert_array_equal(a, b)
