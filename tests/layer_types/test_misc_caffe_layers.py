"""Embed, MVN, BatchReindex, Filter, InfogainLoss, HDF5Output: forward vs naive code, gradients."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from google.protobuf import text_format
from gradient_check import check_layer_gradients, make_layer

from mgcaffe.errors import LayerError
from mgcaffe.formats.protoio import write_binaryproto
from mgcaffe.proto import caffe_pb2


def lp(text, tops=1):
    p = text_format.Parse(text, caffe_pb2.LayerParameter())
    p.top.extend(f"t{i}" for i in range(tops))
    return p


# -- Embed ---------------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False])
def test_embed_forward_and_gradients(bias):
    idx = np.array([[0, 3, 3], [4, 1, 0]], dtype=float)
    p = lp(f'name: "e" type: "Embed" embed_param {{ num_output: 3 input_dim: 5 '
           f'bias_term: {str(bias).lower()} weight_filler {{ type: "gaussian" std: 1 }} '
           f'bias_filler {{ type: "gaussian" std: 1 }} }}')
    layer, bottom, top = make_layer(p, [idx])
    assert [b.shape for b in layer.blobs] == [(5, 3)] + ([(3,)] if bias else [])
    layer.forward(bottom, top)
    w = layer.blobs[0].data
    for i, j in np.ndindex(idx.shape):
        want = w[int(idx[i, j])] + (layer.blobs[1].data if bias else 0)
        np.testing.assert_allclose(top[0].data[i, j], want)
    check_layer_gradients(layer, bottom, top, check_bottom=[])


def test_embed_rejects_bad_indices():
    p = lp('name: "e" type: "Embed" embed_param { num_output: 2 input_dim: 3 }')
    for bad, message in ((3.0, "out of range"), (-1.0, "out of range"), (1.5, "non-integer")):
        layer, bottom, top = make_layer(p, [np.array([0.0, bad])])
        with pytest.raises(LayerError, match=message):
            layer.forward(bottom, top)


# -- MVN -----------------------------------------------------------------------------------
@pytest.mark.parametrize("body", ["", "normalize_variance: false", "across_channels: true",
                                  "across_channels: true normalize_variance: false"])
def test_mvn_forward_and_gradients(body):
    x = np.random.default_rng(1).standard_normal((2, 3, 2, 3)) * 2 + 1
    layer, bottom, top = make_layer(lp(f'name: "m" type: "MVN" mvn_param {{ {body} }}'), [x])
    layer.forward(bottom, top)
    want = np.zeros_like(x)
    for n in range(2):
        groups = [(n, slice(None))] if "across" in body else [(n, c) for c in range(3)]
        for g in groups:
            v = x[g]
            out = v - v.mean()
            if "normalize_variance: false" not in body:
                out = out / (np.sqrt(((v - v.mean()) ** 2).mean()) + 1e-9)
            want[g] = out
    np.testing.assert_allclose(top[0].data, want, rtol=1e-10, atol=1e-12)
    check_layer_gradients(layer, bottom, top, eps=1e-6, rtol=1e-5, atol=1e-7)


# -- BatchReindex --------------------------------------------------------------------------
def test_batch_reindex_forward_and_gradients():
    x = np.random.default_rng(2).standard_normal((4, 2, 3))
    index = np.array([2, 0, 2, 3, 2], dtype=float)
    layer, bottom, top = make_layer(lp('name: "r" type: "BatchReindex"'), [x, index])
    layer.forward(bottom, top)
    assert top[0].shape == (5, 2, 3)
    for k, i in enumerate(index.astype(int)):
        np.testing.assert_array_equal(top[0].data[k], x[i])
    check_layer_gradients(layer, bottom, top, check_bottom=[0])
    bottom[1].data[...] = [0, 1, 4, 0, 0]
    with pytest.raises(LayerError, match="batch size"):
        layer.forward(bottom, top)


# -- Filter --------------------------------------------------------------------------------
def test_filter_forward_and_gradients():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((5, 2)), rng.standard_normal((5, 3, 2))
    selector = np.array([[1.0], [0.0], [0.0], [2.0], [1.0]])
    layer, bottom, top = make_layer(lp('name: "f" type: "Filter"', tops=2), [a, b, selector])
    assert top[0].shape == (5, 2)  # Caffe's first reshape keeps every item
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data, a[[0, 3, 4]])
    np.testing.assert_array_equal(top[1].data, b[[0, 3, 4]])
    check_layer_gradients(layer, bottom, top, check_bottom=[0, 1])
    top[0].diff[...] = 1
    layer.backward(top, [True, False, False], bottom)
    np.testing.assert_array_equal(bottom[0].diff[[1, 2]], 0)
    with pytest.raises(LayerError, match="selector"):
        layer.backward(top, [True, True, True], bottom)


# -- InfogainLoss --------------------------------------------------------------------------
def naive_infogain(scores, labels, h, ignore=None):
    """axis 1 softmax; loss over (n, spatial) positions, VALID normalisation."""
    n, c = scores.shape[:2]
    s = scores.reshape(n, c, -1)
    lab = labels.reshape(n, -1)
    total, count = 0.0, 0
    for i in range(n):
        for j in range(s.shape[2]):
            if ignore is not None and lab[i, j] == ignore:
                continue
            p = np.exp(s[i, :, j] - s[i, :, j].max())
            p /= p.sum()
            total -= sum(h[int(lab[i, j]), k] * np.log(max(p[k], 1e-20)) for k in range(c))
            count += 1
    return total / max(count, 1)


@pytest.mark.parametrize("ignore", [None, 1])
def test_infogain_loss_with_matrix_bottom(ignore):
    rng = np.random.default_rng(4)
    scores = rng.standard_normal((3, 4, 2))
    labels = rng.integers(0, 4, size=(3, 2)).astype(float)
    h = rng.uniform(0, 1, size=(4, 4))
    body = f"loss_param {{ ignore_label: {ignore} }}" if ignore is not None else ""
    layer, bottom, top = make_layer(lp(f'name: "i" type: "InfogainLoss" {body}'),
                                    [scores, labels, h])
    layer.forward(bottom, top)
    np.testing.assert_allclose(float(top[0].data), naive_infogain(scores, labels, h, ignore),
                               rtol=1e-12)
    check_layer_gradients(layer, bottom, top, check_bottom=[0], eps=1e-6, rtol=1e-5)


def test_infogain_identity_equals_softmax_loss_and_reads_source(tmp_path):
    rng = np.random.default_rng(5)
    scores, labels = rng.standard_normal((4, 3)), np.array([0.0, 2.0, 1.0, 2.0])
    path = tmp_path / "h.binaryproto"
    write_binaryproto(np.eye(3).reshape(1, 1, 3, 3), path)
    layer, bottom, top = make_layer(lp(f'name: "i" type: "InfogainLoss" infogain_loss_param '
                                       f'{{ source: "{path}" }}', tops=2), [scores, labels])
    layer.forward(bottom, top)
    prob = np.exp(scores) / np.exp(scores).sum(axis=1, keepdims=True)
    want = -np.mean(np.log(prob[np.arange(4), labels.astype(int)]))
    np.testing.assert_allclose(float(top[0].data), want, rtol=1e-12)
    np.testing.assert_allclose(top[1].data, prob, rtol=1e-12)
    check_layer_gradients(layer, bottom, top, check_bottom=[0], top_indices=[0])
    with pytest.raises(LayerError, match="source"):
        make_layer(lp('name: "i" type: "InfogainLoss"'), [scores, labels])
    with pytest.raises(LayerError, match="deprecated"):
        make_layer(lp('name: "i" type: "InfogainLoss" loss_param { normalize: true }'),
                   [scores, labels, np.eye(3)])


# -- HDF5Output ----------------------------------------------------------------------------
def test_hdf5_output_writes_data_and_label(tmp_path):
    path = tmp_path / "out.h5"
    rng = np.random.default_rng(6)
    data, label = rng.standard_normal((3, 2, 2)), rng.standard_normal((3, 1))
    p = lp(f'name: "o" type: "HDF5Output" hdf5_output_param {{ file_name: "{path}" }}',
           tops=0)
    layer, bottom, top = make_layer(p, [data, label], top_count=0)
    layer.forward(bottom, top)
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["data"][...], data.reshape(3, 2, 2, 1))
        np.testing.assert_array_equal(f["label"][...], label.reshape(3, 1, 1, 1))
    bottom[0].data[...] = 7
    layer.forward(bottom, top)
    with h5py.File(path, "r") as f:
        assert (f["data"][...] == 7).all()
