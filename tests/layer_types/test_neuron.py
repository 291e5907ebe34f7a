"""Neuron layers: forward against formulas written here, gradients, in-place runs, Dropout."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from gradient_check import check_layer_gradients, make_layer

from mgcaffe.blob import Blob
from mgcaffe.errors import LayerError
from mgcaffe.layer_types import TEST, TRAIN, LayerContext, create_layer
from mgcaffe.proto import caffe_pb2

SHAPE = (2, 3, 4, 5)


def param(type_: str, text: str = "") -> caffe_pb2.LayerParameter:
    return text_format.Parse(f'name: "n" type: "{type_}" {text}', caffe_pb2.LayerParameter())


def away_from_zero(shape, seed=0, margin=0.1):
    """Standard normal values pushed at least `margin` away from 0 (the kinks)."""
    z = np.random.default_rng(seed).standard_normal(shape)
    return np.sign(z) * (np.abs(z) + margin)


def f32(value):
    """A prototxt float as the layer sees it (proto floats are single precision)."""
    return float(np.float32(value))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# (type, parameter text, input, reference forward)
CASES = [
    ("ReLU", "", away_from_zero(SHAPE), lambda x: np.maximum(x, 0)),
    ("ReLU", "relu_param { negative_slope: 0.2 }", away_from_zero(SHAPE),
     lambda x: np.where(x > 0, x, f32(0.2) * x)),
    ("ReLU", "relu_param { negative_slope: -0.5 }", away_from_zero(SHAPE),
     lambda x: np.where(x > 0, x, f32(-0.5) * x)),
    ("ELU", "", away_from_zero(SHAPE), lambda x: np.where(x > 0, x, np.exp(x) - 1)),
    ("ELU", "elu_param { alpha: 0.5 }", away_from_zero(SHAPE),
     lambda x: np.where(x > 0, x, f32(0.5) * (np.exp(x) - 1))),
    ("ELU", "elu_param { alpha: -0.3 }", away_from_zero(SHAPE),
     lambda x: np.where(x > 0, x, f32(-0.3) * (np.exp(x) - 1))),
    ("Sigmoid", "", away_from_zero(SHAPE), sigmoid),
    ("TanH", "", away_from_zero(SHAPE), np.tanh),
    ("AbsVal", "", away_from_zero(SHAPE), np.abs),
    ("BNLL", "", away_from_zero(SHAPE) * 3, lambda x: np.log(1 + np.exp(x))),
    ("Clip", "clip_param { min: -0.5 max: 0.7 }", away_from_zero(SHAPE),
     lambda x: np.clip(x, f32(-0.5), f32(0.7))),
    ("Swish", "", away_from_zero(SHAPE), lambda x: x * sigmoid(x)),
    ("Swish", "swish_param { beta: 1.7 }", away_from_zero(SHAPE),
     lambda x: x * sigmoid(f32(1.7) * x)),
    ("Power", "", away_from_zero(SHAPE), lambda x: x),
    ("Power", "power_param { power: 2 scale: 0.5 shift: 1 }", away_from_zero(SHAPE),
     lambda x: (1 + f32(0.5) * x) ** 2),
    ("Power", "power_param { power: 0.5 scale: 2 shift: 10 }", away_from_zero(SHAPE),
     lambda x: np.sqrt(10 + 2 * x)),
    ("Power", "power_param { power: -1.5 scale: -1 shift: 5 }", away_from_zero(SHAPE),
     lambda x: (5 - x) ** f32(-1.5)),
    ("Power", "power_param { power: 3 scale: 0 shift: 2 }", away_from_zero(SHAPE),
     lambda x: np.full_like(x, f32(8.0))),
    ("Exp", "", away_from_zero(SHAPE), np.exp),
    ("Exp", "exp_param { base: 2 scale: 0.5 shift: 1 }", away_from_zero(SHAPE),
     lambda x: f32(2.0) ** (1 + f32(0.5) * x)),
    ("Log", "", np.abs(away_from_zero(SHAPE)) + 0.5, np.log),
    ("Log", "log_param { base: 10 scale: 2 shift: 3 }", away_from_zero(SHAPE) * 0.5,
     lambda x: np.log10(3 + 2 * x)),
]
IDS = [f"{t}-{i}" for i, (t, *_rest) in enumerate(CASES)]


@pytest.mark.parametrize("type_,text,x,reference", CASES, ids=IDS)
def test_forward_matches_formula(type_, text, x, reference):
    layer, bottom, top = make_layer(param(type_, text), [x])
    layer.forward(bottom, top)
    assert top[0].shape == x.shape
    np.testing.assert_allclose(top[0].data, reference(x), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("type_,text,x,reference", CASES, ids=IDS)
def test_gradients(type_, text, x, reference):
    layer, bottom, top = make_layer(param(type_, text), [x])
    check_layer_gradients(layer, bottom, top, max_checks=60)


def run_layer(layer_param, x, dy, in_place, phase=TRAIN, seed=3):
    """Forward then backward on float64 blobs; returns (top data, bottom diff)."""
    layer = create_layer(layer_param, LayerContext(phase=phase, dtype=np.float64, seed=seed))
    bottom = Blob(x.shape, dtype=np.float64, name="x")
    bottom.data[...] = x
    top = bottom if in_place else Blob((), dtype=np.float64, name="y")
    layer.setup([bottom], [top])
    layer.forward([bottom], [top])
    y = top.data.copy()
    top.diff[...] = dy
    layer.backward([top], [True], [bottom])
    return y, bottom.diff.copy(), layer


@pytest.mark.parametrize("type_,text,x,reference", CASES, ids=IDS)
def test_in_place_matches_out_of_place(type_, text, x, reference):
    dy = np.random.default_rng(7).standard_normal(x.shape)
    y_ref, dx_ref, _ = run_layer(param(type_, text), x, dy, in_place=False)
    y, dx, _ = run_layer(param(type_, text), x, dy, in_place=True)
    np.testing.assert_allclose(y, y_ref, rtol=1e-12)
    np.testing.assert_allclose(dx, dx_ref, rtol=1e-12, atol=1e-14)


def test_threshold_forward_and_no_backward():
    x = away_from_zero(SHAPE)
    layer, bottom, top = make_layer(param("Threshold", "threshold_param { threshold: 0.3 }"),
                                    [x])
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data, (x > 0.3).astype(float))
    assert not layer.allow_force_backward(0)
    layer.backward(top, [False], bottom)  # nothing asked: fine
    with pytest.raises(LayerError, match="'n'"):
        layer.backward(top, [True], bottom)


def test_bad_exp_and_log_bases_are_rejected():
    for type_, text in (("Exp", "exp_param { base: -2 }"), ("Log", "log_param { base: 0 }")):
        with pytest.raises(LayerError, match="base"):
            make_layer(param(type_, text), [SHAPE])


# -- PReLU ---------------------------------------------------------------------------------

def prelu_reference(x, slopes, shared):
    out = np.empty_like(x)
    for n in range(x.shape[0]):
        for c in range(x.shape[1]):
            a = slopes if shared else slopes[c]
            v = x[n, c]
            out[n, c] = np.where(v > 0, v, a * v)
    return out


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (4, 3)])
def test_prelu(shared, shape):
    text = "prelu_param { channel_shared: %s }" % ("true" if shared else "false")
    x = away_from_zero(shape)
    layer, bottom, top = make_layer(param("PReLU", text), [x])
    slope = layer.blobs[0]
    assert slope.shape == (() if shared else (shape[1],))
    np.testing.assert_array_equal(slope.data, 0.25)  # Caffe's default filler
    slope.data[...] = 0.25 if shared else np.linspace(-0.3, 0.6, shape[1])
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, prelu_reference(x, slope.data, shared))
    check_layer_gradients(layer, bottom, top, max_checks=60)


def test_prelu_param_gradient_accumulates_and_in_place_matches():
    x = away_from_zero(SHAPE)
    dy = np.random.default_rng(2).standard_normal(SHAPE)
    _, dx_ref, ref = run_layer(param("PReLU"), x, dy, in_place=False)
    _, dx, lay = run_layer(param("PReLU"), x, dy, in_place=True)
    np.testing.assert_allclose(dx, dx_ref)
    np.testing.assert_allclose(lay.blobs[0].diff, ref.blobs[0].diff)
    expected = ((dy * x) * (x <= 0)).sum(axis=(0, 2, 3))
    np.testing.assert_allclose(ref.blobs[0].diff, expected)
    # A second backward adds to the parameter diff.
    top = Blob(SHAPE, dtype=np.float64)
    bottom = Blob(SHAPE, dtype=np.float64)
    bottom.data[...] = x
    ref.reshape([bottom], [top])
    ref.forward([bottom], [top])
    top.diff[...] = dy
    ref.backward([top], [False], [bottom])
    np.testing.assert_allclose(ref.blobs[0].diff, 2 * expected)


def test_prelu_filler_is_used():
    layer, _, _ = make_layer(
        param("PReLU", 'prelu_param { filler { type: "constant" value: 0.1 } }'), [SHAPE])
    np.testing.assert_allclose(layer.blobs[0].data, 0.1)


# -- Dropout -------------------------------------------------------------------------------

@pytest.mark.parametrize("ratio", [0.0, 0.3, 0.5, 0.8])
def test_dropout_train_scales_kept_values(ratio):
    x = np.abs(away_from_zero((50, 40)))  # no zeros, so dropped values are recognisable
    dy = np.random.default_rng(1).standard_normal(x.shape)
    y, dx, _ = run_layer(param("Dropout", f"dropout_param {{ dropout_ratio: {ratio} }}"),
                         x, dy, in_place=False)
    kept = y != 0
    np.testing.assert_allclose(y[kept], x[kept] / (1 - ratio))
    np.testing.assert_allclose(dx, np.where(kept, dy / (1 - ratio), 0))
    assert abs((1 - kept.mean()) - ratio) < 0.05


def test_dropout_in_place_and_seeded():
    x = np.abs(away_from_zero((30, 30)))
    dy = np.ones_like(x)
    text = "dropout_param { dropout_ratio: 0.4 }"
    y1, dx1, _ = run_layer(param("Dropout", text), x, dy, in_place=True, seed=5)
    y2, dx2, _ = run_layer(param("Dropout", text), x, dy, in_place=False, seed=5)
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(dx1, dx2)
    y3, _, _ = run_layer(param("Dropout", text), x, dy, in_place=False, seed=6)
    assert not np.array_equal(y1, y3)
    np.testing.assert_allclose(dx1, (y1 != 0) / 0.6)


@pytest.mark.parametrize("in_place", [False, True])
def test_dropout_test_phase_is_identity(in_place):
    x = away_from_zero((4, 5))
    dy = np.random.default_rng(1).standard_normal(x.shape)
    y, dx, _ = run_layer(param("Dropout"), x, dy, in_place=in_place, phase=TEST)
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(dx, dy)


def test_dropout_ratio_out_of_range():
    with pytest.raises(LayerError, match="dropout_ratio"):
        make_layer(param("Dropout", "dropout_param { dropout_ratio: 1 }"), [(2, 2)])


def test_float32_forward_stays_float32():
    for type_, text, x, _ in CASES[:8]:
        layer, bottom, top = make_layer(param(type_, text), [x.astype(np.float32)],
                                        dtype=np.float32)
        layer.forward(bottom, top)
        assert top[0].data.dtype == np.float32
