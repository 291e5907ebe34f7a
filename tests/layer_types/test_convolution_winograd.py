"""Convolution's Winograd F(2x2, 3x3) path (kernels.winograd): forward and every gradient
against the naive reference in float64, float32 against the im2col path within the
transforms' rounding, accumulating and lazily cleared diffs, bit-identical on any thread
count, and the rule that picks it."""

from __future__ import annotations

import itertools
import sys

import numpy as np
import pytest
from conv_layers import threaded_conv
from gradient_check import check_layer_gradients

from mgcaffe.errors import LayerError
from mgcaffe.kernels import winograd
from mgcaffe.kernels.loops import winograd as winograd_loops
from mgcaffe.kernels.loops import winograd4 as winograd4_loops
from mgcaffe.layer_types.choice.convolution import ConvolutionRules
from mgcaffe.layer_types.conv_fast_paths import WINOGRAD_SLOTS

# body, bottom shape (N, C, H, W): pads 0/1/2, odd and even sizes (7x7, 14x14, 8x5),
# batch 1 and 3, groups 1 and 2, bias on and off.
CASES = [
    ("num_output: 4 kernel_size: 3 pad: 1", (3, 2, 7, 7)),
    ("num_output: 3 kernel_size: 3 pad: 0 bias_term: false", (1, 3, 8, 5)),
    ("num_output: 4 kernel_size: 3 pad: 2 group: 2", (3, 4, 8, 5)),
    ("num_output: 2 kernel_size: 3 pad: 1 group: 2 bias_term: false", (1, 4, 14, 14)),
    ("num_output: 3 kernel_size: 3 pad: 0", (3, 2, 14, 14)),
    ("num_output: 2 kernel_size: 3 pad: 2", (1, 2, 7, 7)),
    ("num_output: 2 kernel_size: 3", (2, 2, 3, 3)),                    # one output position
    ("num_output: 2 kernel_size: 3 pad_h: 0 pad_w: 2", (1, 2, 6, 5)),  # pad per axis
]
# 32x31 outputs per sample: forward runs sample by sample (winograd.PER_SAMPLE_FROM).
LARGE = ("num_output: 2 kernel_size: 3 pad: 1 group: 2", (2, 2, 32, 31))


@pytest.fixture(autouse=True, params=["loops", "gemm"])
def transforms(request, monkeypatch, untried):
    """Every test on both transform paths: the compiled loops (kernels.winograd_loops;
    skipped without numba) and the GEMM fallback, with numba's import made to fail."""
    loaded = untried(winograd_loops)  # load() tries the import anew
    untried(winograd4_loops)
    if request.param == "loops":
        pytest.importorskip("numba")
    else:
        monkeypatch.setitem(sys.modules, "numba", None)  # `import numba` raises ImportError
    yield request.param
    if loaded:  # the test ran a transform: on the path asked
        assert (loaded[-1] is None) == (request.param == "gemm")


def build(body, shape, wino=True, threads=2, dtype=np.float64, seed=0, bottoms=1, tile=2):
    """A layer forced onto (or off) the Winograd path (conv_layers.threaded_conv), its
    output tile `tile` (None: the rule's)."""
    rules = {"winograd": wino, "winograd_tile": tile}
    layer, bottom, top = threaded_conv(body, shape, rules, threads, dtype, seed, bottoms)
    if wino is not None:
        assert layer.choice.path.startswith("winograd") == wino
    return layer, bottom, top


def winograd_tile(layer):
    """The output tile of a layer on the Winograd path."""
    assert layer.choice.path.startswith("winograd"), layer.choice
    return layer.choice.option("tile")


