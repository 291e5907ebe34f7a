"""Softmax and SoftmaxWithLoss: forward against loops, normalisation modes, ignore_label,
label checks and gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest
from google.protobuf import text_format
from gradient_check import check_layer_gradients, make_layer

from mgcaffe.errors import LayerError
from mgcaffe.proto import caffe_pb2


def param(type_: str, text: str = "", tops: int = 1) -> caffe_pb2.LayerParameter:
    top_text = " ".join(f'top: "t{i}"' for i in range(tops))
    return text_format.Parse(f'name: "sm" type: "{type_}" {top_text} {text}',
                             caffe_pb2.LayerParameter())


def softmax_loops(x, axis):
    """Softmax over `axis` one fibre at a time."""
    out = np.empty_like(x)
    moved_in, moved_out = np.moveaxis(x, axis, -1), np.moveaxis(out, axis, -1)
    for index in np.ndindex(*moved_in.shape[:-1]):
        row = moved_in[index]
        e = [math.exp(v - max(row)) for v in row]
        moved_out[index] = [v / sum(e) for v in e]
    return out


@pytest.mark.parametrize("shape,axis", [((3, 5), 1), ((2, 3, 2, 2), 1), ((2, 3, 4), -1),
                                        ((4, 2, 3), 0)])
def test_softmax(shape, axis):
    x = np.random.default_rng(0).standard_normal(shape) * 3
    text = f"softmax_param {{ axis: {axis} }}"
    layer, bottom, top = make_layer(param("Softmax", text), [x])
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, softmax_loops(x, axis), rtol=1e-12)
    check_layer_gradients(layer, bottom, top, max_checks=40)


def test_softmax_is_stable_for_large_inputs():
    x = np.array([[1000.0, 1000.0, -1000.0]])
    layer, bottom, top = make_layer(param("Softmax"), [x])
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, [[0.5, 0.5, 0.0]])


def loss_reference(x, labels, axis=1, ignore=None, mode="VALID"):
    """Sum of -log(max(p, FLT_MIN)) over non-ignored positions, divided as `mode` says."""
    p = softmax_loops(x, axis)
    p = np.moveaxis(p, axis, -1).reshape(-1, x.shape[axis])
    labels = labels.reshape(-1).astype(int)
    total, valid = 0.0, 0
    for row, label in zip(p, labels):
        if label == ignore:
            continue
        total -= math.log(max(row[label], np.finfo(np.float32).tiny))
        valid += 1
    outer = int(np.prod(x.shape[:axis]))
    divisor = {"FULL": labels.size, "VALID": valid, "BATCH_SIZE": outer, "NONE": 1}[mode]
    return total / max(divisor, 1)


def scores_and_labels(shape, axis=1, seed=0, ignore=None):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    label_shape = shape[:axis] + shape[axis + 1:]
    labels = rng.integers(0, shape[axis], size=label_shape).astype(float)
    if ignore is not None:
        labels.reshape(-1)[::3] = ignore
    return x, labels


@pytest.mark.parametrize("mode", ["FULL", "VALID", "BATCH_SIZE", "NONE"])
@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 2, 3)])
@pytest.mark.parametrize("ignore", [None, 2, -1])
def test_softmax_loss_forward_and_gradient(mode, shape, ignore):
    x, labels = scores_and_labels(shape, ignore=ignore)
    text = f"loss_param {{ normalization: {mode} " + \
        (f"ignore_label: {ignore} " if ignore is not None else "") + "}"
    layer, bottom, top = make_layer(param("SoftmaxWithLoss", text), [x, labels])
    assert top[0].shape == ()
    assert layer.loss_weights == [1.0]
    layer.forward(bottom, top)
    expected = loss_reference(x, labels, ignore=ignore, mode=mode)
    np.testing.assert_allclose(float(top[0].data), expected, rtol=1e-10)
    check_layer_gradients(layer, bottom, top, check_bottom=[0], max_checks=40)


def test_ignored_positions_get_zero_gradient():
    x, labels = scores_and_labels((6, 4), ignore=-1)
    layer, bottom, top = make_layer(
        param("SoftmaxWithLoss", "loss_param { ignore_label: -1 }"), [x, labels])
    layer.forward(bottom, top)
    layer.backward(top, [True, False], bottom)
    np.testing.assert_array_equal(bottom[0].diff[labels == -1], 0.0)
    assert np.all(bottom[0].diff[labels != -1] != 0)


@pytest.mark.parametrize("normalize,mode", [(True, "VALID"), (False, "BATCH_SIZE")])
def test_legacy_normalize(normalize, mode):
    x, labels = scores_and_labels((2, 3, 2, 2), ignore=1)
    text = f"loss_param {{ ignore_label: 1 normalize: {str(normalize).lower()} }}"
    layer, bottom, top = make_layer(param("SoftmaxWithLoss", text), [x, labels])
    layer.forward(bottom, top)
    np.testing.assert_allclose(float(top[0].data),
                               loss_reference(x, labels, ignore=1, mode=mode))


def test_default_is_valid_and_all_ignored_gives_zero():
    x, labels = scores_and_labels((3, 4))
    labels[...] = 7
    layer, bottom, top = make_layer(
        param("SoftmaxWithLoss", "loss_param { ignore_label: 7 }"), [x, labels])
    layer.forward(bottom, top)
    assert float(top[0].data) == 0.0
    layer.backward(top, [True, False], bottom)
    np.testing.assert_array_equal(bottom[0].diff, 0.0)


def test_probability_top_and_axis():
    x, labels = scores_and_labels((2, 3, 4), axis=2)
    text = "softmax_param { axis: 2 }"
    layer, bottom, top = make_layer(param("SoftmaxWithLoss", text, tops=2), [x, labels])
    assert layer.loss_weights == [1.0, 0.0]
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[1].data, softmax_loops(x, 2))
    np.testing.assert_allclose(float(top[0].data), loss_reference(x, labels, axis=2))
    check_layer_gradients(layer, bottom, top, check_bottom=[0], top_indices=[0])


def test_gradient_scales_with_loss_weight():
    x, labels = scores_and_labels((3, 4))
    layer, bottom, top = make_layer(param("SoftmaxWithLoss", "loss_weight: 2.5"),
                                    [x, labels])
    np.testing.assert_allclose(top[0].diff, 2.5)
    layer.forward(bottom, top)
    layer.backward(top, [True, False], bottom)
    p = softmax_loops(x, 1)
    p[np.arange(3), labels.astype(int)] -= 1
    np.testing.assert_allclose(bottom[0].diff, 2.5 * p / 3)


@pytest.mark.parametrize("bad", [4.0, -2.0])
def test_label_out_of_range_names_layer_and_label(bad):
    x, labels = scores_and_labels((3, 4))
    labels[1] = bad
    layer, bottom, top = make_layer(param("SoftmaxWithLoss"), [x, labels])
    with pytest.raises(LayerError, match=rf"'sm'.*label {int(bad)}\b"):
        layer.forward(bottom, top)


def test_no_gradient_to_labels():
    x, labels = scores_and_labels((3, 4))
    layer, bottom, top = make_layer(param("SoftmaxWithLoss"), [x, labels])
    assert not layer.allow_force_backward(1)
    layer.forward(bottom, top)
    with pytest.raises(LayerError, match="label"):
        layer.backward(top, [True, True], bottom)


def test_label_count_must_match():
    with pytest.raises(LayerError, match="label count"):
        make_layer(param("SoftmaxWithLoss"), [(2, 3, 4), np.zeros((2, 3))])
