"""Scale and Bias: broadcasting over axis/num_axes, learned or bottom operand, gradients."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from gradient_check import check_layer_gradients, make_layer
from layer_rules import changed

from mgcaffe.blob import Blob
from mgcaffe.errors import LayerError
from mgcaffe.layer_types import LayerContext, create_layer
from mgcaffe.proto import caffe_pb2

X_SHAPE = (2, 3, 4, 5)


def param(type_: str, text: str = "") -> caffe_pb2.LayerParameter:
    return text_format.Parse(f'name: "s" type: "{type_}" {text}', caffe_pb2.LayerParameter())


def broadcast_reference(x, operand, axis, op):
    """Apply `operand` along x's axes axis.. with explicit index loops."""
    out = np.empty_like(x)
    k = operand.ndim
    for index in np.ndindex(*x.shape):
        o = operand[index[axis:axis + k]] if k else operand
        out[index] = op(x[index], o)
    return out


# (axis, num_axes, operand shape for X_SHAPE, effective axis)
CONFIGS = [
    (1, 1, (3,), 1),
    (0, 2, (2, 3), 0),
    (-1, 1, (5,), 3),
    (2, -1, (4, 5), 2),
    (1, 0, (), 0),
    (0, -1, X_SHAPE, 0),
]


def _text(kind, axis, num_axes, extra=""):
    return f"{kind}_param {{ axis: {axis} num_axes: {num_axes} {extra} }}"


@pytest.mark.parametrize("axis,num_axes,shape,eff", CONFIGS)
@pytest.mark.parametrize("bias_term", [False, True])
def test_scale_learned(axis, num_axes, shape, eff, bias_term):
    extra = "bias_term: true" if bias_term else ""
    x = np.random.default_rng(0).standard_normal(X_SHAPE)
    layer, bottom, top = make_layer(param("Scale", _text("scale", axis, num_axes, extra)), [x])
    assert layer.blobs[0].shape == shape
    np.testing.assert_array_equal(layer.blobs[0].data, 1.0)  # default filler: constant 1
    assert len(layer.blobs) == (2 if bias_term else 1)
    rng = np.random.default_rng(1)
    layer.blobs[0].data[...] = rng.standard_normal(shape)
    expected = broadcast_reference(x, layer.blobs[0].data, eff, np.multiply)
    if bias_term:
        assert layer.blobs[1].shape == shape
        np.testing.assert_array_equal(layer.blobs[1].data, 0.0)
        layer.blobs[1].data[...] = rng.standard_normal(shape)
        expected = broadcast_reference(expected, layer.blobs[1].data, eff, np.add)
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-12)
    check_layer_gradients(layer, bottom, top, max_checks=40)


@pytest.mark.parametrize("axis,num_axes,shape,eff", CONFIGS)
@pytest.mark.parametrize("bias_term", [False, True])
def test_scale_from_second_bottom(axis, num_axes, shape, eff, bias_term):
    extra = "bias_term: true" if bias_term else ""
    rng = np.random.default_rng(2)
    x, s = rng.standard_normal(X_SHAPE), rng.standard_normal(shape)
    layer, bottom, top = make_layer(param("Scale", _text("scale", axis, num_axes, extra)),
                                    [x, s])
    assert len(layer.blobs) == (1 if bias_term else 0)
    expected = broadcast_reference(x, s, eff, np.multiply)
    if bias_term:
        assert layer.blobs[0].shape == shape
        layer.blobs[0].data[...] = rng.standard_normal(shape)
        expected = broadcast_reference(expected, layer.blobs[0].data, eff, np.add)
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-12)
    check_layer_gradients(layer, bottom, top, max_checks=40)


@pytest.mark.parametrize("axis,num_axes,shape,eff", CONFIGS)
def test_bias(axis, num_axes, shape, eff):
    rng = np.random.default_rng(3)
    x, b = rng.standard_normal(X_SHAPE), rng.standard_normal(shape)
    layer, bottom, top = make_layer(param("Bias", _text("bias", axis, num_axes)), [x])
    np.testing.assert_array_equal(layer.blobs[0].data, 0.0)
    layer.blobs[0].data[...] = b
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, broadcast_reference(x, b, eff, np.add))
    check_layer_gradients(layer, bottom, top, max_checks=40)
    layer2, bottom2, top2 = make_layer(param("Bias", _text("bias", axis, num_axes)), [x, b])
    assert layer2.blobs == []
    layer2.forward(bottom2, top2)
    np.testing.assert_allclose(top2[0].data, top[0].data)
    check_layer_gradients(layer2, bottom2, top2, max_checks=40)