def naive_gradients(layer, x, dy):
    """(dx, dW, db) of sum(conv(x) * dy) by loops over every output element and kernel tap
    (stride 1, dilation 1): each product w * x adds dy * x to dW and dy * w to dx."""
    w = layer.blobs[0].data
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    ph, pw = layer.pad
    og = o // layer.group
    dx, dw = np.zeros_like(x), np.zeros_like(w)
    for ni, oi, y, z in itertools.product(range(n), range(o), range(dy.shape[2]),
                                          range(dy.shape[3])):
        g = oi // og
        for i, j in itertools.product(range(kh), range(kw)):
            hi, wi = y - ph + i, z - pw + j
            if 0 <= hi < h and 0 <= wi < wd:
                channels = slice(g * cg, (g + 1) * cg)
                dw[oi, :, i, j] += dy[ni, oi, y, z] * x[ni, channels, hi, wi]
                dx[ni, channels, hi, wi] += dy[ni, oi, y, z] * w[oi, :, i, j]
    return dx, dw, dy.sum(axis=(0, 2, 3))


@pytest.fixture(params=[2, 4])
def tile(request, transforms):
    """F(2x2, 3x3) and F(4x4, 3x3) (compiled transforms only)."""
    if request.param == 4 and transforms != "loops":
        pytest.skip("F(4x4, 3x3) runs on the compiled transforms only")
    return request.param


@pytest.mark.parametrize("body,shape", CASES + [LARGE])
def test_forward_and_gradients_match_the_naive_reference(body, shape, naive_layer_top, tile):
    """float64: top, bottom diff, weight diff (lazily cleared over NaN: overwritten) and bias
    diff (stale values: accumulated) against the loop reference, to ~1e-10."""
    layer, bottom, top = build(body, shape, tile=tile)
    assert winograd_tile(layer) == tile
    layer.forward(bottom, top)
    expected = naive_layer_top(layer, bottom[0].data)
    assert top[0].shape == expected.shape
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-10, atol=1e-10)
    dy = np.random.default_rng(3).standard_normal(top[0].shape)
    top[0].diff[...] = dy
    bottom[0].diff[...] = np.nan
    layer.blobs[0].diff[...] = np.nan
    layer.blobs[0].clear_diff_lazily()
    if layer.bias_term:
        layer.blobs[1].diff[...] = 0.25
    layer.backward(top, [True], bottom)
    dx, dw, db = naive_gradients(layer, bottom[0].data, dy)
    np.testing.assert_allclose(bottom[0].diff, dx, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(layer.blobs[0].diff, dw, rtol=1e-10, atol=1e-10)
    if layer.bias_term:
        np.testing.assert_allclose(layer.blobs[1].diff, 0.25 + db, rtol=1e-10, atol=1e-10)


def test_central_differences_on_a_tiny_layer():
    layer, bottom, top = build("num_output: 2 kernel_size: 3 pad: 1 group: 2", (2, 2, 5, 4))
    check_layer_gradients(layer, bottom, top, eps=1e-6, rtol=1e-6, atol=1e-7, max_checks=40)


@pytest.mark.parametrize("body,shape", CASES[:3] + [LARGE])
def test_float32_matches_the_im2col_path_and_repeats_on_any_thread_count(body, shape,
                                                                           conv_passes, tile):
    """float32, two bottoms, two backwards after one forward (stale diffs accumulated, the
    kept V rebuilt for the second): within the transforms' rounding of the im2col path (a
    few float32 ulps of terms of size ~ sqrt(C*9) * 4: 1e-4 relative to the largest), and
    the same bits on 1, 2 and 3 runner threads."""
    old = conv_passes(*build(body, shape, dtype=np.float32, wino=False, bottoms=2))
    new = [conv_passes(*build(body, shape, dtype=np.float32, threads=t, bottoms=2,
                              tile=tile)) for t in (1, 2, 3)]
    for a, b in zip(old, new[0]):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-4 * max(1.0, np.abs(a).max()))
    for other in new[1:]:
        for a, b in zip(new[0], other):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shape,outputs", [
    ((1, 160, 14, 14), 320),   # inception_4e/3x3 at batch 1
    ((1, 96, 28, 28), 128),    # inception_3a/3x3 at batch 1
])
def test_float32_error_on_a_googlenet_sized_layer_is_small(shape, outputs, tile):
    """float32 Winograd forward against a float64 direct convolution (einsum), relative to
    the output's scale: F(4x4)'s error is larger than F(2x2)'s (9e-6 against 4e-7 on 3a),
    still well inside float32 training noise."""
    layer, bottom, top = build(f"num_output: {outputs} kernel_size: 3 pad: 1", shape,
                               dtype=np.float32, tile=tile)
    layer.forward(bottom, top)
    x = np.pad(bottom[0].data.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    patches = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))
    w = layer.blobs[0].data.astype(np.float64)
    expected = np.einsum("ncyzij,ocij->noyz", patches, w) + layer.blobs[1].data[:, None, None]
    error = np.abs(top[0].data - expected).max() / np.abs(expected).max()
    assert error < (2e-6 if tile == 2 else 2e-5), error


