"""type: "Python": user layers with pycaffe's contract, through real nets.

The user module is written to a temporary folder put on sys.path, as a user's PYTHONPATH.
"""

from __future__ import annotations

import sys
import textwrap
import traceback

import numpy as np
import pytest
from google.protobuf import text_format
from gradient_check import check_layer_gradients, make_layer

import mgcaffe
from mgcaffe.errors import LayerError
from mgcaffe.net import Net
from mgcaffe.proto import caffe_pb2
from mgcaffe.solvers import SGDSolver

USER_MODULE = '''
import numpy as np
import mgcaffe


class AffineLayer(mgcaffe.Layer):
    """top = w * bottom + offset, w one learnable value per channel, offset = param_str."""

    def setup(self, bottom, top):
        self.offset = float(self.param_str or 0)
        channels = bottom[0].data.shape[1]
        self.blobs.add_blob(channels)
        self.blobs[0].data[...] = np.arange(1, channels + 1)
        self.calls = []

    def reshape(self, bottom, top):
        self.calls.append("reshape")
        top[0].reshape(*bottom[0].data.shape)

    def _w(self, ndim):
        return self.blobs[0].data.reshape((1, -1) + (1,) * (ndim - 2))

    def forward(self, bottom, top):
        self.calls.append("forward")
        top[0].data[...] = self._w(bottom[0].data.ndim) * bottom[0].data + self.offset

    def backward(self, top, propagate_down, bottom):
        x, dy = bottom[0].data, top[0].diff
        axes = tuple(i for i in range(x.ndim) if i != 1)
        self.blobs[0].diff[...] += (dy * x).sum(axis=axes)
        if propagate_down[0]:
            bottom[0].diff[...] = self._w(x.ndim) * dy


class FailingLayer(mgcaffe.Layer):
    def setup(self, bottom, top):
        if self.param_str == "setup":
            raise ValueError("user says no")

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        raise KeyError("missing thing")


class RankData(mgcaffe.Layer):
    """A data layer: record k of 0..11 goes to rank k % world_size."""

    def setup(self, bottom, top):
        self.records = [k for k in range(12) if k % self.world_size == self.rank]

    def reshape(self, bottom, top):
        top[0].reshape(len(self.records))

    def forward(self, bottom, top):
        top[0].data[...] = self.records


class Grow(mgcaffe.Layer):
    """The top's size follows the data (as proposal layers do): reshaped in reshape()."""

    def reshape(self, bottom, top):
        top[0].reshape(int(bottom[0].data.ravel()[0]))

    def forward(self, bottom, top):
        top[0].data[...] = 1


class PhaseLayer(mgcaffe.Layer):
    def reshape(self, bottom, top):
        top[0].reshape()

    def forward(self, bottom, top):
        top[0].data[()] = self.phase
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    name = f"user_layers_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def py_layer(module, cls, name, bottom, top, param_str="", extra=""):
    bottoms = "".join(f' bottom: "{b}"' for b in bottom)
    return (f'layer {{ name: "{name}" type: "Python"{bottoms} top: "{top}" {extra} '
            f'python_param {{ module: "{module}" layer: "{cls}" param_str: "{param_str}" }} }}')


def affine_net(module, param_str="0.5", extra="", dtype=np.float32):
    text = ('force_backward: true '
            'layer { name: "data" type: "Input" top: "data" '
            'input_param { shape { dim: 2 dim: 3 dim: 2 } } } '
            + py_layer(module, "AffineLayer", "aff", ["data"], "out", param_str, extra)
            + ' layer { name: "loss" type: "EuclideanLoss" bottom: "out" bottom: "target" '
              'top: "loss" } '
              'layer { name: "t" type: "Input" top: "target" '
              'input_param { shape { dim: 2 dim: 3 dim: 2 } } }')
    # The target input must come before the loss: put it first.
    param = text_format.Parse(text, caffe_pb2.NetParameter())
    target = param.layer.pop()
    param.layer.insert(1, target)
    return Net(param, mgcaffe.TRAIN, dtype=dtype)


def test_forward_backward_through_a_net(user_module):
    net = affine_net(user_module)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 2)).astype(np.float32)
    t = rng.standard_normal((2, 3, 2)).astype(np.float32)
    net.blobs["data"].data[...] = x
    net.blobs["target"].data[...] = t
    net.forward()
    w = np.array([1.0, 2.0, 3.0]).reshape(1, 3, 1)
    expected = w * x + 0.5
    np.testing.assert_allclose(net.blobs["out"].data, expected, rtol=1e-6)
    # EuclideanLoss: sum((out - t)^2) / 2 / N; d/d out = (out - t) / N.
    np.testing.assert_allclose(net.blobs["loss"].data, ((expected - t) ** 2).sum() / 4,
                               rtol=1e-5)
    net.clear_param_diffs()
    net.backward()
    dout = (expected - t) / 2
    np.testing.assert_allclose(net.blobs["data"].diff, w * dout, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(net.params["aff"][0].diff, (dout * x).sum(axis=(0, 2)),
                               rtol=1e-5, atol=1e-6)
    # Caffe reshapes before every forward: reshape ran at set-up and before each forward.
    layer = net.layer_by_name("aff")
    assert layer.type == "Python" and layer.calls == ["reshape", "reshape", "forward"]


def test_gradients_by_central_differences(user_module):
    param = text_format.Parse(py_layer(user_module, "AffineLayer", "aff", ["x"], "y", "-1"),
                              caffe_pb2.NetParameter()).layer[0]
    layer, bottom, top = make_layer(param, [(3, 4, 2)])
    assert layer.blobs[0].dtype == np.float64
    check_layer_gradients(layer, bottom, top)


def test_blobs_are_parameters_saved_loaded_learnable(user_module, tmp_path):
    net = affine_net(user_module)
    assert list(net.params) == ["aff"]
    assert [layer.name for layer in net.learnable_layers] == ["aff"]
    assert net.reduced_param_ids() == [0]
    blob = net.params["aff"][0]
    assert net.learnable_params[0] is blob and net.layers[net.layer_id("aff")].blobs[0] is blob
    blob.data[...] = [7, 8, 9]
    path = tmp_path / "w.caffemodel"
    net.save(str(path))
    saved = caffe_pb2.NetParameter.FromString(path.read_bytes())
    stored = [lp for lp in saved.layer if lp.name == "aff"][0]
    assert list(stored.blobs[0].data) == [7, 8, 9]
    blob.data[...] = 0
    net.copy_from(str(path))
    np.testing.assert_array_equal(blob.data, [7, 8, 9])
    # A fresh net given the weights starts from them.
    other = affine_net(user_module)
    other.copy_from(str(path))
    np.testing.assert_array_equal(other.params["aff"][0].data, [7, 8, 9])
    # lr_mult: 0 makes it a fixed parameter, like any layer's.
    frozen = affine_net(user_module, extra="param { lr_mult: 0 }")
    assert frozen.learnable_layers == []


def test_solver_updates_python_layer_parameters(user_module, tmp_path):
    net = affine_net(user_module)
    param = caffe_pb2.SolverParameter(base_lr=0.1, lr_policy="fixed", max_iter=1,
                                      display=0, snapshot_after_train=False)
    param.net_param.CopyFrom(net.net_param)
    solver = SGDSolver(param)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 2)).astype(np.float32)
    solver.net.blobs["data"].data[...] = x
    solver.net.blobs["target"].data[...] = 0
    w0 = solver.net.params["aff"][0].data.copy()
    solver.step(1)
    out = w0.reshape(1, 3, 1) * x + 0.5
    grad = (out / 2 * x).sum(axis=(0, 2))
    np.testing.assert_allclose(solver.net.params["aff"][0].data, w0 - 0.1 * grad, rtol=1e-5)


def test_user_exceptions_propagate_with_their_type_traceback_and_layer(user_module):
    text = ('layer { name: "data" type: "Input" top: "data" '
            'input_param { shape { dim: 2 } } } '
            + py_layer(user_module, "FailingLayer", "bad", ["data"], "out", "setup"))
    with pytest.raises(ValueError, match="user says no") as info:
        Net(text_format.Parse(text, caffe_pb2.NetParameter()), mgcaffe.TEST)
    assert any("'bad'" in note for note in getattr(info.value, "__notes__", ["'bad'"]))
    frames = traceback.extract_tb(info.value.__traceback__)
    assert frames[-1].filename.endswith(f"{user_module}.py")
    net = Net(text_format.Parse(text.replace('param_str: "setup"', ""),
                                caffe_pb2.NetParameter()), mgcaffe.TEST)
    with pytest.raises(KeyError, match="missing thing") as info:
        net.forward()
    assert traceback.extract_tb(info.value.__traceback__)[-1].name == "forward"


def test_missing_module_or_class_is_one_clear_error(user_module):
    base = 'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 } } } '
    for module, cls, expected in (("no_such_module_xyz", "X", "cannot import module"),
                                  (user_module, "NoSuchClass", "has no class 'NoSuchClass'")):
        text = base + py_layer(module, cls, "p", ["data"], "out")
        with pytest.raises(LayerError, match=expected) as info:
            Net(text_format.Parse(text, caffe_pb2.NetParameter()), mgcaffe.TEST)
        assert "layer 'p' (Python)" in str(info.value)


@pytest.mark.parametrize("module, name, kind", [
    ("os", "system", "a builtin_function_or_method, not a class"),
    ("json", "dumps", "a function, not a class"),
    ("collections", "OrderedDict", "a class that does not derive from the Layer base"),
    ("math", "pi", "a float, not a class"),
])
def test_layer_naming_no_layer_class_is_one_line(module, name, kind):
    # `module: "os" layer: "system"` used to end in a TypeError from inside mgcaffe
    # ("expected str, bytes or os.PathLike object, not LayerParameter")
    text = ('layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 } } } '
            + py_layer(module, name, "p", ["data"], "out"))
    with pytest.raises(LayerError) as info:
        Net(text_format.Parse(text, caffe_pb2.NetParameter()), mgcaffe.TEST)
    message = str(info.value)
    assert message.startswith("layer 'p' (Python): ")
    assert f"'{module}.{name}' is {kind}" in message
    assert "deriving from caffe.Layer" in message and "\n" not in message


def test_data_layer_learns_rank_and_world_size(user_module):
    text = py_layer(user_module, "RankData", "data", [], "records")
    param = text_format.Parse(text, caffe_pb2.NetParameter())
    seen = []
    for rank in range(3):
        net = Net(param, mgcaffe.TRAIN, rank=rank, world_size=3)
        seen.append(net.forward()["records"].astype(int).tolist())
    assert seen == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]


def test_top_size_may_follow_the_data_and_phase_is_seen(user_module):
    text = ('layer { name: "data" type: "Input" top: "n" input_param { shape { dim: 1 } } } '
            + py_layer(user_module, "Grow", "grow", ["n"], "ones"))
    net = Net(text_format.Parse(text, caffe_pb2.NetParameter()), mgcaffe.TEST)
    for n in (3, 5):
        net.blobs["n"].data[...] = n
        assert net.forward()["ones"].shape == (n,)
    text = py_layer(user_module, "PhaseLayer", "phase", [], "phase")
    for phase in (mgcaffe.TRAIN, mgcaffe.TEST):
        net = Net(text_format.Parse(text, caffe_pb2.NetParameter()), phase)
        assert float(net.forward()["phase"]) == phase


def test_python_is_in_the_type_list():
    assert "Python" in mgcaffe.layer_type_list()


def test_blobvec_add_blob_shapes():
    from mgcaffe.layer_types.python_layer import BlobVec

    vec = BlobVec(xp=np, dtype=np.float32, name="l")
    assert vec.add_blob(2, 3).shape == (2, 3) and vec.add_blob((4,)).shape == (4,)
    assert len(vec) == 2 and float(vec[0].data.sum()) == 0.0
    with pytest.raises(RuntimeError, match="setup"):
        BlobVec().add_blob(1)


def test_user_module_text_is_valid_python():
    compile(textwrap.dedent(USER_MODULE), "user", "exec")
