"""Loss layers written without a `top` (Caffe's AutoTopBlobs): an anonymous top carries the
loss, which is computed, displayed and back-propagated, but is no net output."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest

from mgcaffe.errors import NetError
from mgcaffe.formats.protoio import parse_net_text
from mgcaffe.layer_types.base import TRAIN
from mgcaffe.net import Net
from mgcaffe.proto import caffe_pb2
from mgcaffe.solvers import get_solver

TRAIN_VAL = """
name: "no_top_loss"
layer {
  name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param {
    shape { dim: 8 dim: 6 } shape { dim: 8 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 2 }
  }
}
layer {
  name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } }
}
layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc"
        include { phase: TEST } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" %s }
"""


def _net(top: str = "", seed: int = 3) -> Net:
    return Net(parse_net_text(TRAIN_VAL % top), TRAIN, seed=seed)


def _softmax_loss(scores: np.ndarray, label: np.ndarray) -> float:
    shifted = scores - scores.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(label)), label.astype(int)].mean())


def test_loss_without_top_is_computed_and_back_propagated():
    net = _net()
    assert net.top_names["loss"] == ["(automatic)"]
    assert net.outputs == []  # an anonymous top is no output, as in Caffe
    net.clear_param_diffs()
    loss = net.forward_backward()
    expected = _softmax_loss(net.blobs["ip"].data.astype(np.float64), net.blobs["label"].data)
    assert loss == pytest.approx(expected, rel=1e-5)
    # The same net with a named top gives the same gradient.
    named = _net('top: "loss"')
    named.share_weights(net)
    named.clear_param_diffs()
    named.forward_backward()
    assert named.outputs == ["loss"]
    grad = net.params["ip"][0].diff
    assert np.abs(grad).max() > 0
    np.testing.assert_allclose(grad, named.params["ip"][0].diff, rtol=1e-5)


def test_anonymous_top_cannot_be_used_as_a_bottom():
    text = TRAIN_VAL % "" + 'layer { name: "s" type: "Silence" bottom: "(automatic)" }'
    with pytest.raises(NetError, match="unknown bottom blob '\\(automatic\\)'"):
        Net(parse_net_text(text), TRAIN)


def test_train_val_without_loss_top_trains_and_logs_its_loss(tmp_path, caplog):
    (tmp_path / "train_val.prototxt").write_text(TRAIN_VAL % "")
    solver = caffe_pb2.SolverParameter(net="train_val.prototxt", base_lr=0.5, lr_policy="fixed",
                                       max_iter=40, display=10, random_seed=5,
                                       snapshot_after_train=False)
    path = tmp_path / "solver.prototxt"
    path.write_text(str(solver))
    caplog.set_level(logging.INFO)
    get_solver(str(path)).solve()
    losses = [float(v) for v in re.findall(r"Iteration \d+ .*loss = ([-\d.e]+)", caplog.text)]
    assert len(losses) >= 4
    # Every label is 2: the loss falls from about ln 3 towards 0.
    assert losses[0] > 0.5 and losses[-1] < 0.5 * losses[0]