def test_a_lazily_cleared_weight_diff_is_overwritten_and_a_stale_one_accumulated():
    body, shape = CASES[0]
    layer, bottom, top = build(body, shape)
    layer.forward(bottom, top)
    top[0].diff[...] = np.random.default_rng(4).standard_normal(top[0].shape)
    layer.blobs[0].diff[...] = np.nan
    layer.blobs[0].clear_diff_lazily()
    layer.backward(top, [False], bottom)
    once = layer.blobs[0].diff.copy()
    assert np.isfinite(once).all()
    layer.backward(top, [False], bottom)
    np.testing.assert_allclose(layer.blobs[0].diff, 2 * once, rtol=1e-12)


def test_stale_buffers_do_not_leak_into_results(conv_passes):
    """Every kept array and scratch filled with NaN between two runs: the same results."""
    body, shape = CASES[2]
    layer, bottom, top = build(body, shape, dtype=np.float32)
    start = [np.zeros(p.shape, np.float32) for p in layer.blobs]
    first = conv_passes(layer, bottom, top, start)
    for array in list(layer._buffers.values()) + list(layer.__dict__["_scratch"].values()):
        array[...] = np.nan
    for a, b in zip(first, conv_passes(layer, bottom, top, start)):
        np.testing.assert_array_equal(a, b)


def test_the_kept_input_is_four_times_the_input_for_even_outputs():
    """... plus the slabs' spacing: at most 63 elements (four cache lines) more per
    (channel, tile position) row."""
    layer, bottom, top = build("num_output: 4 kernel_size: 3 pad: 1", (2, 3, 14, 14))
    kept = sum(a.nbytes for r, a in layer._buffers.items() if r.startswith("winograd"))
    quadruple = 4 * bottom[0].data.nbytes
    assert quadruple <= kept <= quadruple + 3 * 16 * 63 * bottom[0].data.itemsize
    assert not any(r.startswith("columns") for r in layer._buffers)


# (N, C, H, W), O: conv2/3x3 at batch 8 (O*N*P a whole number of pages, as is N*P*C), a
# 16x16 output at batch 32 (N*P one page), a small odd one.
SLAB_CASES = [((8, 64, 56, 56), 192), ((32, 64, 16, 16), 64), ((2, 3, 7, 5), 4)]


