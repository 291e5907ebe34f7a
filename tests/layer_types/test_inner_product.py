"""InnerProduct: shapes, forward against explicit sums, gradients, accumulation, errors."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from google.protobuf import text_format
from gradient_check import check_layer_gradients, make_layer
from layer_rules import changed
from threadpoolctl import threadpool_limits

from mgcaffe.cpu.parallel import ChunkRunner, blas_threads
from mgcaffe.errors import LayerError
from mgcaffe.proto import caffe_pb2


def ip_param(body: str, name: str = "fc") -> caffe_pb2.LayerParameter:
    text = (f'name: "{name}" type: "InnerProduct" inner_product_param {{ {body} '
            'weight_filler { type: "gaussian" } bias_filler { type: "gaussian" } }')
    return text_format.Parse(text, caffe_pb2.LayerParameter())


CASES = [
    # body, bottom shape, top shape
    ("num_output: 4", (3, 2, 2, 3), (3, 4)),
    ("num_output: 5 transpose: true", (2, 6), (2, 5)),
    ("num_output: 3 bias_term: false", (2, 3, 2), (2, 3)),
    ("num_output: 3 axis: 2", (2, 3, 4, 2), (2, 3, 3)),
    ("num_output: 2 axis: -1 transpose: true", (2, 2, 5), (2, 2, 2)),
    ("num_output: 3 axis: 0", (2, 3), (3,)),
    # Few rows into >= 4x as many outputs: the forward computes top.T = W @ bottom.T.
    ("num_output: 9", (2, 5), (2, 9)),
    ("num_output: 8 bias_term: false", (2, 3, 2), (2, 8)),
]


def naive_ip(x, w, b, axis, transpose):
    m = int(np.prod(x.shape[:axis]))
    rows = x.reshape(m, -1)
    n_out = w.shape[1] if transpose else w.shape[0]
    out = np.zeros((m, n_out))
    for i, j in itertools.product(range(m), range(n_out)):
        weights = w[:, j] if transpose else w[j]
        out[i, j] = sum(rows[i, k] * weights[k] for k in range(rows.shape[1]))
        if b is not None:
            out[i, j] += b[j]
    return out.reshape(x.shape[:axis] + (n_out,))


@pytest.mark.parametrize("body,shape,top_shape", CASES)
def test_forward_matches_naive(body, shape, top_shape):
    layer, bottom, top = make_layer(ip_param(body), [shape])
    assert top[0].shape == top_shape
    k = int(np.prod(shape[layer.axis:]))
    n_out = top_shape[-1]
    assert layer.blobs[0].shape == ((k, n_out) if layer.transpose else (n_out, k))
    layer.forward(bottom, top)
    b = layer.blobs[1].data if layer.bias_term else None
    expected = naive_ip(bottom[0].data, layer.blobs[0].data, b, layer.axis, layer.transpose)
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("body,shape,top_shape", CASES)
def test_gradients(body, shape, top_shape):
    layer, bottom, top = make_layer(ip_param(body), [shape])
    check_layer_gradients(layer, bottom, top, max_checks=50)


@pytest.mark.parametrize("transpose", ["false", "true"])
def test_param_diffs_accumulate_and_bottom_diff_is_overwritten(transpose):
    layer, bottom, top = make_layer(ip_param(f"num_output: 3 transpose: {transpose}"),
                                    [(4, 5)])
    layer.forward(bottom, top)
    top[0].diff[...] = np.random.default_rng(2).standard_normal(top[0].shape)
    bottom[0].diff[...] = 3.0
    layer.backward(top, [True], bottom)
    first = [p.diff.copy() for p in layer.blobs]
    first_bottom = bottom[0].diff.copy()
    assert all(np.abs(f).sum() > 0 for f in first)
    layer.backward(top, [True], bottom)
    for p, f in zip(layer.blobs, first):
        np.testing.assert_allclose(p.diff, 2 * f, rtol=1e-12)
    np.testing.assert_allclose(bottom[0].diff, first_bottom, rtol=1e-12)


def test_propagate_down_false_leaves_bottom_diff_alone():
    layer, bottom, top = make_layer(ip_param("num_output: 3"), [(4, 5)])
    layer.forward(bottom, top)
    top[0].diff[...] = 1.0
    bottom[0].diff[...] = 3.0
    layer.backward(top, [False], bottom)
    np.testing.assert_array_equal(bottom[0].diff, 3.0)
    layer.param_propagate_down = [False, False]
    for p in layer.blobs:
        p.diff[...] = 0
    layer.backward(top, [True], bottom)
    assert all(np.all(p.diff == 0) for p in layer.blobs)
    assert not np.all(bottom[0].diff == 3.0)


def test_float32_stays_float32():
    layer, bottom, top = make_layer(ip_param("num_output: 3"), [(2, 4)], dtype=np.float32)
    layer.forward(bottom, top)
    assert top[0].data.dtype == np.float32
    layer.backward(top, [True], bottom)
    assert bottom[0].diff.dtype == np.float32 and layer.blobs[0].diff.dtype == np.float32


@pytest.mark.parametrize("body,message", [
    ("num_output: 0", "num_output must be positive"),
    ("num_output: 2 axis: 4", "axis 4 out of range"),
])
def test_errors_name_the_layer(body, message):
    with pytest.raises(LayerError, match=f"'bad_fc'.*{message}"):
        make_layer(ip_param(body, name="bad_fc"), [(2, 3)])


def test_reshape_keeps_k_fixed():
    layer, bottom, top = make_layer(ip_param("num_output: 2"), [(2, 3, 4)])
    bottom[0].reshape(5, 12)
    layer.reshape(bottom, top)
    assert top[0].shape == (5, 2)
    bottom[0].reshape(5, 11)
    with pytest.raises(LayerError, match="12 values per item"):
        layer.reshape(bottom, top)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("transpose", [False, True])
def test_weight_gradient_in_blocks_over_a_lazily_cleared_diff(transpose, threads, monkeypatch):
    """Few rows: a lazily cleared weight diff is written block by block (here 2 diff rows a
    block; 5 blocks, the last one short, in 3 chunks, or transposed 2 in 2), each block's GEMM
    on one BLAS thread whichever runner thread takes it, every element overwritten (the raw
    memory is poisoned with NaN), the same bits on 1 and 3 threads; the next backward
    accumulates."""
    body = "num_output: 9" + (" transpose: true" if transpose else "")
    weight_row = 9 if transpose else 4  # the weight is (4, 9) transposed, else (9, 4)
    rules = changed(inner_product={"overwrite_block_elements": 2 * weight_row,
                                   "overwrite_blocks_per_chunk": 1 if transpose else 2})
    layer, bottom, top = make_layer(ip_param(body), [(3, 4)], rules=rules)
    assert layer.choice.path == "small-batch"
    assert layer.choice.option("weight_grad") == "blocks"
    layer.ctx.chunk_runner = ChunkRunner(threads, chunk_elements=1, serial_below=1,
                                         adaptive=False)
    calls = _count_gemm_calls(monkeypatch)
    rng = np.random.default_rng(8)
    top[0].diff[...] = rng.standard_normal((3, 9))
    dy, x = top[0].diff.copy(), bottom[0].data.copy()
    expected = np.array([[sum(dy[m, n] * x[m, k] for m in range(3)) for k in range(4)]
                         for n in range(9)])
    if transpose:
        expected = expected.T
    weight = layer.blobs[0]
    weight.diff[...] = np.nan
    weight.clear_diff_lazily()
    layer.forward(bottom, top)
    layer.backward(top, [True], bottom)
    shapes = [shape for shape, _ in calls]
    assert sorted(shapes) == sorted([(2, 9)] * 2 if transpose else [(2, 4)] * 4 + [(1, 4)])
    assert {blas for _, blas in calls} == {1}
    np.testing.assert_allclose(weight.diff, expected, rtol=1e-12, atol=1e-12)
    first = weight.diff.copy()
    layer.backward(top, [True], bottom)
    np.testing.assert_allclose(weight.diff, 2 * expected, rtol=1e-12, atol=1e-12)
    weight.clear_diff_lazily()
    layer.ctx.chunk_runner = ChunkRunner(1)
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(weight.diff, first)


@pytest.mark.parametrize("slow", ["one call", "blocks"])
def test_adaptive_threads_keep_the_faster_way_to_overwrite_the_weight_diff(slow, monkeypatch):
    """With `--threads adaptive`, a lazily cleared weight diff is written both ways in the
    first calls (one GEMM, blocks of 2 rows) and then the faster way only (here the other
    way sleeps 50 ms a GEMM); the gradient is right whichever way ran."""
    from mgcaffe.layer_types import inner_product

    rules = changed(inner_product={"overwrite_block_elements": 2 * 4})  # 2 rows of (9, 4)
    layer, bottom, top = make_layer(ip_param("num_output: 9"), [(3, 4)], rules=rules)
    layer.ctx.adaptive_blas = True  # the net's engine is adaptive (`--threads adaptive`)
    calls, real = [], inner_product.gemm_accumulate

    def timed(a, b, c, *args):
        way = "one call" if c.shape[0] == 9 else "blocks"
        calls.append(way)
        if way == slow:
            time.sleep(0.05)
        real(a, b, c, *args)

    def backward_way():
        calls.clear()
        weight.diff[...] = np.nan
        weight.clear_diff_lazily()
        layer.backward(top, [False], bottom)
        assert len(set(calls)) == 1, calls
        return calls[0]

    monkeypatch.setattr(inner_product, "gemm_accumulate", timed)
    rng = np.random.default_rng(10)
    top[0].diff[...] = rng.standard_normal((3, 9))
    expected = top[0].diff.T @ bottom[0].data
    weight = layer.blobs[0]
    names = []
    for _ in range(10):
        names.append(backward_way())
        np.testing.assert_allclose(weight.diff, expected, rtol=1e-6, atol=1e-6)
    assert {"one call", "blocks"} <= set(names[:4]), names
    fast = "blocks" if slow == "one call" else "one call"
    assert names[-5:] == [fast] * 5, names
    layer.ctx.adaptive_blas = False
    assert backward_way() == "blocks"  # not asked: the blocks, the same bits every run


def _count_gemm_calls(monkeypatch) -> list:
    """Record each gemm_accumulate call the layer makes (its output shape)."""
    from mgcaffe.layer_types import inner_product

    calls, real = [], inner_product.gemm_accumulate

    def counting(a, b, c, *args):
        calls.append((c.shape, blas_threads()))
        real(a, b, c, *args)

    monkeypatch.setattr(inner_product, "gemm_accumulate", counting)
    return calls


def test_bottom_diff_summed_over_blocks_of_weight_rows(monkeypatch):
    """Few rows: the bottom diff sums blocks of 2 weight rows (5 blocks over 9 outputs, the
    last one short); the first block overwrites the stale diff."""
    rules = changed(inner_product={"dx_block_rows": 2})
    layer, bottom, top = make_layer(ip_param("num_output: 9"), [(3, 4)], rules=rules)
    assert layer.choice.option("input_grad") == "row-blocks"
    layer.param_propagate_down = [False, False]
    calls = _count_gemm_calls(monkeypatch)
    rng = np.random.default_rng(9)
    top[0].diff[...] = rng.standard_normal((3, 9))
    bottom[0].diff[...] = 123.0
    with threadpool_limits(1, user_api="blas"):  # the blocks run on one BLAS thread only
        layer.backward(top, [True], bottom)
    assert [shape for shape, _ in calls] == [(3, 4)] * 5
    dy, w = top[0].diff, layer.blobs[0].data
    expected = [[sum(dy[m, n] * w[n, k] for n in range(9)) for k in range(4)] for m in range(3)]
    np.testing.assert_allclose(bottom[0].diff, expected, rtol=1e-12, atol=1e-12)
