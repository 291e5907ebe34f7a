"""Pooling: Caffe's output sizes, MAX (mask, ties, padding), AVE (padded area), gradients."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from google.protobuf import text_format
from gradient_check import check_layer_gradients, make_layer
from layer_rules import changed

from mgcaffe.errors import LayerError
from mgcaffe.proto import caffe_pb2

FLT_MAX = float(np.finfo(np.float32).max)


#: Rules for each of the CPU's ways: the compiled loops (MAX, and here AVE on every plane
#: size), its numpy paths (MAX backward by winner index, AVE of small planes as a GEMM) and
#: the offset-by-offset passes (the device path, large planes).
WAYS = {"compiled": {"compiled": True, "ave_gemm_below": 0},
        "numpy": {"compiled": False},
        "offset-passes": {"compiled": False, "ave_gemm_below": 0,
                          "max_backward_by_index": False}}


@pytest.fixture(params=list(WAYS))
def pooling_path(request):
    """Every test runs on each way of WAYS: (its name, the rules)."""
    return request.param, changed(pooling=WAYS[request.param])


def pool_param(body: str, name: str = "pool", n_top: int = 1) -> caffe_pb2.LayerParameter:
    tops = " ".join(f'top: "t{i}"' for i in range(n_top))
    text = f'name: "{name}" type: "Pooling" {tops} pooling_param {{ {body} }}'
    return text_format.Parse(text, caffe_pb2.LayerParameter())


def caffe_out_size(size, k, s, p, ceil_mode):
    span = (size + 2 * p - k) / s
    out = (math.ceil(span) if ceil_mode else math.floor(span)) + 1
    return out


def naive_pool(x, kernel, stride, pad, method, ceil_mode=True):
    """Caffe's pooling loops, written out: returns (top, mask)."""
    n, c, h, w = x.shape
    oh = caffe_out_size(h, kernel[0], stride[0], pad[0], ceil_mode)
    ow = caffe_out_size(w, kernel[1], stride[1], pad[1], ceil_mode)
    if pad[0] or pad[1]:
        if (oh - 1) * stride[0] >= h + pad[0]:
            oh -= 1
        if (ow - 1) * stride[1] >= w + pad[1]:
            ow -= 1
    top = np.zeros((n, c, oh, ow))
    mask = np.full((n, c, oh, ow), -1.0)
    for ni, ci, y, z in itertools.product(range(n), range(c), range(oh), range(ow)):
        hs, ws = y * stride[0] - pad[0], z * stride[1] - pad[1]
        if method == "MAX":
            he, we = min(hs + kernel[0], h), min(ws + kernel[1], w)
            best, arg = -FLT_MAX, -1
            for hh in range(max(hs, 0), he):
                for ww in range(max(ws, 0), we):
                    if x[ni, ci, hh, ww] > best:
                        best, arg = x[ni, ci, hh, ww], hh * w + ww
            top[ni, ci, y, z], mask[ni, ci, y, z] = best, arg
        else:
            he, we = min(hs + kernel[0], h + pad[0]), min(ws + kernel[1], w + pad[1])
            area = (he - hs) * (we - ws)
            total = 0.0
            for hh in range(max(hs, 0), min(he, h)):
                for ww in range(max(ws, 0), min(we, w)):
                    total += x[ni, ci, hh, ww]
            top[ni, ci, y, z] = total / area
    return top, mask


CASES = [
    # body fragment, bottom shape, kernel, stride, pad, ceil mode
    ("kernel_size: 3 stride: 2", (2, 2, 8, 8), (3, 3), (2, 2), (0, 0), True),
    ("kernel_size: 2 stride: 2 pad: 1", (1, 2, 5, 5), (2, 2), (2, 2), (1, 1), True),
    ("kernel_size: 3 stride: 2 pad: 1", (2, 1, 7, 6), (3, 3), (2, 2), (1, 1), True),
    ("kernel_size: 3 stride: 2 pad: 1 round_mode: FLOOR", (2, 1, 7, 6), (3, 3), (2, 2),
     (1, 1), False),
    ("kernel_size: 3 stride: 2 round_mode: FLOOR", (1, 2, 8, 7), (3, 3), (2, 2), (0, 0), False),
    ("kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad_h: 1 pad_w: 0", (1, 2, 6, 5),
     (3, 2), (2, 1), (1, 0), True),
    ("kernel_size: 3 stride: 1 pad: 1", (2, 2, 4, 4), (3, 3), (1, 1), (1, 1), True),
    ("kernel_size: 4 stride: 3 pad: 2", (1, 1, 9, 8), (4, 4), (3, 3), (2, 2), True),
    ("kernel_size: 1 stride: 3", (1, 2, 5, 5), (1, 1), (3, 3), (0, 0), True),  # empty windows
    ("kernel_size: 4", (2, 2, 4, 4), (4, 4), (1, 1), (0, 0), True),  # one window per plane
]