def cache_sets(view, axis):
    """The 64-byte line sets (of a 4 KB way) where 16 consecutive slabs along axis start."""
    return {(k * view.strides[axis] // 64) % 64 for k in range(16)}


@pytest.mark.parametrize("image,outputs", SLAB_CASES)
def test_tile_position_slabs_start_in_sixteen_different_cache_sets(image, outputs):
    """The transforms read or write a tile's 16 positions together: those 16 streams may
    not share cache sets, in every array with a tile-position axis; each view's elements
    are distinct elements of its memory."""
    geometry = winograd.Geometry(image, (1, 1), outputs, 1)
    product = np.zeros(geometry.product_elements(), np.float32)
    kept = np.zeros(geometry.input_elements(), np.float32)
    views = [(product, geometry.product_view, 0, geometry.product_shape()),
             (product, geometry.sample_product_view, 1, None),
             (kept, geometry.input_view, 1, geometry.input_shape()),
             (kept, geometry.tile_grad_view, 0, None)]
    for memory, make, axis, shape in views:
        memory[...] = 0
        view = make(memory)
        assert len(cache_sets(view, axis)) == 16
        assert view.shape[axis] == 16 and view.strides[-1] == view.itemsize
        if shape is not None:
            assert view.shape == shape
        view[...] = 1.0
        assert np.count_nonzero(memory) == view.size


def test_slab_strides_are_whole_lines_and_barely_longer():
    for elements in (1, 15, 16, 294, 1024, 4096, 6272, 401408, 2**20):
        stride = winograd.slab_stride(elements)
        assert stride % 16 == 0 and elements <= stride <= elements + 63
        assert len({(k * stride // 16) % 64 for k in range(16)}) == 16


def rule_picks(body, shape):
    layer, bottom, top = build(body, shape, wino=None)
    return layer.choice.path.startswith("winograd")


@pytest.mark.parametrize("body,shape,why", [
    ("num_output: 4 kernel_size: 3 pad: 1 stride: 2", (1, 32, 14, 14), "strided"),
    ("num_output: 4 kernel_size: 3 pad: 2 dilation: 2", (1, 32, 14, 14), "dilated"),
    ("num_output: 4 kernel_size: 5 pad: 2", (1, 32, 14, 14), "5x5"),
    ("num_output: 4 kernel_h: 3 kernel_w: 1", (1, 32, 14, 14), "3x1"),
])
def test_other_geometries_never_take_the_path_even_forced(body, shape, why):
    layer, bottom, top = threaded_conv(body, shape, {"winograd": True})
    assert not layer.choice.path.startswith("winograd"), why


def test_a_reshape_that_switches_paths_frees_the_other_paths_arrays():
    """Under the rule, a plane Winograd takes and one it leaves to im2col: the reshape from
    one to the other drops the transformed input, and back the column matrix."""
    body, taken, left = "num_output: 4 kernel_size: 3 pad: 1", (8, 32, 28, 28), (8, 32, 7, 7)
    layer, bottom, top = build(body, taken, wino=None)
    assert layer.choice.path.startswith("winograd")
    assert any(role.startswith("winograd_input") for role in layer._buffers)
    bottom[0].reshape(*left)
    layer.reshape(bottom, top)
    assert layer.choice.path == "im2col-batch-last"
    assert any(role.startswith("columns") for role in layer._buffers)
    assert not any(role.startswith("winograd_input") for role in layer._buffers)
    bottom[0].reshape(*taken)
    layer.reshape(bottom, top)
    assert layer.choice.path.startswith("winograd")
    assert not any(role.startswith("columns") for role in layer._buffers)


def test_transform_matrices_give_the_1d_f23_convolution():
    """F(2, 3) by hand: A^T [(G g) * (B^T d)] is the valid correlation of d (4) with g (3)."""
    d, g = np.array([1.0, -2.0, 3.0, 0.5]), np.array([0.25, -1.0, 2.0])
    y = winograd.AT @ ((winograd.G @ g) * (winograd.BT @ d))
    np.testing.assert_allclose(y, [1 * .25 + 2 + 6, -2 * .25 - 3 + 1], rtol=1e-15)


def test_transform_matrices_give_the_1d_f43_convolution():
    """F(4, 3), its matrices written out here again: A^T [(G g) * (B^T d)] is the valid
    correlation of d (6) with g (3); the module's G4 is this G."""
    b_t = np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                    [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], float)
    g_m = np.array([[6, 0, 0], [-4, -4, -4], [-4, 4, -4], [1, 2, 4], [1, -2, 4],
                    [0, 0, 24]], float) / 24
    a_t = np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
                    [0, 1, -1, 8, -8, 1]], float)
    np.testing.assert_allclose(winograd.G4, g_m, rtol=1e-15)
    rng = np.random.default_rng(9)
    d, g = rng.standard_normal(6), rng.standard_normal(3)
    y = a_t @ ((g_m @ g) * (b_t @ d))
    np.testing.assert_allclose(y, [d[i:i + 3] @ g for i in range(4)], rtol=1e-12)


@pytest.mark.parametrize("body,shape,why", [
    ("num_output: 4 kernel_size: 3 pad: 1", (1, 2, 28, 28), "28x28: whole 4x4 tiles"),
    ("num_output: 4 kernel_size: 3 pad: 0", (1, 2, 14, 14), "12x12: whole 4x4 tiles"),
])
def test_outputs_that_4x4_tiles_cover_take_f43_where_compiled(body, shape, why, transforms):
    layer, bottom, top = build(body, shape, tile=None)
    assert winograd_tile(layer) == (4 if transforms == "loops" else 2), why


def test_outputs_4x4_tiles_would_waste_on_take_f23():
    for shape in [(1, 2, 14, 14), (1, 2, 13, 13), (1, 2, 7, 7)]:  # 16x16/14x14 computed: 1.31
        layer, bottom, top = build("num_output: 4 kernel_size: 3 pad: 1", shape, tile=None)
        assert winograd_tile(layer) == 2, shape


def test_f43_forced_without_the_compiled_transforms_is_a_clear_error(transforms):
    if transforms == "loops":
        pytest.skip("the compiled transforms are here")
    with pytest.raises(LayerError, match="'c'.*winograd_tile 4 needs the compiled"):
        build("num_output: 4 kernel_size: 3 pad: 1", (1, 2, 8, 8), tile=4)


def test_large_case_takes_the_per_sample_forward(tile):
    """... judged by output positions per sample (the tiles' count times their area)."""
    layer, bottom, top = build(*LARGE, tile=tile)
    small = winograd.Geometry((3, 2, 7, 7), (1, 1), 4, 1, tile)
    assert layer.path.geometry.per_sample * tile ** 2 >= winograd.PER_SAMPLE_FROM > \
        small.per_sample * tile ** 2


def test_the_rule_decides_by_default():
    assert ConvolutionRules().winograd is None


@pytest.mark.parametrize("body,shape", [
    ("num_output: 4 kernel_size: 3 pad: 1", (8, 32, 28, 28)),    # GoogleNet 3a-like
    ("num_output: 4 kernel_size: 3 pad: 1", (4, 32, 28, 28)),    # ResNet-50 res3a-like
    ("num_output: 4 kernel_size: 3 pad: 1 group: 2", (2, 64, 28, 28)),  # 32 per group
])
def test_rule_takes_28x28_planes_with_enough_channels_and_tiles(body, shape):
    assert rule_picks(body, shape)


@pytest.mark.parametrize("body,shape,why", [
    ("num_output: 4 kernel_size: 3 pad: 1", (8, 16, 28, 28), "few channels"),
    ("num_output: 4 kernel_size: 3 pad: 1 group: 2", (8, 32, 28, 28), "16 per group"),
    ("num_output: 4 kernel_size: 3 pad: 1", (8, 32, 7, 7), "7x7 plane, 128 tiles"),
    ("num_output: 4 kernel_size: 3 pad: 1", (8, 32, 3, 200), "3 rows: 1.33x computed"),
    ("num_output: 4 kernel_size: 3 pad: 1 stride: 2", (8, 32, 28, 28), "strided"),
])
def test_rule_leaves_the_rest_on_the_old_paths(body, shape, why):
    assert not rule_picks(body, shape), why


@pytest.mark.parametrize("body,shape,why", [
    ("num_output: 4 kernel_size: 3 pad: 1", (2, 32, 56, 56), "56x56 plane"),
    ("num_output: 4 kernel_size: 3 pad: 1", (1, 32, 28, 28), "196 tiles"),
    ("num_output: 4 kernel_size: 3 pad: 1", (8, 32, 14, 14), "14x14 plane"),
    ("num_output: 4 kernel_size: 3 pad: 1", (8, 32, 13, 13), "13x13: 1.16x computed"),
])
def test_rule_takes_these_only_with_the_compiled_transforms(body, shape, why, transforms):
    assert rule_picks(body, shape) == (transforms == "loops"), why


# -- the compiled transforms against naive numpy (kernels.winograd_loops, winograd4_loops) -
# The F(2x2, 3x3) and F(4x4, 3x3) matrices written out here again, independent of the
# modules' copies.
B_T = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=float)
A_T = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=float)
B_T4 = np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                 [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], float)
A_T4 = np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
                 [0, 1, -1, 8, -8, 1]], float)
