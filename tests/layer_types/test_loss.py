"""EuclideanLoss, SigmoidCrossEntropyLoss and the extra losses: values and gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest
from google.protobuf import text_format
from gradient_check import check_layer_gradients, make_layer

from mgcaffe.errors import LayerError
from mgcaffe.proto import caffe_pb2


def param(type_: str, text: str = "") -> caffe_pb2.LayerParameter:
    return text_format.Parse(f'name: "loss" type: "{type_}" {text}', caffe_pb2.LayerParameter())


# -- EuclideanLoss -------------------------------------------------------------------------

@pytest.mark.parametrize("shape,label_shape", [((4, 3), (4, 3)), ((2, 3, 2, 2), (2, 12)),
                                               ((5,), (5,))])
def test_euclidean(shape, label_shape):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(shape), rng.standard_normal(label_shape)
    layer, bottom, top = make_layer(param("EuclideanLoss"), [a, b])
    assert layer.loss_weights == [1.0] and top[0].shape == ()
    layer.forward(bottom, top)
    total = sum((u - v) ** 2 for u, v in zip(a.reshape(-1), b.reshape(-1)))
    np.testing.assert_allclose(float(top[0].data), total / (2 * shape[0]))
    assert layer.allow_force_backward(1)
    check_layer_gradients(layer, bottom, top, max_checks=30)


def test_euclidean_gradient_scales_with_loss_weight():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((3, 2)), rng.standard_normal((3, 2))
    layer, bottom, top = make_layer(param("EuclideanLoss", "loss_weight: 3"), [a, b])
    layer.forward(bottom, top)
    layer.backward(top, [True, True], bottom)
    np.testing.assert_allclose(bottom[0].diff, 3 * (a - b) / 3)
    np.testing.assert_allclose(bottom[1].diff, -3 * (a - b) / 3)


def test_euclidean_count_mismatch():
    with pytest.raises(LayerError, match="same number"):
        make_layer(param("EuclideanLoss"), [(3, 2), (3, 3)])


# -- SigmoidCrossEntropyLoss ----------------------------------------------------------------

def sce_reference(x, t, ignore=None, mode="BATCH_SIZE"):
    total, valid = 0.0, 0
    for xi, ti in zip(x.reshape(-1), t.reshape(-1)):
        if ignore is not None and int(ti) == ignore:
            continue
        p = 1 / (1 + math.exp(-xi))
        total -= ti * math.log(p) + (1 - ti) * math.log(1 - p)
        valid += 1
    divisor = {"FULL": x.size, "VALID": valid, "BATCH_SIZE": x.shape[0], "NONE": 1}[mode]
    return total / max(divisor, 1)


@pytest.mark.parametrize("mode", [None, "FULL", "VALID", "BATCH_SIZE", "NONE"])
@pytest.mark.parametrize("ignore", [None, -1])
def test_sigmoid_cross_entropy(mode, ignore):
    rng = np.random.default_rng(2)
    shape = (3, 4, 2)
    x = rng.standard_normal(shape) * 3
    t = rng.random(shape)  # soft targets in [0, 1)
    if ignore is not None:
        t.reshape(-1)[::4] = ignore
    fields = (f"normalization: {mode} " if mode else "") + \
        (f"ignore_label: {ignore}" if ignore is not None else "")
    layer, bottom, top = make_layer(param("SigmoidCrossEntropyLoss",
                                          f"loss_param {{ {fields} }}"), [x, t])
    layer.forward(bottom, top)
    expected = sce_reference(x, t, ignore, mode or "BATCH_SIZE")
    np.testing.assert_allclose(float(top[0].data), expected, rtol=1e-10)
    check_layer_gradients(layer, bottom, top, check_bottom=[0], max_checks=30)


def test_sigmoid_cross_entropy_is_stable():
    x = np.array([[800.0, -800.0]])
    t = np.array([[0.0, 1.0]])
    layer, bottom, top = make_layer(param("SigmoidCrossEntropyLoss"), [x, t])
    layer.forward(bottom, top)
    np.testing.assert_allclose(float(top[0].data), 1600.0)
    layer.backward(top, [True, False], bottom)
    np.testing.assert_allclose(bottom[0].diff, [[1.0, -1.0]])


def test_sigmoid_cross_entropy_rejects_label_gradient():
    layer, bottom, top = make_layer(param("SigmoidCrossEntropyLoss"), [(2, 3), (2, 3)])
    layer.forward(bottom, top)
    with pytest.raises(LayerError, match="label"):
        layer.backward(top, [True, True], bottom)


# -- MultinomialLogisticLoss, HingeLoss, ContrastiveLoss -------------------------------------

def test_multinomial_logistic():
    rng = np.random.default_rng(3)
    p = rng.random((4, 5)) + 0.05
    p /= p.sum(axis=1, keepdims=True)
    labels = np.array([0.0, 4.0, 2.0, 2.0])
    layer, bottom, top = make_layer(param("MultinomialLogisticLoss"), [p, labels])
    layer.forward(bottom, top)
    expected = -sum(math.log(p[i, int(k)]) for i, k in enumerate(labels)) / 4
    np.testing.assert_allclose(float(top[0].data), expected)
    check_layer_gradients(layer, bottom, top, check_bottom=[0], max_checks=20)


@pytest.mark.parametrize("norm", ["L1", "L2"])
def test_hinge(norm):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 3)) * 2
    labels = np.array([0.0, 2.0, 1.0, 2.0])
    layer, bottom, top = make_layer(param("HingeLoss", f"hinge_loss_param {{ norm: {norm} }}"),
                                    [x, labels])
    layer.forward(bottom, top)
    total = 0.0
    for i in range(4):
        for j in range(3):
            t = 1 if j == int(labels[i]) else -1
            m = max(0.0, 1 - t * x[i, j])
            total += m if norm == "L1" else m * m
    np.testing.assert_allclose(float(top[0].data), total / 4)
    check_layer_gradients(layer, bottom, top, check_bottom=[0], max_checks=20)


@pytest.mark.parametrize("legacy", [False, True])
def test_contrastive(legacy):
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((6, 3)), rng.standard_normal((6, 3))
    y = np.array([1.0, 0.0, 0.0, 1.0, 0.0, 0.0])
    margin = 2.0 if not legacy else 6.0
    text = f"contrastive_loss_param {{ margin: {margin} legacy_version: {str(legacy).lower()} }}"
    layer, bottom, top = make_layer(param("ContrastiveLoss", text), [a, b, y])
    layer.forward(bottom, top)
    total = 0.0
    for i in range(6):
        d2 = float(((a[i] - b[i]) ** 2).sum())
        if y[i]:
            total += d2
        elif legacy:
            total += max(margin - d2, 0.0)
        else:
            total += max(margin - math.sqrt(d2), 0.0) ** 2
    np.testing.assert_allclose(float(top[0].data), total / 12)
    # Caffe's 1e-4 in the dissimilar gradient's denominator costs a little precision.
    check_layer_gradients(layer, bottom, top, check_bottom=[0, 1], rtol=2e-3, max_checks=18)
    assert not layer.allow_force_backward(2)


def test_out_of_range_class_label():
    layer, bottom, top = make_layer(param("HingeLoss"), [(2, 3), np.array([0.0, 3.0])])
    with pytest.raises(LayerError, match=r"'loss'.*label 3"):
        layer.forward(bottom, top)


def test_first_dimensions_must_match():
    with pytest.raises(LayerError, match="first dimension"):
        make_layer(param("SigmoidCrossEntropyLoss"), [(2, 3), (3, 2)])
