"""Data-movement layers: Concat, Slice, Split, Flatten, Reshape, Silence, Crop, Tile, Reduction."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from gradient_check import check_layer_gradients, make_layer

from mgcaffe.errors import LayerError
from mgcaffe.proto import caffe_pb2


def param(type_: str, text: str = "", tops: int = 1) -> caffe_pb2.LayerParameter:
    top_text = " ".join(f'top: "t{i}"' for i in range(tops))
    return text_format.Parse(f'name: "m" type: "{type_}" {top_text} {text}',
                             caffe_pb2.LayerParameter())


def arrays(*shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in shapes]


# -- Concat --------------------------------------------------------------------------------

@pytest.mark.parametrize("text,shapes,axis", [
    ("", [(2, 3, 2), (2, 1, 2), (2, 4, 2)], 1),
    ("concat_param { axis: 0 }", [(1, 3), (4, 3)], 0),
    ("concat_param { axis: -1 }", [(2, 3, 1), (2, 3, 2)], 2),
    ("concat_param { concat_dim: 2 }", [(2, 2, 3), (2, 2, 1)], 2),
])
def test_concat(text, shapes, axis):
    xs = arrays(*shapes)
    layer, bottom, top = make_layer(param("Concat", text), xs)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data, np.concatenate(xs, axis=axis))
    check_layer_gradients(layer, bottom, top, max_checks=30)


def test_concat_single_bottom_shares():
    (x,) = arrays((2, 3))
    layer, bottom, top = make_layer(param("Concat"), [x])
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data, x)
    check_layer_gradients(layer, bottom, top)


@pytest.mark.parametrize("text,shapes,match", [
    ("", [(2, 3, 2), (2, 3, 3)], "does not match"),
    ("concat_param { axis: 1 concat_dim: 1 }", [(2, 3), (2, 3)], "not both"),
    ("concat_param { axis: 3 }", [(2, 3), (2, 3)], "out of range"),
])
def test_concat_errors(text, shapes, match):
    with pytest.raises(LayerError, match=match):
        make_layer(param("Concat", text), shapes)


# -- Slice ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text,shape,tops,bounds,axis", [
    ("", (2, 6, 2), 3, [0, 2, 4, 6], 1),
    ("slice_param { axis: 0 slice_point: 1 slice_point: 3 }", (4, 2), 3, [0, 1, 3, 4], 0),
    ("slice_param { axis: -1 slice_point: 2 }", (2, 2, 5), 2, [0, 2, 5], 2),
    ("slice_param { slice_dim: 2 }", (2, 2, 4), 2, [0, 2, 4], 2),
])
def test_slice(text, shape, tops, bounds, axis):
    (x,) = arrays(shape)
    layer, bottom, top = make_layer(param("Slice", text, tops=tops), [x])
    layer.forward(bottom, top)
    for i, t in enumerate(top):
        np.testing.assert_array_equal(t.data, np.take(x, range(bounds[i], bounds[i + 1]),
                                                      axis=axis))
    check_layer_gradients(layer, bottom, top, max_checks=30)


@pytest.mark.parametrize("text,tops,match", [
    ("", 4, "evenly"),
    ("slice_param { slice_point: 1 }", 3, "slice_point"),
    ("slice_param { slice_point: 3 slice_point: 2 }", 3, "increase"),
    ("slice_param { slice_point: 7 }", 2, "increase"),
])
def test_slice_errors(text, tops, match):
    with pytest.raises(LayerError, match=match):
        make_layer(param("Slice", text, tops=tops), [(2, 6)])


# -- Split ---------------------------------------------------------------------------------

@pytest.mark.parametrize("tops", [1, 2, 3])
def test_split_shares_data_and_sums_diffs(tops):
    (x,) = arrays((2, 3, 4))
    layer, bottom, top = make_layer(param("Split", tops=tops), [x])
    layer.forward(bottom, top)
    for t in top:
        np.testing.assert_array_equal(t.data, x)
    bottom[0].data[0, 0, 0] = 42.0  # shared, not copied
    assert all(t.data[0, 0, 0] == 42.0 for t in top)
    diffs = arrays(*[x.shape] * tops, seed=1)
    for t, d in zip(top, diffs):
        t.diff[...] = d
    layer.backward(top, [True], bottom)
    np.testing.assert_allclose(bottom[0].diff, sum(diffs))
    check_layer_gradients(layer, bottom, top)


@pytest.mark.parametrize("tops", [1, 4])
def test_split_sums_diffs_in_parts_on_two_threads(tops):
    """The sum split into ranges over two threads (tiny chunks) covers every element once."""
    from mgcaffe.cpu.parallel import ChunkRunner

    (x,) = arrays((3, 5, 7))
    layer, bottom, top = make_layer(param("Split", tops=tops), [x], dtype=np.float32)
    layer.ctx.chunk_runner = ChunkRunner(2, chunk_elements=1, serial_below=1, adaptive=False)
    layer.forward(bottom, top)
    diffs = [d.astype(np.float32) for d in arrays(*[x.shape] * tops, seed=2)]
    for t, d in zip(top, diffs):
        t.diff[...] = d
    bottom[0].diff[...] = np.nan  # overwritten, not added to
    layer.backward(top, [True], bottom)
    expected = diffs[0].astype(np.float64)
    for d in diffs[1:]:
        expected = expected + d
    np.testing.assert_allclose(bottom[0].diff, expected, rtol=1e-6)


# -- Flatten and Reshape ---------------------------------------------------------------------

@pytest.mark.parametrize("text,shape,expected", [
    ("", (2, 3, 4, 5), (2, 60)),
    ("flatten_param { axis: 0 }", (2, 3, 4), (24,)),
    ("flatten_param { axis: 1 end_axis: 2 }", (2, 3, 4, 5), (2, 12, 5)),
    ("flatten_param { axis: -2 }", (2, 3, 4, 5), (2, 3, 20)),
])
def test_flatten(text, shape, expected):
    (x,) = arrays(shape)
    layer, bottom, top = make_layer(param("Flatten", text), [x])
    assert top[0].shape == expected
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data, x.reshape(expected))
    check_layer_gradients(layer, bottom, top, max_checks=30)


@pytest.mark.parametrize("dims,extra,shape,expected", [
    ([0, -1], "", (2, 3, 4), (2, 12)),
    ([-1], "", (2, 3, 4), (24,)),
    ([2, 2], "axis: 1 num_axes: 1", (3, 4, 5), (3, 2, 2, 5)),
    ([1], "axis: 1 num_axes: 0", (3, 4), (3, 1, 4)),
    ([0, 0, -1, 2], "", (2, 3, 4), (2, 3, 2, 2)),
    ([-1, 3], "axis: -2", (2, 4, 3), (2, 4, 1, 3)),
    ([6], "axis: 1 num_axes: 2", (2, 2, 3, 5), (2, 6, 5)),
])
def test_reshape(dims, extra, shape, expected):
    text = "reshape_param { shape { " + " ".join(f"dim: {d}" for d in dims) + f" }} {extra} }}"
    (x,) = arrays(shape)
    layer, bottom, top = make_layer(param("Reshape", text), [x])
    assert top[0].shape == expected
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data, x.reshape(expected))
    check_layer_gradients(layer, bottom, top, max_checks=30)


@pytest.mark.parametrize("dims,extra,match", [
    ([-1, -1], "", "more than one -1"),
    ([5, -1], "", "divisible"),
    ([0, 0, 0, 0], "", "no axis"),
    ([2], "axis: 1 num_axes: 5", "out of range"),
])
def test_reshape_errors(dims, extra, match):
    text = "reshape_param { shape { " + " ".join(f"dim: {d}" for d in dims) + f" }} {extra} }}"
    with pytest.raises(LayerError, match=match):
        make_layer(param("Reshape", text), [(2, 3, 4)])


def test_reshape_follows_new_input_shape():
    text = "reshape_param { shape { dim: 0 dim: -1 } }"
    layer, bottom, top = make_layer(param("Reshape", text), [(2, 3, 4)])
    bottom[0].reshape((5, 2, 2))
    layer.reshape(bottom, top)
    assert top[0].shape == (5, 4)


# -- Silence -------------------------------------------------------------------------------

def test_silence_zeroes_requested_diffs():
    layer, bottom, top = make_layer(param("Silence", tops=0), [(2, 3), (4,)], top_count=0)
    assert top == []
    layer.forward(bottom, top)
    for b in bottom:
        b.diff[...] = 5.0
    layer.backward(top, [True, False], bottom)
    np.testing.assert_array_equal(bottom[0].diff, 0.0)
    np.testing.assert_array_equal(bottom[1].diff, 5.0)


# -- Crop ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text,big,small,index", [
    ("", (2, 3, 6, 7), (2, 3, 4, 4), (slice(None), slice(None), slice(0, 4), slice(0, 4))),
    ("crop_param { offset: 1 }", (2, 3, 6, 7), (1, 1, 4, 5),
     (slice(None), slice(None), slice(1, 5), slice(1, 6))),
    ("crop_param { axis: 1 offset: 1 offset: 2 offset: 0 }", (2, 4, 6, 3), (1, 2, 3, 3),
     (slice(None), slice(1, 3), slice(2, 5), slice(0, 3))),
])
def test_crop(text, big, small, index):
    x, ref = arrays(big, small)
    layer, bottom, top = make_layer(param("Crop", text), [x, ref])
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data, x[index])
    check_layer_gradients(layer, bottom, top, check_bottom=[0], max_checks=40)
    assert not layer.allow_force_backward(1)


def test_crop_too_far():
    with pytest.raises(LayerError, match="exceeds"):
        make_layer(param("Crop", "crop_param { offset: 3 }"), [(1, 1, 5, 5), (1, 1, 3, 3)])


# -- Tile ----------------------------------------------------------------------------------

@pytest.mark.parametrize("axis,tiles,shape", [(1, 3, (2, 3, 2)), (0, 2, (2, 3)),
                                              (-1, 4, (2, 2, 3))])
def test_tile(axis, tiles, shape):
    (x,) = arrays(shape)
    layer, bottom, top = make_layer(param("Tile", f"tile_param {{ axis: {axis} "
                                                  f"tiles: {tiles} }}"), [x])
    layer.forward(bottom, top)
    a = axis % len(shape)
    reps = [1] * len(shape)
    reps[a] = tiles
    # np.tile of the block from `axis` on equals repeating each outer slice whole.
    expected = np.tile(x, reps)
    np.testing.assert_array_equal(top[0].data, expected)
    check_layer_gradients(layer, bottom, top, max_checks=30)


# -- Reduction -----------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["SUM", "ASUM", "SUMSQ", "MEAN"])
@pytest.mark.parametrize("axis,coeff", [(0, 1.0), (1, 0.5), (-1, -2.0), (2, 1.0)])
def test_reduction(op, axis, coeff):
    shape = (2, 3, 4)
    (x,) = arrays(shape)
    x = np.sign(x) * (np.abs(x) + 0.1)  # away from |x|'s kink
    text = f"reduction_param {{ operation: {op} axis: {axis} coeff: {coeff} }}"
    layer, bottom, top = make_layer(param("Reduction", text), [x])
    a = axis % 3
    assert top[0].shape == shape[:a]
    layer.forward(bottom, top)
    rows = x.reshape(int(np.prod(shape[:a])), -1)
    f = {"SUM": lambda r: r.sum(), "ASUM": lambda r: np.abs(r).sum(),
         "SUMSQ": lambda r: (r * r).sum(), "MEAN": lambda r: r.sum() / r.size}[op]
    expected = np.array([coeff * f(r) for r in rows]).reshape(shape[:a])
    np.testing.assert_allclose(top[0].data, expected)
    check_layer_gradients(layer, bottom, top, max_checks=30)