# (N, C, H, W), pad: odd sizes (partial last tiles), per-axis pads, no pad.
TRANSFORM_CASES = [((2, 3, 7, 6), (1, 2)), ((1, 2, 6, 9), (0, 0)), ((3, 1, 5, 5), (2, 1)),
                   ((1, 2, 10, 11), (1, 1))]


def matrices(geometry):
    """(B^T, A^T, the input tile's side a, the output tile's m) of the geometry's tile."""
    m = geometry.tile
    return (B_T, A_T, 4, 2) if m == 2 else (B_T4, A_T4, 6, 4)


def naive_tiles(geometry):
    """(tile row, tile column, y0, x0) of every tile, with y0/x0 in padded coordinates."""
    th, tw = geometry.tiles
    m = geometry.tile
    return [(ty, tx, m * ty, m * tx) for ty in range(th) for tx in range(tw)]


def naive_input(x, geometry):
    """V (C, a*a, N, P) = B^T d B per a x a tile of the zero-padded image."""
    bt, _, a, _ = matrices(geometry)
    n, c = x.shape[:2]
    (ph, pw), (hp, wp) = geometry.pad, geometry.padded[2:]
    padded = np.zeros((n, c, hp, wp))
    padded[:, :, ph:ph + x.shape[2], pw:pw + x.shape[3]] = x
    v = np.zeros(geometry.input_shape())
    for p, (_, _, y0, x0) in enumerate(naive_tiles(geometry)):
        d = padded[:, :, y0:y0 + a, x0:x0 + a]
        v[:, :, :, p] = np.einsum("ir,ncrs,js->cijn", bt, d, bt).reshape(c, a * a, n)
    return v