@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("body,shape,kernel,stride,pad,ceil_mode", CASES)
def test_forward_matches_naive(method, body, shape, kernel, stride, pad, ceil_mode, pooling_path):
    n_top = 2 if method == "MAX" else 1
    layer, bottom, top = make_layer(pool_param(f"pool: {method} {body}", n_top=n_top), [shape],
                                    rules=pooling_path[1])
    layer.forward(bottom, top)
    expected, mask = naive_pool(bottom[0].data, kernel, stride, pad, method, ceil_mode)
    assert top[0].shape == expected.shape
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-12, atol=1e-12)
    if method == "MAX":
        np.testing.assert_array_equal(top[1].data, mask)


@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("body,shape,kernel,stride,pad,ceil_mode", CASES)
def test_gradients(method, body, shape, kernel, stride, pad, ceil_mode, pooling_path):
    if method == "MAX" and stride[0] > kernel[0]:
        # Empty windows output -FLT_MAX, which swamps the checker's objective in float64;
        # test_max_backward_routes_to_the_mask covers this case.
        pytest.skip("MAX with empty windows")
    layer, bottom, top = make_layer(pool_param(f"pool: {method} {body}"), [shape], seed=7,
                                    rules=pooling_path[1])
    check_layer_gradients(layer, bottom, top, max_checks=60)


