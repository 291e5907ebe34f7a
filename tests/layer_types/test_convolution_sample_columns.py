"""Convolution's per-sample columns (kernels.sample_columns): forward against the loop
reference, every gradient against the im2col path and central differences, lazily cleared
and accumulating diffs, the same bits on any thread count, and the rule that picks it."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from conv_layers import threaded_conv
from gradient_check import check_layer_gradients

from mgcaffe.kernels import sample_columns
from mgcaffe.kernels.loops import im2col as im2col_loops

pytest.importorskip("numba")

# body, bottom shape: pads, strides, dilation, a rectangular kernel, groups, no bias; batch
# 1, below the chunk count, and above it (uneven chunks).
CASES = [
    ("num_output: 4 kernel_size: 3 pad: 1", (3, 2, 7, 7)),
    ("num_output: 4 kernel_size: 3 stride: 2 pad: 1 group: 2", (5, 4, 9, 8)),
    ("num_output: 3 kernel_size: 3 dilation: 2 pad: 2 bias_term: false", (1, 3, 8, 9)),
    ("num_output: 2 kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad_h: 0 pad_w: 1",
     (sample_columns.CHUNKS + 3, 2, 6, 5)),
]


def build(body, shape, on=True, threads=2, dtype=np.float64, seed=0, bottoms=1):
    """A layer forced onto (or off) the per-sample columns (conv_layers.threaded_conv)."""
    layer, bottom, top = threaded_conv(body, shape, {"sample_columns": on, "winograd": False},
                                       threads, dtype, seed, bottoms)
    assert (layer.choice.path == "sample-columns") == on
    return layer, bottom, top


@pytest.mark.parametrize("body,shape", CASES)
def test_forward_matches_the_loop_reference(body, shape, naive_layer_top):
    layer, bottom, top = build(body, shape)
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, naive_layer_top(layer, bottom[0].data),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("body,shape", CASES)
def test_gradients_match_the_im2col_path_with_lazy_and_accumulating_diffs(body, shape,
                                                                           conv_passes):
    """Two bottoms, two backwards after one forward (the weight diff starts from seeded
    values and accumulates), float64: the im2col path's results to rounding."""
    old = conv_passes(*build(body, shape, on=False, bottoms=2))
    new = conv_passes(*build(body, shape, bottoms=2))
    for a, b in zip(old, new):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)


def test_a_lazily_cleared_weight_diff_is_overwritten():
    layer, bottom, top = build(*CASES[1])
    layer.forward(bottom, top)
    top[0].diff[...] = np.random.default_rng(3).standard_normal(top[0].shape)
    layer.blobs[0].diff[...] = np.nan
    layer.blobs[0].clear_diff_lazily()
    layer.backward(top, [True], bottom)
    fresh, fresh_bottom, fresh_top = build(*CASES[1])
    fresh.forward(fresh_bottom, fresh_top)
    fresh_top[0].diff[...] = top[0].diff
    fresh.blobs[0].diff[...] = 0
    fresh.backward(fresh_top, [True], fresh_bottom)
    np.testing.assert_array_equal(layer.blobs[0].diff, fresh.blobs[0].diff)


def test_central_differences():
    layer, bottom, top = build("num_output: 2 kernel_size: 3 stride: 2 pad: 1 group: 2",
                               (3, 2, 6, 5))
    check_layer_gradients(layer, bottom, top, eps=1e-6, rtol=1e-6, atol=1e-7, max_checks=40)


def test_without_a_bottom_diff_or_a_weight_gradient():
    """propagate_down False leaves the bottom diff alone; a frozen weight (lr_mult 0 sets
    param_propagate_down False) gets no gradient while the bottom still does."""
    body, shape = CASES[0]
    layer, bottom, top = build(body, shape)
    ref, ref_bottom, ref_top = build(body, shape, on=False)
    for lay, bot, tp in ((layer, bottom, top), (ref, ref_bottom, ref_top)):
        lay.forward(bot, tp)
        tp[0].diff[...] = 1.5
        bot[0].diff[...] = 7.0
        lay.blobs[0].diff[...] = 0
        lay.backward(tp, [False], bot)
    assert np.all(bottom[0].diff == 7.0)
    np.testing.assert_allclose(layer.blobs[0].diff, ref.blobs[0].diff, rtol=1e-12)
    layer.param_propagate_down[0] = False
    layer.blobs[0].diff[...] = 3.0
    layer.backward(top, [True], bottom)
    assert np.all(layer.blobs[0].diff == 3.0)
    ref.backward(ref_top, [True], ref_bottom)
    np.testing.assert_allclose(bottom[0].diff, ref_bottom[0].diff, rtol=1e-12)


