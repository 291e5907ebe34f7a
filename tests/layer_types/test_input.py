"""Input, DummyData and Parameter layers."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from gradient_check import make_layer

from mgcaffe.errors import LayerError
from mgcaffe.proto import caffe_pb2


def param(type_: str, text: str = "", tops: int = 1) -> caffe_pb2.LayerParameter:
    top_text = " ".join(f'top: "t{i}"' for i in range(tops))
    return text_format.Parse(f'name: "in" type: "{type_}" {top_text} {text}',
                             caffe_pb2.LayerParameter())


def shape_text(field, *shapes):
    return " ".join(f"{field} {{ " + " ".join(f"dim: {d}" for d in s) + " }" for s in shapes)


@pytest.mark.parametrize("shapes,tops,expected", [
    ([(2, 3, 4, 4)], 1, [(2, 3, 4, 4)]),
    ([(5, 2)], 2, [(5, 2), (5, 2)]),
    ([(1, 3), (4,)], 2, [(1, 3), (4,)]),
])
def test_input_shapes(shapes, tops, expected):
    text = "input_param { " + shape_text("shape", *shapes) + " }"
    layer, bottom, top = make_layer(param("Input", text, tops=tops), [], top_count=tops)
    assert [t.shape for t in top] == expected
    top[0].data[...] = 3.0
    top[0].reshape((7,) + expected[0][1:])  # callers may reshape inputs; reshape keeps it
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    assert top[0].shape == (7,) + expected[0][1:]


def test_input_shape_count_mismatch():
    text = "input_param { " + shape_text("shape", (1,), (2,)) + " }"
    with pytest.raises(LayerError, match="shape"):
        make_layer(param("Input", text, tops=3), [], top_count=3)


def test_dummy_data_default_is_zero_and_shapes():
    text = "dummy_data_param { " + shape_text("shape", (2, 3), (4,)) + " }"
    layer, bottom, top = make_layer(param("DummyData", text, tops=2), [], top_count=2)
    assert [t.shape for t in top] == [(2, 3), (4,)]
    layer.forward(bottom, top)
    for t in top:
        np.testing.assert_array_equal(t.data, 0)


def test_dummy_data_legacy_dims():
    text = "dummy_data_param { num: 2 num: 3 channels: 4 height: 5 width: 1 width: 2 }"
    layer, _, top = make_layer(param("DummyData", text, tops=2), [], top_count=2)
    assert [t.shape for t in top] == [(2, 4, 5, 1), (3, 4, 5, 2)]


def test_dummy_data_constant_fills_once_others_refill():
    text = ('dummy_data_param { ' + shape_text("shape", (3, 4)) +
            ' data_filler { type: "constant" value: 1.5 } '
            ' data_filler { type: "gaussian" std: 2 } '
            ' data_filler { type: "uniform" min: -1 max: 3 } '
            ' data_filler { type: "xavier" } }')
    layer, bottom, top = make_layer(param("DummyData", text, tops=4), [], top_count=4)
    np.testing.assert_array_equal(top[0].data, 1.5)
    top[0].data[...] = 9.0  # a constant top is not refilled
    layer.forward(bottom, top)
    first = [t.data.copy() for t in top]
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data, 9.0)
    for i in (1, 2, 3):
        assert not np.array_equal(top[i].data, first[i])
    assert top[2].data.min() >= -1 and top[2].data.max() <= 3


def test_dummy_data_one_filler_for_all_tops():
    text = ('dummy_data_param { ' + shape_text("shape", (200,)) +
            ' data_filler { type: "gaussian" mean: 5 std: 0.1 } }')
    layer, bottom, top = make_layer(param("DummyData", text, tops=2), [], top_count=2)
    layer.forward(bottom, top)
    for t in top:
        assert abs(t.data.mean() - 5) < 0.05
    assert not np.array_equal(top[0].data, top[1].data)


@pytest.mark.parametrize("text,tops", [
    ('dummy_data_param { shape { dim: 1 } data_filler { } data_filler { } }', 3),
    ('dummy_data_param { shape { dim: 1 } shape { dim: 2 } }', 3),
    ('dummy_data_param { num: 1 shape { dim: 1 } }', 1),
    ('dummy_data_param { num: 1 num: 2 channels: 1 height: 1 width: 1 }', 3),
])
def test_dummy_data_errors(text, tops):
    with pytest.raises(LayerError, match="'in'"):
        make_layer(param("DummyData", text, tops=tops), [], top_count=tops)


def test_parameter_layer():
    text = "parameter_param { shape { dim: 2 dim: 3 } }"
    layer, bottom, top = make_layer(param("Parameter", text), [], top_count=1)
    assert layer.blobs[0].shape == (2, 3) and top[0].shape == (2, 3)
    layer.blobs[0].data[...] = np.arange(6.0).reshape(2, 3)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data, np.arange(6.0).reshape(2, 3))
    top[0].diff[...] = 1.0
    layer.backward(top, [], bottom)
    layer.backward(top, [], bottom)
    np.testing.assert_array_equal(layer.blobs[0].diff, 2.0)  # accumulates
