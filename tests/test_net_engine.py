"""The Net's two parts, split as Caffe splits them: the engine (net.NetEngine, Caffe's C++
Net) runs layers by index; pycaffe's Net (net.pycaffe, Caffe's python/caffe/pycaffe.py)
reaches the same blobs and runs by name."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from mgcaffe.layer_types.base import TRAIN
from mgcaffe.net import Net, NetEngine
from mgcaffe.proto import caffe_pb2

SMALL = """
name: "small" force_backward: true
layer { name: "data" type: "Input" top: "data" top: "target"
  input_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 4 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
  inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 1 }
                        bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
  inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 1 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip2" bottom: "target" top: "loss" }
"""

#: pycaffe's names: on the pycaffe Net, not on the engine
PYCAFFE_NAMES = ("blobs", "params", "inputs", "outputs", "top_names", "bottom_names",
                 "blob_loss_weights", "layer_dict", "forward", "backward", "forward_all",
                 "backward_all", "forward_backward_all", "set_input_arrays", "share_with",
                 "save", "save_hdf5", "load_hdf5")


def small():
    return text_format.Parse(SMALL, caffe_pb2.NetParameter())


def inputs():
    rng = np.random.default_rng(7)
    return (rng.standard_normal((2, 3)).astype(np.float32),
            rng.standard_normal((2, 4)).astype(np.float32))


def expected(layers, x, t):
    """The loss and d loss / d x of ip2(relu(ip1(x))) against t, in float64."""
    (w1, b1), (w2, b2) = ([p.data.astype(np.float64) for p in layers[i].blobs] for i in (1, 3))
    h = x @ w1.T + b1
    y = np.maximum(h, 0) @ w2.T + b2
    dy = (y - t) / len(x)  # EuclideanLoss: sum((y - t)^2) / 2N
    return float(((y - t) ** 2).sum() / (2 * len(x))), ((dy @ w2) * (h > 0)) @ w1


def test_the_engine_runs_by_index():
    engine = NetEngine(small(), TRAIN, seed=3)
    g = engine.graph
    x, t = inputs()
    blobs = dict(zip(g.blob_names, g.blobs))
    blobs["data"].data[...] = x
    blobs["target"].data[...] = t
    done = []
    loss = engine.forward_from_to(0, len(engine.layers) - 1)
    engine.backward_from_to(len(engine.layers) - 1, 0, done.append)
    want_loss, want_dx = expected(engine.layers, x, t)
    assert loss == pytest.approx(want_loss, rel=1e-5) and engine.loss == loss
    np.testing.assert_allclose(blobs["data"].diff, want_dx, rtol=1e-4, atol=1e-6)
    assert done == [2, 1]  # learnable layers ip2, ip1: output side first
    assert [g.blob_names[i] for i in g.input_ids] == ["data", "target"]


def test_a_range_of_layers_runs_alone():
    engine = NetEngine(small(), TRAIN, seed=3)
    ip1, ip2 = (engine.graph.blobs[engine.graph.blob_names.index(n)] for n in ("ip1", "ip2"))
    engine.forward_from_to(0, engine.layer_id("relu"))
    assert ip1.data.any() and not ip2.data.any()


def test_pycaffe_runs_the_same_net_by_name():
    x, t = inputs()
    net = Net(small(), TRAIN, seed=3)
    net.blobs["data"].data[...] = x
    net.blobs["target"].data[...] = t
    out = net.forward(blobs=["ip2"])
    want_loss, want_dx = expected(net.layers, x, t)
    assert out["loss"] == pytest.approx(want_loss, rel=1e-5)
    assert out["ip2"] is net.graph.blobs[net.graph.blob_names.index("ip2")].data
    diffs = net.backward(diffs=["data"])
    np.testing.assert_allclose(diffs["data"], want_dx, rtol=1e-4, atol=1e-6)
    assert list(net.params) == ["ip1", "ip2"] and net.outputs == ["loss"]


def test_pycaffe_names_are_the_pycaffe_nets_alone():
    engine, net = NetEngine(small(), TRAIN), Net(small(), TRAIN)
    assert [n for n in PYCAFFE_NAMES if hasattr(engine, n)] == []
    assert [n for n in PYCAFFE_NAMES if not hasattr(net, n)] == []
    assert isinstance(net, NetEngine)