def naive_output(m, geometry, bias):
    """top (N, O, Ho, Wo) = A^T M A per tile, cropped, + bias."""
    _, at, a, t = matrices(geometry)
    o, n = m.shape[1:3]
    ho, wo = geometry.out_hw
    th, tw = geometry.tiles
    top = np.zeros((n, o, t * th, t * tw))
    for p, (ty, tx, _, _) in enumerate(naive_tiles(geometry)):
        tile = m[:, :, :, p].reshape(a, a, o, n)
        top[:, :, t * ty:t * ty + t, t * tx:t * tx + t] = np.einsum(
            "ir,rsoN,js->Noij", at, tile, at)
    return top[:, :, :ho, :wo] + bias[:, None, None]


def naive_output_grad(dy, geometry):
    """dM (a*a, O, N, P) = A dY A^T per output tile of dy, zero past its edge."""
    _, at, a, t = matrices(geometry)
    n, o, ho, wo = dy.shape
    th, tw = geometry.tiles
    grown = np.zeros((n, o, t * th, t * tw))
    grown[:, :, :ho, :wo] = dy
    dm = np.zeros(geometry.product_shape())
    for p, (ty, tx, _, _) in enumerate(naive_tiles(geometry)):
        g = grown[:, :, t * ty:t * ty + t, t * tx:t * tx + t]
        dm[:, :, :, p] = np.einsum("ri,Nors,sj->ijoN", at, g, at).reshape(a * a, o, n)
    return dm


