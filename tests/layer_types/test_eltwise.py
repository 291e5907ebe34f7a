"""Eltwise: SUM with coefficients, PROD (both gradient forms), MAX with Caffe's tie rule."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from gradient_check import check_layer_gradients, make_layer

from mgcaffe.errors import LayerError
from mgcaffe.proto import caffe_pb2

SHAPE = (2, 3, 2, 3)


def param(text: str = "") -> caffe_pb2.LayerParameter:
    return text_format.Parse(f'name: "e" type: "Eltwise" eltwise_param {{ {text} }}',
                             caffe_pb2.LayerParameter())


def inputs(n, seed=0, shape=SHAPE):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for _ in range(n)]


@pytest.mark.parametrize("n,coeff", [(2, None), (3, None), (2, [0.5, -2.0]),
                                     (3, [1.0, 0.0, 3.0])])
def test_sum(n, coeff):
    xs = inputs(n)
    text = "operation: SUM " + " ".join(f"coeff: {c}" for c in coeff or [])
    layer, bottom, top = make_layer(param(text), xs)
    layer.forward(bottom, top)
    expected = sum((c if coeff else 1.0) * x for c, x in zip(coeff or [1.0] * n, xs))
    np.testing.assert_allclose(top[0].data, expected)
    check_layer_gradients(layer, bottom, top, max_checks=40)


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("stable", [True, False])
def test_prod(n, stable):
    # Away from zero, so y / x_i (the unstable gradient) is well defined.
    xs = [np.sign(x) * (np.abs(x) + 0.2) for x in inputs(n, seed=1)]
    text = f"operation: PROD stable_prod_grad: {str(stable).lower()}"
    layer, bottom, top = make_layer(param(text), xs)
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, np.prod(np.stack(xs), axis=0))
    check_layer_gradients(layer, bottom, top, max_checks=40)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_max_forward_and_gradient(n):
    xs = inputs(n, seed=2)
    layer, bottom, top = make_layer(param("operation: MAX"), xs)
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, np.max(np.stack(xs), axis=0))
    check_layer_gradients(layer, bottom, top, max_checks=40)


def max_winner_reference(columns):
    """Caffe's rule for one position: second wins ties with the first; later inputs take
    over only when strictly greater."""
    best, winner = (columns[0], 0) if columns[0] > columns[1] else (columns[1], 1)
    for i, v in enumerate(columns[2:], start=2):
        if v > best:
            best, winner = v, i
    return winner


def test_max_ties_follow_caffe():
    a = np.array([1.0, 2.0, 2.0, 0.0, 5.0])
    b = np.array([1.0, 1.0, 2.0, 3.0, 5.0])
    c = np.array([1.0, 2.0, 2.0, 3.0, 4.0])
    layer, bottom, top = make_layer(param("operation: MAX"), [a, b, c])
    layer.forward(bottom, top)
    top[0].diff[...] = np.arange(1.0, 6.0)
    layer.backward(top, [True, True, True], bottom)
    for k in range(5):
        winner = max_winner_reference([a[k], b[k], c[k]])
        for i in range(3):
            assert bottom[i].diff[k] == (top[0].diff[k] if i == winner else 0.0), (k, i)
    # Spot-check the rule: tie of a and b goes to b, a later equal input does not take over.
    assert bottom[1].diff[0] == 1.0 and bottom[0].diff[0] == 0 and bottom[2].diff[0] == 0
    assert bottom[0].diff[1] == 2.0 and bottom[2].diff[1] == 0


def test_backward_respects_propagate_down():
    xs = inputs(2, seed=3)
    layer, bottom, top = make_layer(param("operation: SUM"), xs)
    layer.forward(bottom, top)
    bottom[1].diff[...] = 7.0
    top[0].diff[...] = 1.0
    layer.backward(top, [True, False], bottom)
    np.testing.assert_array_equal(bottom[0].diff, 1.0)
    np.testing.assert_array_equal(bottom[1].diff, 7.0)


@pytest.mark.parametrize("text,shapes,match", [
    ("operation: SUM coeff: 1", [SHAPE, SHAPE], "coeff"),
    ("operation: PROD coeff: 1 coeff: 2", [SHAPE, SHAPE], "SUM"),
    ("operation: SUM", [SHAPE, (2, 3, 2, 2)], "same shape"),
])
def test_errors(text, shapes, match):
    with pytest.raises(LayerError, match=match):
        make_layer(param(text), shapes)


def test_needs_two_bottoms():
    with pytest.raises(LayerError, match="at least 2"):
        make_layer(param(), [SHAPE])


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("coeff", [None, [0.5, -2.0, 1.0]])
def test_sum_float32_and_in_place(in_place, coeff):
    """SUM in float32: the forward as a left-to-right sum written out here (same bits), each
    bottom diff coeff_i * dy, also when the top is bottom 0 (in place: its diff is the top
    diff, scaled only after the others read it)."""
    from mgcaffe.blob import Blob
    from mgcaffe.layer_types import LayerContext, create_layer

    rng = np.random.default_rng(3)
    shape = (2, 3, 5, 7)
    xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    dy = rng.standard_normal(shape).astype(np.float32)
    c = [np.float32(v) for v in (coeff or [1, 1, 1])]
    text = "operation: SUM " + " ".join(f"coeff: {v}" for v in coeff or [])
    layer = create_layer(param(text), LayerContext(dtype=np.float32))
    bottom = [Blob(shape, dtype=np.float32) for _ in xs]
    for blob, x in zip(bottom, xs):
        blob.data[...] = x
        blob.diff[...] = 123.0
    top = bottom[0] if in_place else Blob((), dtype=np.float32)
    layer.setup(bottom, [top])
    layer.forward(bottom, [top])
    expected = (xs[0] + xs[1] if coeff is None else xs[0] * c[0] + xs[1] * c[1]) + xs[2] * c[2]
    np.testing.assert_array_equal(top.data, expected)
    top.diff[...] = dy
    layer.backward([top], [True, True, True], bottom)
    for i in range(3):
        np.testing.assert_array_equal(bottom[i].diff, dy * c[i])