@pytest.mark.parametrize("body,shape,kernel,stride,pad,ceil_mode", CASES)
def test_max_backward_routes_to_the_mask(body, shape, kernel, stride, pad, ceil_mode, pooling_path):
    layer, bottom, top = make_layer(pool_param(f"pool: MAX {body}"), [shape], seed=8,
                                    rules=pooling_path[1])
    layer.forward(bottom, top)
    _, mask = naive_pool(bottom[0].data, kernel, stride, pad, "MAX", ceil_mode)
    top[0].diff[...] = np.random.default_rng(9).standard_normal(top[0].shape)
    layer.backward(top, [True], bottom)
    expected = np.zeros(shape)
    for (ni, ci, y, z), m in np.ndenumerate(mask):
        if m >= 0:
            expected[ni, ci].flat[int(m)] += top[0].diff[ni, ci, y, z]
    np.testing.assert_allclose(bottom[0].diff, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("body,shape,out_hw", [
    ("kernel_size: 3 stride: 2", (1, 1, 8, 8), (4, 4)),  # CAFFE-NOTES: ceil
    ("kernel_size: 2 stride: 2 pad: 1", (1, 1, 5, 5), (3, 3)),  # CAFFE-NOTES: clipped, not 4
    ("kernel_size: 3 stride: 2 round_mode: FLOOR", (1, 1, 8, 8), (3, 3)),
    ("kernel_size: 3 stride: 2", (1, 1, 112, 112), (56, 56)),  # GoogleNet pool1
    ("kernel_size: 3 stride: 1 pad: 1", (1, 1, 28, 28), (28, 28)),  # inception pool branch
    ("global_pooling: true", (2, 3, 7, 5), (1, 1)),
])
def test_output_shapes(body, shape, out_hw, pooling_path):
    _, _, top = make_layer(pool_param(body), [shape], rules=pooling_path[1])
    assert top[0].shape == shape[:2] + out_hw


@pytest.mark.parametrize("method", ["MAX", "AVE"])
def test_global_pooling(method, pooling_path):
    layer, bottom, top = make_layer(
        pool_param(f"pool: {method} global_pooling: true", n_top=2 if method == "MAX" else 1),
        [(2, 3, 4, 5)], rules=pooling_path[1])
    layer.forward(bottom, top)
    x = bottom[0].data.reshape(2, 3, -1)
    if method == "MAX":
        np.testing.assert_array_equal(top[0].data[:, :, 0, 0], x.max(axis=2))
        np.testing.assert_array_equal(top[1].data[:, :, 0, 0], x.argmax(axis=2))
    else:
        np.testing.assert_allclose(top[0].data[:, :, 0, 0], x.mean(axis=2), rtol=1e-12)
    check_layer_gradients(layer, bottom, top, max_checks=60, top_indices=[0])


def test_max_ties_keep_the_first_cell_in_scan_order(pooling_path):
    x = np.ones((1, 1, 4, 4))
    layer, bottom, top = make_layer(pool_param("pool: MAX kernel_size: 3 stride: 1 pad: 1",
                                               n_top=2), [x], rules=pooling_path[1])
    layer.forward(bottom, top)
    # Each window's first in-image cell: row max(y-1, 0), column max(z-1, 0).
    expected = np.array([[max(y - 1, 0) * 4 + max(z - 1, 0) for z in range(4)]
                         for y in range(4)])
    np.testing.assert_array_equal(top[1].data[0, 0], expected)
    top[0].diff[...] = 1.0
    layer.backward(top, [True], bottom)
    counts = np.zeros(16)
    np.add.at(counts, expected.ravel(), 1.0)
    np.testing.assert_array_equal(bottom[0].diff.ravel(), counts)


def test_max_windows_of_only_minus_inf_or_nan_send_no_gradient(pooling_path):
    # Caffe: no cell is > -FLT_MAX, so the output is -FLT_MAX, the mask -1, and backward
    # sends nothing (the CPU's scatter by index must skip these windows, not add at index 0).
    x = np.random.default_rng(4).standard_normal((2, 1, 4, 4))
    x[0, 0, :2, :2] = -np.inf
    x[1, 0, 2:, 2:] = np.nan
    layer, bottom, top = make_layer(pool_param("pool: MAX kernel_size: 2 stride: 2",
                                               n_top=2), [x], rules=pooling_path[1])
    layer.forward(bottom, top)
    _, mask = naive_pool(x, (2, 2), (2, 2), (0, 0), "MAX")
    np.testing.assert_array_equal(top[1].data, mask)
    assert top[1].data[0, 0, 0, 0] == -1 and top[1].data[1, 0, 1, 1] == -1
    assert top[0].data[0, 0, 0, 0] == -FLT_MAX
    top[0].diff[...] = 1.0
    bottom[0].diff[...] = 7.0  # stale: must be overwritten
    layer.backward(top, [True], bottom)
    expected = np.zeros(x.shape)
    for (ni, ci, _y, _z), m in np.ndenumerate(mask):
        if m >= 0:
            expected[ni, ci].flat[int(m)] += 1.0
    np.testing.assert_array_equal(bottom[0].diff, expected)


def test_the_cpu_paths_are_the_ones_under_test(pooling_path):
    for method in ("AVE", "MAX"):
        layer, _, _ = make_layer(pool_param(f"pool: {method} kernel_size: 3 stride: 2"),
                                 [(1, 1, 8, 8)], rules=pooling_path[1])
        way = pooling_path[0]
        expected = {"compiled": "compiled-loops", "offset-passes": "offset-passes",
                    "numpy": "window-gemm" if method == "AVE" else "offset-passes"}[way]
        assert layer.choice.path == expected
        if method == "MAX" and way != "compiled":
            assert layer.choice.option("max_backward") == (
                "gather" if way == "offset-passes" else "index-scatter")


def test_max_never_picks_padding(pooling_path):
    x = -np.arange(1.0, 10.0).reshape(1, 1, 3, 3)
    layer, bottom, top = make_layer(pool_param("pool: MAX kernel_size: 2 stride: 2 pad: 1"),
                                    [x], rules=pooling_path[1])
    layer.forward(bottom, top)
    assert np.all(top[0].data < 0)
    np.testing.assert_array_equal(top[0].data[0, 0], [[-1, -2], [-4, -5]])


def test_ave_counts_padding_but_not_overhang(pooling_path):
    x = np.ones((1, 1, 3, 3))
    layer, bottom, top = make_layer(pool_param("pool: AVE kernel_size: 3 stride: 1 pad: 1"),
                                    [x], rules=pooling_path[1])
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data[0, 0], [[4 / 9, 6 / 9, 4 / 9], [6 / 9, 1, 6 / 9],
                                                   [4 / 9, 6 / 9, 4 / 9]])
    # 4x4 input, kernel 3, stride 2, ceil: the last window overhangs the unpadded input; Caffe
    # divides by the part inside the (zero) padded extent: here 2 rows, not 3.
    x = np.ones((1, 1, 4, 4))
    layer, bottom, top = make_layer(pool_param("pool: AVE kernel_size: 3 stride: 2"), [x],
                                    rules=pooling_path[1])
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data[0, 0], [[1, 1], [1, 1]])