def naive_input_grad(dv, geometry):
    """dd (N, C, H, W) = B dV B^T added onto each tile of the padded image, cropped."""
    bt, _, a, _ = matrices(geometry)
    _, c, n, _ = dv.shape
    (ph, pw), (hp, wp) = geometry.pad, geometry.padded[2:]
    _, _, h, w = geometry.image
    padded = np.zeros((n, c, hp, wp))
    for p, (_, _, y0, x0) in enumerate(naive_tiles(geometry)):
        tile = dv[:, :, :, p].reshape(a, a, c, n)
        padded[:, :, y0:y0 + a, x0:x0 + a] += np.einsum("ri,rsCN,sj->NCij", bt, tile, bt)
    return padded[:, :, ph:ph + h, pw:pw + w]


def compiled_transforms(x, m, dy, dv, geometry, bias):
    """The four compiled transforms over all planes: V, top, dM, dd."""
    loops = winograd._loops(geometry.tile)
    assert loops is not None
    n, c = geometry.image[:2]
    o = geometry.num_output
    th, tw = geometry.tiles
    zero = x.dtype.type(0)
    v = np.full(geometry.input_shape(), np.nan, dtype=x.dtype)
    loops.input_tiles(x, v, 0, n, 0, c, *geometry.pad, th, tw, zero)
    top = np.full((n, o) + geometry.out_hw, np.nan, dtype=x.dtype)
    loops.output_tiles(m, top, bias, True, 0, n, 0, o, tw)
    dm = np.full(geometry.product_shape(), np.nan, dtype=x.dtype)
    loops.output_grad_tiles(dy, dm, 0, n, 0, o, tw, zero)
    dd = np.full(x.shape, np.nan, dtype=x.dtype)
    loops.input_grad_tiles(dv, dd, 0, n, 0, c, *geometry.pad, th, tw, zero)
    return v, top, dm, dd


def transform_inputs(image, pad, dtype, seed=0, tile=2):
    geometry = winograd.Geometry(image, pad, 2, 1, tile)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(image).astype(dtype)
    m = rng.standard_normal(geometry.product_shape()).astype(dtype)
    dy = rng.standard_normal((image[0], 2) + geometry.out_hw).astype(dtype)
    dv = rng.standard_normal((geometry.positions, image[1], image[0],
                              geometry.per_sample)).astype(dtype)
    bias = rng.standard_normal(2).astype(dtype)
    return geometry, (x, m, dy, dv), bias


NAIVE = (naive_input, naive_output, naive_output_grad, naive_input_grad)


def naive_all(arrays, geometry, bias):
    x, m, dy, dv = (a.astype(np.float64) for a in arrays)
    return (naive_input(x, geometry), naive_output(m, geometry, bias.astype(np.float64)),
            naive_output_grad(dy, geometry), naive_input_grad(dv, geometry))


@pytest.mark.parametrize("image,pad", TRANSFORM_CASES)
def test_compiled_transforms_match_naive_numpy_in_float64(image, pad, transforms, tile):
    if transforms != "loops":
        pytest.skip("the compiled transforms themselves")
    geometry, arrays, bias = transform_inputs(image, pad, np.float64, tile=tile)
    got = compiled_transforms(*arrays, geometry, bias)
    for name, a, b in zip(("V", "top", "dM", "dd"), got, naive_all(arrays, geometry, bias)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-13, err_msg=name)


