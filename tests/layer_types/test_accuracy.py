"""Accuracy (top_k, axis, ignore_label, per-class top, ties) and ArgMax."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from gradient_check import make_layer

from mgcaffe.errors import LayerError
from mgcaffe.proto import caffe_pb2


def param(type_: str, text: str = "", tops: int = 1) -> caffe_pb2.LayerParameter:
    top_text = " ".join(f'top: "t{i}"' for i in range(tops))
    return text_format.Parse(f'name: "acc" type: "{type_}" {top_text} {text}',
                             caffe_pb2.LayerParameter())


def accuracy_reference(scores, labels, top_k, ignore=None, classes=None):
    """Loop version: correct when fewer than top_k other classes score >= the label's."""
    hits, counts = np.zeros(classes), np.zeros(classes)
    for row, label in zip(scores, labels.astype(int)):
        if label == ignore:
            continue
        others = sum(1 for k, v in enumerate(row) if k != label and v >= row[label])
        counts[label] += 1
        hits[label] += others < top_k
    overall = hits.sum() / counts.sum() if counts.sum() else 0.0
    per_class = np.where(counts > 0, hits / np.maximum(counts, 1), 0.0)
    return overall, per_class


def rows_and_labels(scores, labels, axis):
    """Scores as (positions, classes) and labels flat, for a class axis `axis`."""
    moved = np.moveaxis(scores, axis, -1)
    return moved.reshape(-1, scores.shape[axis]), labels.reshape(-1)


@pytest.mark.parametrize("shape,axis", [((20, 5), 1), ((3, 4, 2, 2), 1), ((2, 3, 6), 2)])
@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize("ignore", [None, 1])
def test_accuracy(shape, axis, top_k, ignore):
    rng = np.random.default_rng(0)
    scores = rng.standard_normal(shape)
    classes = shape[axis]
    labels = rng.integers(0, classes, size=shape[:axis] + shape[axis + 1:]).astype(float)
    text = f"accuracy_param {{ top_k: {top_k} axis: {axis} " + \
        (f"ignore_label: {ignore} " if ignore is not None else "") + "}"
    layer, bottom, top = make_layer(param("Accuracy", text, tops=2), [scores, labels])
    assert top[0].shape == () and top[1].shape == (classes,)
    layer.forward(bottom, top)
    overall, per_class = accuracy_reference(*rows_and_labels(scores, labels, axis), top_k,
                                            ignore, classes)
    np.testing.assert_allclose(float(top[0].data), overall)
    np.testing.assert_allclose(top[1].data, per_class)


def test_ties_count_against_the_label():
    scores = np.array([[1.0, 1.0, 0.0], [0.5, 2.0, 2.0], [3.0, 1.0, 1.0]])
    labels = np.array([0.0, 2.0, 0.0])
    layer, bottom, top = make_layer(param("Accuracy"), [scores, labels])
    layer.forward(bottom, top)
    np.testing.assert_allclose(float(top[0].data), 1 / 3)


def test_all_ignored_gives_zero():
    layer, bottom, top = make_layer(param("Accuracy", "accuracy_param { ignore_label: 0 }"),
                                    [(3, 4), np.zeros(3)])
    layer.forward(bottom, top)
    assert float(top[0].data) == 0.0


def test_no_backward():
    layer, bottom, top = make_layer(param("Accuracy"), [(3, 4), np.zeros(3)])
    assert not layer.allow_force_backward(0)
    layer.backward(top, [False, False], bottom)
    with pytest.raises(LayerError, match="no gradient"):
        layer.backward(top, [True, False], bottom)


@pytest.mark.parametrize("text,bottoms,match", [
    ("accuracy_param { top_k: 5 }", [(3, 4), np.zeros(3)], "top_k"),
    ("", [(3, 4), np.zeros(4)], "label count"),
])
def test_accuracy_errors(text, bottoms, match):
    with pytest.raises(LayerError, match=match):
        make_layer(param("Accuracy", text), bottoms)


def test_label_out_of_range():
    layer, bottom, top = make_layer(param("Accuracy"), [(3, 4), np.array([0.0, 4.0, 1.0])])
    with pytest.raises(LayerError, match="label 4"):
        layer.forward(bottom, top)


# -- ArgMax --------------------------------------------------------------------------------

def top_k_reference(values, k):
    """Indices of the k largest, ties to the larger index (Caffe sorts (value, index) pairs
    descending)."""
    order = sorted(range(len(values)), key=lambda i: (values[i], i), reverse=True)
    return order[:k]


@pytest.mark.parametrize("top_k", [1, 3])
@pytest.mark.parametrize("out_max_val", [False, True])
def test_argmax_without_axis(top_k, out_max_val):
    x = np.random.default_rng(1).integers(0, 4, size=(3, 2, 3)).astype(float)  # many ties
    text = f"argmax_param {{ top_k: {top_k} out_max_val: {str(out_max_val).lower()} }}"
    layer, bottom, top = make_layer(param("ArgMax", text), [x])
    assert top[0].shape == (3, 2 if out_max_val else 1, top_k)
    layer.forward(bottom, top)
    for n in range(3):
        row = x[n].reshape(-1)
        idx = top_k_reference(list(row), top_k)
        np.testing.assert_array_equal(top[0].data[n, 0], idx)
        if out_max_val:
            np.testing.assert_array_equal(top[0].data[n, 1], row[idx])


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("out_max_val", [False, True])
def test_argmax_with_axis(axis, out_max_val):
    shape, top_k = (3, 4, 5), 2
    x = np.random.default_rng(2).integers(0, 3, size=shape).astype(float)
    text = f"argmax_param {{ top_k: {top_k} axis: {axis} out_max_val: " \
           f"{str(out_max_val).lower()} }}"
    layer, bottom, top = make_layer(param("ArgMax", text), [x])
    a = axis % 3
    expected_shape = list(shape)
    expected_shape[a] = top_k
    assert top[0].shape == tuple(expected_shape)
    layer.forward(bottom, top)
    moved_x, moved_y = np.moveaxis(x, a, -1), np.moveaxis(top[0].data, a, -1)
    for index in np.ndindex(*moved_x.shape[:-1]):
        row = list(moved_x[index])
        idx = top_k_reference(row, top_k)
        expected = [row[i] for i in idx] if out_max_val else idx
        np.testing.assert_array_equal(moved_y[index], expected)


def test_argmax_small_input_shape_and_errors():
    layer, bottom, top = make_layer(param("ArgMax"), [np.array([[1.0, 3.0, 2.0]])])
    assert top[0].shape == (1, 1, 1)
    layer.forward(bottom, top)
    assert top[0].data.reshape(-1)[0] == 1
    with pytest.raises(LayerError, match="top_k"):
        make_layer(param("ArgMax", "argmax_param { top_k: 4 }"), [(1, 3)])
    assert not layer.allow_force_backward(0)
