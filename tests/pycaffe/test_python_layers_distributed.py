"""Python layers in data-parallel training: a Python data layer feeds each rank its share
(it reads self.rank / self.world_size) and a Python layer's parameter is all-reduced with
the others; two ranks as threads of one process (LocalWorld)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest
from comm_fakes import run_ranks
from google.protobuf import text_format

from mgcaffe.comm.backends.local import LocalWorld
from mgcaffe.comm.training.trainer import attach
from mgcaffe.proto import caffe_pb2
from mgcaffe.solvers import SGDSolver

pytestmark = pytest.mark.timeout(120)

MODULE = '''
import numpy as np
import mgcaffe


class ShareData(mgcaffe.Layer):
    """Rank r of n gets rows r, r + n, ... of a fixed 4 x 3 table."""

    def setup(self, bottom, top):
        table = np.arange(12, dtype=float).reshape(4, 3) / 10
        self.rows = table[self.rank::self.world_size]

    def reshape(self, bottom, top):
        top[0].reshape(*self.rows.shape)
        top[1].reshape(*self.rows.shape)

    def forward(self, bottom, top):
        top[0].data[...] = self.rows
        top[1].data[...] = 0


class Scale(mgcaffe.Layer):
    """top = w * bottom, one learnable w per column."""

    def setup(self, bottom, top):
        self.blobs.add_blob(bottom[0].data.shape[1])
        self.blobs[0].data[...] = [1.0, 2.0, 3.0]

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = self.blobs[0].data * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        self.blobs[0].diff[...] += (top[0].diff * bottom[0].data).sum(0)
        if propagate_down[0]:
            bottom[0].diff[...] = self.blobs[0].data * top[0].diff
'''

FLAGS = ("comm", "merge", "bucket_mb", "profile", "network", "plan", "save_plan",
         "profile_iters", "timeline", "emulate_network", "emulate_nodes", "check_sync",
         "comm_timeout")


def solver_param(module: str) -> caffe_pb2.SolverParameter:
    net = f'''
      layer {{ name: "data" type: "Python" top: "x" top: "t"
               python_param {{ module: "{module}" layer: "ShareData" }} }}
      layer {{ name: "fc" type: "InnerProduct" bottom: "x" top: "h"
               inner_product_param {{ num_output: 3 weight_filler {{ type: "constant" value: 0.5 }}
                                      bias_filler {{ type: "constant" value: 0.1 }} }} }}
      layer {{ name: "scale" type: "Python" bottom: "h" top: "y"
               python_param {{ module: "{module}" layer: "Scale" }} }}
      layer {{ name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "t" top: "loss" }}'''
    text = (f"net_param {{ {net} }} base_lr: 0.1 lr_policy: 'fixed' max_iter: 1 display: 0 "
            f"random_seed: 3 snapshot_after_train: false")
    return text_format.Parse(text, caffe_pb2.SolverParameter())


def expected_scale_after_one_step() -> np.ndarray:
    """Plain numpy: the mean of the two ranks' gradients of w, one SGD step."""
    table = np.arange(12, dtype=float).reshape(4, 3) / 10
    w = np.array([1.0, 2.0, 3.0])
    grads = []
    for rank in range(2):
        x = table[rank::2]
        h = x @ np.full((3, 3), 0.5).T + 0.1
        y = w * h
        dy = y / len(x)  # EuclideanLoss: d/dy of sum(y^2) / 2 / N
        grads.append((dy * h).sum(0))
    return w - 0.1 * np.mean(grads, axis=0)


def test_python_layers_train_data_parallel(tmp_path, monkeypatch):
    module = "dist_user_layers"
    (tmp_path / f"{module}.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        comms = LocalWorld(2, timeout=20).communicators()
        solvers = [SGDSolver(solver_param(module), rank=r, world_size=2) for r in range(2)]
        args = SimpleNamespace(**{f: None for f in FLAGS}, )
        args.comm, args.profile_iters = "wfbp", 2
        for r, s in enumerate(solvers):
            assert s.net.layer_by_name("data").rows.shape == (2, 3)
            assert s.net.layer_by_name("data").rank == r
            assert [layer.name for layer in s.net.learnable_layers] == ["fc", "scale"]

        def rank_main(r):
            with attach(solvers[r], args, comms[r]):
                solvers[r].step(1)

        _, errors = run_ranks(2, rank_main, timeout=60)
        assert errors == [None, None], errors
        expected = expected_scale_after_one_step()
        for s in solvers:
            np.testing.assert_allclose(s.net.params["scale"][0].data, expected, rtol=1e-5)
    finally:
        sys.modules.pop(module, None)