@pytest.mark.parametrize("image,pad", TRANSFORM_CASES)
def test_compiled_transforms_in_float32_are_within_a_few_ulp(image, pad, transforms,
                                                             monkeypatch, tile):
    """float32 against float64 of the same inputs: within 4 float32 ulps of the sum of the
    terms' magnitudes (the transforms with |B^T|, |A^T| applied to the inputs' |values|)."""
    if transforms != "loops":
        pytest.skip("the compiled transforms themselves")
    geometry, arrays, bias = transform_inputs(image, pad, np.float32, seed=3, tile=tile)
    got = compiled_transforms(*arrays, geometry, bias)
    expected = naive_all(arrays, geometry, bias)
    here = sys.modules[__name__]
    for name in ("B_T", "A_T", "B_T4", "A_T4"):
        monkeypatch.setattr(here, name, np.abs(getattr(here, name)))
    magnitudes = naive_all([np.abs(a) for a in arrays], geometry, np.abs(bias))
    eps = np.finfo(np.float32).eps
    for name, a, b, scale in zip(("V", "top", "dM", "dd"), got, expected, magnitudes):
        assert a.dtype == np.float32
        assert np.all(np.abs(a - b) <= 4 * eps * scale), name


@pytest.mark.parametrize("image,pad", TRANSFORM_CASES)
def test_compiled_transforms_on_plane_ranges_fill_only_their_planes(image, pad, transforms,
                                                                    tile):
    """Split over samples and channels the results are the same bits as one call (the
    runner's threads call them on disjoint ranges)."""
    if transforms != "loops":
        pytest.skip("the compiled transforms themselves")
    geometry, (x, _, _, dv), _ = transform_inputs(image, pad, np.float32, seed=5, tile=tile)
    loops = winograd._loops(geometry.tile)
    n, c = image[:2]
    th, tw = geometry.tiles
    zero = np.float32(0)
    whole, parts = np.empty(geometry.input_shape(), np.float32), None
    loops.input_tiles(x, whole, 0, n, 0, c, *pad, th, tw, zero)
    parts = np.full_like(whole, np.nan)
    dd_whole, dd_parts = np.empty_like(x), np.full_like(x, np.nan)
    loops.input_grad_tiles(dv, dd_whole, 0, n, 0, c, *pad, th, tw, zero)
    for s in range(n):
        for k in range(c):
            loops.input_tiles(x, parts, s, s + 1, k, k + 1, *pad, th, tw, zero)
            loops.input_grad_tiles(dv, dd_parts, s, s + 1, k, k + 1, *pad, th, tw, zero)
    np.testing.assert_array_equal(parts, whole)
    np.testing.assert_array_equal(dd_parts, dd_whole)


def test_the_gemm_fallback_is_taken_when_numba_cannot_be_imported(transforms):
    """Without numba the module's passes run on the GEMM transforms (and give the naive
    results); `load()` says None."""
    if transforms != "gemm":
        pytest.skip("the fallback")
    assert winograd_loops.load() is None
    geometry, (x, _, dy, _), _ = transform_inputs((2, 3, 7, 6), (1, 2), np.float64)
    scratch = {}

    def buffers(name, shape):
        return scratch.setdefault(name, np.full(shape, np.nan))

    v = np.empty(geometry.input_elements())
    winograd.fill_input(x, geometry, v, buffers)
    np.testing.assert_allclose(geometry.input_view(v), naive_input(x, geometry), rtol=0,
                               atol=1e-13)
    dm = winograd.output_grad(dy, geometry, buffers)
    np.testing.assert_allclose(dm, naive_output_grad(dy, geometry), rtol=0, atol=1e-13)


def test_the_compiled_transforms_ask_for_no_fallback_temporaries(transforms):
    """The padded image, the tile columns (4x the input) and the output tiles serve only the
    GEMM transforms: the compiled loops never allocate them."""
    layer, bottom, top = build(*LARGE)
    layer.forward(bottom, top)
    top[0].diff[...] = 1.0
    layer.backward(top, [True], bottom)
    fallback = {WINOGRAD_SLOTS[name] for name in ("padded", "columns", "tiles")}
    held = fallback & set(layer._scratch)
    assert held == (set() if transforms == "loops" else fallback)