def test_fillers_are_used():
    text = ('scale_param { bias_term: true filler { type: "constant" value: 3 } '
            'bias_filler { type: "constant" value: -2 } }')
    layer, _, _ = make_layer(param("Scale", text), [X_SHAPE])
    np.testing.assert_array_equal(layer.blobs[0].data, 3)
    np.testing.assert_array_equal(layer.blobs[1].data, -2)


def test_param_diffs_accumulate_and_bottom_operand_overwrites():
    rng = np.random.default_rng(4)
    x, s = rng.standard_normal((2, 3)), rng.standard_normal((3,))
    layer, bottom, top = make_layer(param("Scale", "scale_param { bias_term: true }"), [x])
    top[0].diff[...] = 1.0
    for _ in range(2):
        layer.forward(bottom, top)
        layer.backward(top, [True], bottom)
    np.testing.assert_allclose(layer.blobs[0].diff, 2 * x.sum(axis=0))
    np.testing.assert_allclose(layer.blobs[1].diff, 2 * np.full(3, 2.0))
    layer, bottom, top = make_layer(param("Scale"), [x, s])
    top[0].diff[...] = 1.0
    for _ in range(2):
        layer.forward(bottom, top)
        layer.backward(top, [True, True], bottom)
    np.testing.assert_allclose(bottom[1].diff, x.sum(axis=0))


@pytest.mark.parametrize("type_,text", [("Scale", "scale_param { bias_term: true }"),
                                        ("Bias", "")])
def test_in_place_matches_out_of_place(type_, text):
    rng = np.random.default_rng(5)
    x, dy = rng.standard_normal(X_SHAPE), rng.standard_normal(X_SHAPE)
    values = rng.standard_normal((3,))
    results = []
    for in_place in (False, True):
        layer = create_layer(param(type_, text), LayerContext(dtype=np.float64))
        bottom = Blob(X_SHAPE, dtype=np.float64)
        bottom.data[...] = x
        top = bottom if in_place else Blob((), dtype=np.float64)
        layer.setup([bottom], [top])
        layer.blobs[0].data[...] = values
        layer.forward([bottom], [top])
        y = top.data.copy()
        top.diff[...] = dy
        layer.backward([top], [True], [bottom])
        results.append((y, bottom.diff.copy(), [b.diff.copy() for b in layer.blobs]))
    (y0, dx0, p0), (y1, dx1, p1) = results
    np.testing.assert_allclose(y1, y0)
    np.testing.assert_allclose(dx1, dx0)
    for a, b in zip(p0, p1):
        np.testing.assert_allclose(b, a)


@pytest.mark.parametrize("type_,bottoms", [
    ("Scale", [X_SHAPE, (4,)]), ("Bias", [X_SHAPE, (3, 5)]), ("Scale", [X_SHAPE, (9,)])])
def test_operand_shape_mismatch(type_, bottoms):
    with pytest.raises(LayerError, match="'s'"):
        make_layer(param(type_), bottoms)


