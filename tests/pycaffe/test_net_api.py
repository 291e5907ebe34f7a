"""pycaffe's Net and Blob names: layer_dict, _layer_names, HDF5 weights, forward_all /
backward_all, share_with, the per-layer hooks, num/channels/height/width, reshape."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

import mgcaffe
from mgcaffe.blob import Blob
from mgcaffe.errors import NetError
from mgcaffe.layer_types.base import Layer
from mgcaffe.layer_types.registry import _REGISTRY, register_layer
from mgcaffe.proto import caffe_pb2

DEPLOY = """
name: "small" force_backward: true
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 1 }
                        bias_filler { type: "constant" value: 0.5 } } }
layer { name: "relu" type: "ReLU" bottom: "ip" top: "ip" }
"""


@pytest.fixture
def net():
    return mgcaffe.Net(text_format.Parse(DEPLOY, caffe_pb2.NetParameter()), mgcaffe.TEST, seed=1)


def test_layer_dict_and_layer_names(net):
    assert list(net.layer_dict) == list(net._layer_names) == ["data", "ip", "relu"]
    assert [layer.type for layer in net.layer_dict.values()] == ["Input", "InnerProduct",
                                                                 "ReLU"]
    assert net.layer_dict["ip"] is net.layers[1]


def test_save_and_load_hdf5(net, tmp_path):
    path = str(tmp_path / "w.caffemodel.h5")
    net.params["ip"][0].data[...] = np.arange(12).reshape(4, 3)
    net.save_hdf5(path)
    other = mgcaffe.Net(text_format.Parse(DEPLOY, caffe_pb2.NetParameter()), mgcaffe.TEST,
                        seed=2)
    assert not np.array_equal(other.params["ip"][0].data, net.params["ip"][0].data)
    other.load_hdf5(path)
    for mine, theirs in zip(other.params["ip"], net.params["ip"]):
        np.testing.assert_array_equal(mine.data, theirs.data)
    import h5py  # noqa: PLC0415 - Caffe's layout: data/<layer>/<index>

    with h5py.File(path) as f:
        assert sorted(f["data"]["ip"]) == ["0", "1"]


def test_forward_all_and_backward_all_batch_and_unpad(net):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 3)).astype(np.float32)  # 5 items, batch size 2
    w, b = (p.data for p in net.params["ip"])
    out = net.forward_all(data=x)
    assert list(out) == ["ip"] and out["ip"].shape == (5, 4)
    np.testing.assert_allclose(out["ip"], np.maximum(x @ w.T + b, 0), rtol=1e-5, atol=1e-6)
    dy = rng.standard_normal((5, 4)).astype(np.float32)
    diffs = net.backward_all(ip=dy)
    # backward_all runs no forward: every batch sees the ReLU mask of the last forward
    # (forward_all's last batch, x[4] padded with a zero row).
    mask = (np.concatenate([x[4:], np.zeros((1, 3), np.float32)]) @ w.T + b) > 0
    want = np.concatenate([(dy[s:s + 2] * mask[:len(dy[s:s + 2])]) @ w for s in (0, 2, 4)])
    assert diffs["data"].shape == (5, 3)
    np.testing.assert_allclose(diffs["data"], want, rtol=1e-5, atol=1e-6)


def test_forward_backward_all(net):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 3)).astype(np.float32)
    dy = rng.standard_normal((3, 4)).astype(np.float32)
    w, b = (p.data for p in net.params["ip"])
    outs, diffs = net.forward_backward_all(data=x, ip=dy)
    np.testing.assert_allclose(outs["ip"], np.maximum(x @ w.T + b, 0), rtol=1e-5, atol=1e-6)
    # Each batch's backward follows its own forward: its own ReLU mask.
    mask = (x @ w.T + b) > 0
    np.testing.assert_allclose(diffs["data"], (dy * mask) @ w, rtol=1e-5, atol=1e-6)


def test_input_not_batch_sized(net):
    with pytest.raises(NetError, match="Input is not batch sized"):
        net.forward(data=np.zeros((3, 3)))
    with pytest.raises(NetError, match="Diff is not batch sized"):
        net.backward(ip=np.zeros((1, 4)))
    net.blobs["data"].reshape(3, 3)
    assert net.forward(data=np.zeros((3, 3)))["ip"].shape == (3, 4)


def test_share_with(net):
    other = mgcaffe.Net(text_format.Parse(DEPLOY, caffe_pb2.NetParameter()), mgcaffe.TEST,
                        seed=5)
    other.share_with(net)
    net.params["ip"][1].data[...] = 7
    np.testing.assert_array_equal(other.params["ip"][1].data, 7)


def test_hooks_run_around_each_layer_in_order(net):
    seen = []
    net.before_forward(lambda i: seen.append(("bf", i)))
    net.after_forward(lambda i: seen.append(("af", i)))
    net.before_backward(lambda i: seen.append(("bb", i)))
    net.after_backward(lambda i: seen.append(("ab", i)))
    net.forward()
    assert seen == [("bf", 0), ("af", 0), ("bf", 1), ("af", 1), ("bf", 2), ("af", 2)]
    seen.clear()
    net.backward()
    assert seen == [("bb", 2), ("ab", 2), ("bb", 1), ("ab", 1), ("bb", 0), ("ab", 0)]
    other = mgcaffe.Net(text_format.Parse(DEPLOY, caffe_pb2.NetParameter()), mgcaffe.TEST)
    other.forward()  # hooks belong to one net
    assert len(seen) == 6


def test_blob_legacy_dims_and_reshape_keeping_data():
    blob = Blob((2, 3, 4, 5))
    assert (blob.num, blob.channels, blob.height, blob.width, blob.count) == (2, 3, 4, 5, 120)
    vec = Blob((7,))
    assert (vec.num, vec.channels, vec.height, vec.width) == (7, 1, 1, 1)
    with pytest.raises(NetError, match="at most 4 axes"):
        Blob((1, 1, 1, 1, 2)).num  # noqa: B018
    values = np.arange(120, dtype=np.float32)
    blob.data[...] = values.reshape(2, 3, 4, 5)
    blob.diff[...] = 1
    blob.reshape(4, 30)  # same count: Caffe keeps the memory, so the values
    np.testing.assert_array_equal(blob.data, values.reshape(4, 30))
    assert blob.diff.shape == (4, 30) and (blob.diff == 1).all()
    blob.reshape(5, 5)  # another count: fresh zeros
    assert blob.shape == (5, 5) and not blob.data.any()


def test_reshape_keeps_aliases():
    a = Blob((2, 6))
    b = Blob((2, 6))
    b.share(a)
    b.reshape(3, 4)
    b.data[...] = 2
    assert (a.data == 2).all()


def test_layer_type_list_reads_the_registry():
    class Late(Layer):
        type = "LateAddedForTest"

    assert "LateAddedForTest" not in mgcaffe.layer_type_list()
    register_layer(Late)
    try:
        assert "LateAddedForTest" in mgcaffe.layer_type_list()
    finally:
        del _REGISTRY["LateAddedForTest"]
    for name in ("Data", "Convolution", "InnerProduct", "Python"):
        assert name in mgcaffe.layer_type_list()


def test_misc_pycaffe_functions(capsys):
    timer = mgcaffe.Timer()
    timer.start()
    timer.stop()
    assert timer.ms >= 0
    from mgcaffe.backend import gpu_available  # noqa: PLC0415

    if not gpu_available():
        assert mgcaffe.has_nccl() is False
    mgcaffe.set_multiprocess(True)
    mgcaffe.set_solver_count(3)
    mgcaffe.set_solver_rank(2)
    try:
        assert (mgcaffe.solver_count(), mgcaffe.solver_rank()) == (3, 2)
    finally:
        mgcaffe.set_solver_count(1)
        mgcaffe.set_solver_rank(0)
    mgcaffe.init_log(1)
    mgcaffe.log("not shown at level 1")
    mgcaffe.init_log()
    mgcaffe.log("hello from pycaffe code")
    err = capsys.readouterr().err
    assert "hello from pycaffe code" in err and "not shown" not in err
    assert err.startswith("I")  # glog's severity letter


def test_set_random_seed_makes_nets_repeatable():
    param = text_format.Parse(DEPLOY, caffe_pb2.NetParameter())
    try:
        mgcaffe.set_random_seed(11)
        a = mgcaffe.Net(param, mgcaffe.TEST).params["ip"][0].data.copy()
        b = mgcaffe.Net(param, mgcaffe.TEST).params["ip"][0].data.copy()
        mgcaffe.set_random_seed(12)
        c = mgcaffe.Net(param, mgcaffe.TEST).params["ip"][0].data.copy()
    finally:
        mgcaffe._random_seed = None
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