def test_float32_repeats_bit_for_bit_on_any_thread_count(conv_passes):
    body, shape = CASES[3]
    runs = [conv_passes(*build(body, shape, threads=t, dtype=np.float32, bottoms=2))
            for t in (1, 2, 3)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("body,shape,taken", [
    # CIFAR-10 quick's conv2 and conv1 at batch 100: 82 and 31 MB of whole-batch columns.
    ("num_output: 32 kernel_size: 5 pad: 2", (100, 32, 16, 16), True),
    ("num_output: 32 kernel_size: 5 pad: 2", (100, 3, 32, 32), True),
    # The same conv2 at batch 8: 6.6 MB of columns, in the cache anyway.
    ("num_output: 32 kernel_size: 5 pad: 2", (8, 32, 16, 16), False),
    # GoogleNet's conv1/7x7_s2 at batch 8: 7.4 MB per sample, past the L2 cache.
    ("num_output: 64 kernel_size: 7 stride: 2 pad: 3", (8, 3, 224, 224), False),
    # A 1x1 convolution has no columns to build.
    ("num_output: 32 kernel_size: 1", (100, 256, 16, 16), False),
    # GoogleNet's inception_3b/5x5 at batch 8: 20 MB of columns, but a GEMM of 120 MFLOP a
    # sample; its 3b/3x3 (347 MFLOP) is Winograd's.
    ("num_output: 96 kernel_size: 5 pad: 2", (8, 32, 28, 28), True),
    ("num_output: 192 kernel_size: 3 pad: 1", (8, 128, 28, 28), False),
    # LeNet's conv2 at batch 64: 3.2 MFLOP a sample.
    ("num_output: 50 kernel_size: 5", (64, 20, 12, 12), False),
    # GoogleNet's conv2/3x3 (7.2 MB a sample) and inception_4e/3x3 (16 partial gradients
    # of 1.8 MB against 9 MB of columns).
    ("num_output: 192 kernel_size: 3 pad: 1", (8, 64, 56, 56), False),
    ("num_output: 320 kernel_size: 3 pad: 1", (8, 160, 14, 14), False),
])
def test_the_rule(body, shape, taken):
    layer, _, _ = threaded_conv(body, shape, {}, dtype=np.float32)
    assert (layer.choice.path == "sample-columns") == taken


def test_forced_winograd_or_shifted_gemms_win_over_the_rule():
    for switch in ("winograd", "shift_gemm"):
        layer, _, _ = threaded_conv("num_output: 96 kernel_size: 3 pad: 1", (8, 32, 28, 28),
                                    {switch: True}, dtype=np.float32)
        assert layer.choice.path.startswith("winograd" if switch == "winograd" else "shift")


def test_without_numba_the_layer_keeps_the_im2col_path(monkeypatch, untried):
    untried(im2col_loops)  # load() tries the import anew
    monkeypatch.setitem(sys.modules, "numba", None)      # `import numba` raises ImportError
    layer, bottom, top = threaded_conv("num_output: 32 kernel_size: 5 pad: 2",
                                       (100, 32, 16, 16), {"sample_columns": True},
                                       dtype=np.float32)
    assert layer.choice.path != "sample-columns"
    layer.forward(bottom, top)
    assert np.isfinite(top[0].data).all()


def test_a_reshape_to_a_small_batch_leaves_the_path():
    layer, bottom, top = threaded_conv("num_output: 3 kernel_size: 3 pad: 1", (8, 2, 8, 8),
                                       {"sample_columns_from_bytes": 1 << 15})
    assert layer.choice.path == "sample-columns"
    bottom[0].reshape((1, 2, 8, 8))
    layer.reshape(bottom, top)
    assert layer.choice.path != "sample-columns"
    layer.forward(bottom, top)
    assert top[0].shape == (1, 3, 8, 8)


def test_an_empty_batch_leaves_a_zero_weight_gradient():
    layer, bottom, top = build("num_output: 3 kernel_size: 3 pad: 1", (0, 2, 5, 5))
    layer.forward(bottom, top)
    layer.blobs[0].diff[...] = np.nan
    layer.blobs[0].clear_diff_lazily()
    layer.backward(top, [True], bottom)
    assert np.all(layer.blobs[0].diff == 0)
