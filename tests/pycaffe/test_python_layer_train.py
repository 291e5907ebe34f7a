"""A Python loss layer written for pycaffe (`import caffe`) trains under `mgcaffe train`."""

from __future__ import annotations

import sys

import pytest

from mgcaffe import caffe_alias
from mgcaffe.cli import main

MODULE = '''
import caffe
import numpy as np


class HalfSquares(caffe.Layer):
    """loss = sum((a - b)^2) / 2 / N, as Caffe's EuclideanLoss."""

    def reshape(self, bottom, top):
        self.diff = np.zeros_like(bottom[0].data)
        top[0].reshape(1)

    def forward(self, bottom, top):
        self.diff[...] = bottom[0].data - bottom[1].data
        top[0].data[...] = np.sum(self.diff ** 2) / bottom[0].num / 2.0

    def backward(self, top, propagate_down, bottom):
        for i, sign in ((0, 1), (1, -1)):
            if propagate_down[i]:
                bottom[i].diff[...] = sign * self.diff / bottom[i].num
'''

NET = '''
layer { name: "x" type: "DummyData" top: "x"
  dummy_data_param { shape { dim: 8 dim: 3 } data_filler { type: "gaussian" } } }
layer { name: "y" type: "DummyData" top: "y"
  dummy_data_param { shape { dim: 8 dim: 2 } data_filler { type: "constant" value: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "p"
  inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "Python" bottom: "p" bottom: "y" top: "loss" loss_weight: 1
  python_param { module: "half_squares_user" layer: "HalfSquares" } }
'''


def test_pycaffe_loss_layer_under_mgcaffe_train(tmp_path, monkeypatch, caplog):
    if caffe_alias.real_caffe() is not None:
        pytest.skip("a real caffe is importable here: the alias is not installed for it")
    (tmp_path / "half_squares_user.py").write_text(MODULE)
    (tmp_path / "net.prototxt").write_text(NET)
    solver = tmp_path / "solver.prototxt"
    solver.write_text(f'net: "{tmp_path / "net.prototxt"}" base_lr: 0.1 lr_policy: "fixed" '
                      f'max_iter: 20 display: 10 snapshot_after_train: false random_seed: 1')
    monkeypatch.syspath_prepend(str(tmp_path))
    installed_before = caffe_alias.installed()
    try:
        assert main(["train", "--solver", str(solver)]) == 0
        assert caffe_alias.installed()
    finally:
        if not installed_before:
            caffe_alias.uninstall()
        sys.modules.pop("half_squares_user", None)


def test_a_real_caffe_is_not_shadowed_for_layer_modules(tmp_path, monkeypatch):
    from google.protobuf import text_format  # noqa: PLC0415

    import mgcaffe  # noqa: PLC0415
    from mgcaffe.errors import LayerError  # noqa: PLC0415
    from mgcaffe.proto import caffe_pb2  # noqa: PLC0415

    if caffe_alias.installed():
        pytest.skip("the alias is installed in this process")
    (tmp_path / "half_squares_user2.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(caffe_alias, "real_caffe", lambda: "/opt/caffe/python/caffe")
    param = text_format.Parse(NET.replace("half_squares_user", "half_squares_user2"),
                              caffe_pb2.NetParameter())
    with pytest.raises(LayerError, match="a real Caffe is at /opt/caffe/python/caffe"):
        mgcaffe.Net(param, mgcaffe.TRAIN)
    assert not caffe_alias.installed()