@pytest.mark.parametrize("method", ["MAX", "AVE"])
def test_bottom_diff_overwritten_and_propagate_down_respected(method, pooling_path):
    layer, bottom, top = make_layer(pool_param(f"pool: {method} kernel_size: 3 stride: 2"),
                                    [(1, 2, 7, 7)], rules=pooling_path[1])
    layer.forward(bottom, top)
    top[0].diff[...] = np.random.default_rng(1).standard_normal(top[0].shape)
    bottom[0].diff[...] = 5.0
    layer.backward(top, [False], bottom)
    np.testing.assert_array_equal(bottom[0].diff, 5.0)
    layer.backward(top, [True], bottom)
    first = bottom[0].diff.copy()
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, first)
    # Every window lies inside the input here, so each top diff is handed out whole.
    np.testing.assert_allclose(first.sum(), top[0].diff.sum(), rtol=1e-12)


def test_float32(pooling_path):
    layer, bottom, top = make_layer(pool_param("pool: MAX kernel_size: 3 stride: 2", n_top=2),
                                    [(2, 3, 9, 9)], dtype=np.float32, rules=pooling_path[1])
    layer.forward(bottom, top)
    expected, mask = naive_pool(bottom[0].data, (3, 3), (2, 2), (0, 0), "MAX")
    np.testing.assert_array_equal(top[0].data, expected.astype(np.float32))
    np.testing.assert_array_equal(top[1].data, mask)
    assert top[0].data.dtype == np.float32 and top[1].data.dtype == np.float32


def test_reshape_follows_new_input_shapes(pooling_path):
    layer, bottom, top = make_layer(pool_param("pool: AVE kernel_size: 3 stride: 2 pad: 1"),
                                    [(1, 1, 6, 6)], rules=pooling_path[1])
    bottom[0].reshape(2, 3, 9, 7)
    bottom[0].data[...] = np.random.default_rng(3).standard_normal((2, 3, 9, 7))
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    expected, _ = naive_pool(bottom[0].data, (3, 3), (2, 2), (1, 1), "AVE")
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-12)


@pytest.mark.parametrize("body,shape,n_top,message", [
    ("pool: AVE kernel_size: 2", (1, 1, 4, 4), 2, "only MAX pooling has a second"),
    ("global_pooling: true kernel_size: 2", (1, 1, 4, 4), 1, "kernel size may not be given"),
    ("global_pooling: true stride: 2", (1, 1, 4, 4), 1, "only pad 0 and stride 1"),
    ("kernel_size: 2 kernel_h: 2 kernel_w: 2", (1, 1, 4, 4), 1, "not both"),
    ("kernel_h: 2", (1, 1, 4, 4), 1, "is required"),
    ("kernel_size: 2", (1, 4, 4), 1, "must have 4 axes"),
    ("kernel_size: 2 pad: 2", (1, 1, 4, 4), 1, "smaller than the kernel"),
    ("kernel_size: 2 pad: 1 pad_h: 1 pad_w: 1", (1, 1, 4, 4), 1, "pad is pad OR"),
    ("kernel_size: 5", (1, 1, 3, 3), 1, "empty output"),
])
def test_errors_name_the_layer(body, shape, n_top, message, pooling_path):
    with pytest.raises(LayerError, match=f"'bad_pool'.*{message}"):
        make_layer(pool_param(body, name="bad_pool", n_top=n_top), [shape], rules=pooling_path[1])
