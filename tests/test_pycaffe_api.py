"""The pycaffe-style API: the names and habits of `import caffe` users, on LeNet."""

from __future__ import annotations

import numpy as np
import pytest

import mgcaffe
from mgcaffe.backend import CPU, Device
from mgcaffe.proto import caffe_pb2


@pytest.fixture
def lenet(repo_root, tmp_path):
    """LeNet's deploy net with force_backward (as saliency users set it), batch 2."""
    text = (repo_root / "models/lenet/lenet.prototxt").read_text()
    text = text.replace("dim: 64", "dim: 2", 1)
    path = tmp_path / "lenet.prototxt"
    path.write_text("force_backward: true\n" + text)
    return str(path)


def test_phases_and_mode_functions():
    assert mgcaffe.TRAIN == caffe_pb2.TRAIN and mgcaffe.TEST == caffe_pb2.TEST
    try:
        mgcaffe.set_mode_gpu()
        mgcaffe.set_device(1)
        assert mgcaffe.default_device() == Device("gpu", 1)
    finally:
        mgcaffe.set_mode_cpu()
        mgcaffe.set_device(0)
    assert mgcaffe.default_device() == CPU


def test_net_blobs_params_layers_forward_backward(lenet):
    net = mgcaffe.Net(lenet, mgcaffe.TEST)
    assert isinstance(net, mgcaffe.net.Net) and net.device == CPU
    assert net.inputs == ["data"] and net.outputs == ["prob"]
    assert list(net.params) == ["conv1", "conv2", "ip1", "ip2"]
    assert [layer.type for layer in net.layers][:3] == ["Input", "Convolution", "Pooling"]
    conv1 = net.layers[net.layer_id("conv1")]
    assert conv1.blobs[0] is net.params["conv1"][0]
    assert net.params["conv1"][0].data.shape == (20, 1, 5, 5)
    assert net.blobs["data"].shape == (2, 1, 28, 28)

    # Writable data, pycaffe's reshape(*shape), then forward.
    net.blobs["data"].reshape(3, 1, 28, 28)
    rng = np.random.default_rng(0)
    net.blobs["data"].data[...] = rng.uniform(0, 1, (3, 1, 28, 28))
    net.params["ip2"][1].data[...] = np.arange(10)
    out = net.forward()
    assert set(out) == {"prob"} and out["prob"].shape == (3, 10)
    np.testing.assert_allclose(out["prob"].sum(1), 1.0, rtol=1e-5)

    # forward(**inputs) with another batch size is pycaffe's error; reshape first.
    image = rng.uniform(0, 1, (1, 1, 28, 28)).astype(np.float32)
    with pytest.raises(mgcaffe.errors.NetError, match="Input is not batch sized"):
        net.forward(data=image)
    net.blobs["data"].reshape(*image.shape)
    prob = net.forward(data=image)["prob"]
    assert prob.shape == (1, 10) and net.blobs["conv1"].shape == (1, 20, 24, 24)

    # backward(**top_diffs) returns the input diffs; d(sum of prob)/d(data) is ~0.
    diffs = net.backward(prob=np.ones((1, 10), np.float32))
    assert diffs["data"].shape == (1, 1, 28, 28)
    assert np.abs(diffs["data"]).max() < 1e-5
    one_hot = np.zeros((1, 10), np.float32)
    one_hot[0, 3] = 1
    diffs = net.backward(prob=one_hot)
    assert np.abs(diffs["data"]).max() > 0
    np.testing.assert_array_equal(net.blobs["prob"].diff, one_hot)


def test_weights_both_constructor_forms_and_save(lenet, tmp_path):
    net = mgcaffe.Net(lenet, mgcaffe.TEST)
    net.params["conv1"][0].data[...] = 0.25
    net.params["ip2"][1].data[...] = np.arange(10)
    weights = str(tmp_path / "lenet.caffemodel")
    net.save(weights)
    for other in (mgcaffe.Net(lenet, mgcaffe.TEST, weights=weights),
                  mgcaffe.Net(lenet, weights, mgcaffe.TEST)):
        np.testing.assert_array_equal(other.params["conv1"][0].data, 0.25)
        np.testing.assert_array_equal(other.params["ip2"][1].data, np.arange(10))
        assert other.phase == mgcaffe.TEST
    fresh = mgcaffe.Net(lenet, mgcaffe.TEST)
    fresh.copy_from(weights)
    np.testing.assert_array_equal(fresh.params["ip2"][1].data, np.arange(10))
    with pytest.raises(mgcaffe.errors.NetError, match="phase"):
        mgcaffe.Net(lenet, weights)


def test_solver_names_are_exported_lazily():
    # mgcaffe.XSolver adds pycaffe's device rule (tests/pycaffe/test_solver_api.py) to
    # mgcaffe.solvers.XSolver, whose instances they are.
    for name in ("SGDSolver", "NesterovSolver", "AdaGradSolver", "RMSPropSolver",
                 "AdaDeltaSolver", "AdamSolver"):
        assert issubclass(getattr(mgcaffe, name), getattr(mgcaffe.solvers, name))
    assert callable(mgcaffe.get_solver)
    with pytest.raises(AttributeError):
        mgcaffe.NoSuchThing  # noqa: B018


@pytest.mark.gpu
def test_gpu_mode_matches_cpu(lenet):
    rng = np.random.default_rng(0)
    image = rng.uniform(0, 1, (2, 1, 28, 28)).astype(np.float32)
    cpu = mgcaffe.Net(lenet, mgcaffe.TEST, seed=1)
    expected = cpu.forward(data=image)["prob"].copy()
    expected_diff = cpu.backward(prob=np.eye(2, 10, dtype=np.float32))["data"].copy()
    try:
        mgcaffe.set_mode_gpu()
        mgcaffe.set_device(0)
        gpu = mgcaffe.Net(lenet, mgcaffe.TEST, seed=1)
    finally:
        mgcaffe.set_mode_cpu()
    assert gpu.device == Device("gpu", 0)
    for name in cpu.params:
        for mine, theirs in zip(gpu.params[name], cpu.params[name]):
            mine.data[...] = gpu.xp.asarray(theirs.data)
    prob = gpu.forward(data=image)["prob"]
    np.testing.assert_allclose(prob.get(), expected, rtol=1e-4, atol=1e-6)
    diff = gpu.backward(prob=gpu.xp.asarray(np.eye(2, 10, dtype=np.float32)))["data"]
    np.testing.assert_allclose(diff.get(), expected_diff, rtol=1e-3, atol=1e-6)