def test_num_axes_past_the_end():
    with pytest.raises(LayerError, match="extends past"):
        make_layer(param("Scale", "scale_param { axis: 2 num_axes: 3 }"), [X_SHAPE])


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scale_row_blocks_on_threads(in_place, dtype, compiled):
    """The CPU path over blocks of (outer, channel) rows, on two threads with one-row chunks,
    as compiled loops or numpy calls: forward bit for bit as x * s + b, backward against sums
    written out here, from stale bottom diffs and lazily cleared parameter diffs."""
    from mgcaffe.cpu.parallel import ChunkRunner
    from mgcaffe.kernels.loops import scale as scale_loops

    if compiled and scale_loops.load() is None:
        pytest.skip("numba is not importable: the compiled loops cannot run")

    rng = np.random.default_rng(7)
    shape = (3, 4, 5, 6)
    x, dy = rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype)
    s, b = rng.standard_normal(4).astype(dtype), rng.standard_normal(4).astype(dtype)
    # this test's rows are short: row blocks forward too
    rules = changed(scale={"compiled_loops": compiled, "fused_forward_min_inner": 1})
    ctx = LayerContext(dtype=dtype, chunk_runner=ChunkRunner(2, chunk_elements=1,
                                                             serial_below=0, adaptive=False),
                       rules=rules)
    layer = create_layer(param("Scale", "scale_param { bias_term: true }"), ctx)
    bottom = Blob(shape, dtype=dtype)
    bottom.data[...] = x
    top = bottom if in_place else Blob((), dtype=dtype)
    layer.setup([bottom], [top])
    assert layer.choice.path == ("compiled-rows" if compiled else "row-blocks")
    layer.blobs[0].data[...] = s
    layer.blobs[1].data[...] = b
    layer.forward([bottom], [top])
    expected = np.empty_like(x)
    for n, c in np.ndindex(3, 4):
        expected[n, c] = x[n, c] * s[c]
        expected[n, c] += b[c]
    np.testing.assert_array_equal(top.data, expected)
    if not in_place:
        bottom.diff[...] = 123.0  # stale: must be overwritten
    top.diff[...] = dy
    for blob in layer.blobs:
        blob.diff[...] = np.nan  # poisoned raw memory under a lazy clear
        blob.clear_diff_lazily()
    layer.backward([top], [True], [bottom])
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    ds = [sum(float(v) for v in (dy64[:, c] * x64[:, c]).ravel()) for c in range(4)]
    db = [sum(float(v) for v in dy64[:, c].ravel()) for c in range(4)]
    # Compiled, the sums are float64, rounded once to float32.
    tol = 1e-12 if dtype == np.float64 else 1e-6 if compiled else 1e-5
    np.testing.assert_allclose(layer.blobs[0].diff, ds, rtol=tol, atol=tol)
    np.testing.assert_allclose(layer.blobs[1].diff, db, rtol=tol, atol=tol)
    np.testing.assert_array_equal(bottom.diff, dy * s.reshape(1, 4, 1, 1))
    top.diff[...] = dy  # in place, the first backward overwrote it with the bottom diff
    layer.backward([top], [False], [bottom])  # the parameter diffs accumulate
    np.testing.assert_allclose(layer.blobs[1].diff, 2 * np.array(db), rtol=tol, atol=tol)


def test_compiled_scale_rows_repeat_bit_for_bit_on_any_thread_count():
    """Each row is summed by one thread in the compiled loops, so 1 and 3 threads (one-row
    chunks) give the same bits, forward and backward, in ResNet's in-place form."""
    from mgcaffe.cpu.parallel import ChunkRunner
    from mgcaffe.kernels.loops import scale as scale_loops

    if scale_loops.load() is None:
        pytest.skip("numba is not importable: the compiled loops cannot run")
    rng = np.random.default_rng(11)
    shape = (2, 8, 7, 7)
    x, dy = rng.standard_normal(shape, np.float32), rng.standard_normal(shape, np.float32)
    results = []
    for threads in (1, 3):
        ctx = LayerContext(dtype=np.float32, chunk_runner=ChunkRunner(
            threads, chunk_elements=1, serial_below=0, adaptive=False))
        layer = create_layer(param("Scale", "scale_param { bias_term: true }"), ctx)
        blob = Blob(shape, dtype=np.float32)
        blob.data[...] = x
        layer.setup([blob], [blob])
        layer.blobs[0].data[...] = np.linspace(-2, 2, 8)
        layer.blobs[1].data[...] = np.linspace(1, -1, 8)
        layer.forward([blob], [blob])
        top = blob.data.copy()
        blob.diff[...] = dy
        layer.backward([blob], [True], [blob])
        results.append((top, blob.diff.copy(), layer.blobs[0].diff.copy(),
                        layer.blobs[1].diff.copy()))
    for one, three in zip(*results):
        np.testing.assert_array_equal(one, three)
