"""pycaffe's Solver names (add_callback, share_weights, apply_update) and its device rule:
a solver built from Python runs where set_mode_cpu / set_mode_gpu / set_device say,
whatever the file's solver_mode (the decision is checked on the CPU)."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

import mgcaffe
from mgcaffe.backend import CPU, Device
from mgcaffe.errors import SolverError
from mgcaffe.proto import caffe_pb2
from mgcaffe.solvers import base as solver_base

NET = """
layer { name: "data" type: "DummyData" top: "x" top: "y"
  dummy_data_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 2 }
                     data_filler { type: "constant" value: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "p"
  inner_product_param { num_output: 2 weight_filler { type: "constant" value: 0.5 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "y" top: "loss" }
"""


def solver_file(tmp_path, extra=""):
    (tmp_path / "net.prototxt").write_text(NET)
    path = tmp_path / "solver.prototxt"
    path.write_text(f'net: "net.prototxt" base_lr: 0.01 lr_policy: "fixed" max_iter: 10 '
                    f'display: 0 snapshot_after_train: false {extra}')
    return str(path)


@pytest.fixture
def cpu_mode():
    yield
    mgcaffe.set_mode_cpu()
    mgcaffe.set_device(0)


def test_add_callback_runs_before_forward_and_before_the_update(tmp_path, cpu_mode):
    solver = mgcaffe.SGDSolver(solver_file(tmp_path))
    weight = solver.net.params["ip"][0]
    events = []

    def on_start():
        events.append(("start", float(solver.net.blobs["loss"].data.ravel()[0]),
                       solver.iter))

    def on_gradients_ready():
        # Gradients are final, the update has not happened yet.
        events.append(("ready", float(np.abs(weight.diff).sum()), float(weight.data[0, 0])))

    solver.add_callback(on_start, on_gradients_ready)
    solver.step(2)
    assert [e[0] for e in events] == ["start", "ready", "start", "ready"]
    assert events[0][1] == 0.0 and events[0][2] == 0  # before the first forward
    assert events[1][1] > 0 and events[1][2] == 0.5   # diffs there, weights untouched
    assert events[3][2] != 0.5                        # the first update was applied


def test_apply_update_and_share_weights(tmp_path, cpu_mode):
    solver = mgcaffe.SGDSolver(solver_file(tmp_path))
    weight = solver.net.params["ip"][0]
    weight.data[...] = 0
    weight.diff[...] = 1
    solver.apply_update()
    np.testing.assert_allclose(weight.data, -0.01, rtol=1e-6)
    other = mgcaffe.Net(str(tmp_path / "net.prototxt"), mgcaffe.TEST)
    solver.share_weights(other)
    weight.data[...] = 3
    np.testing.assert_array_equal(other.params["ip"][0].data, 3)


def test_mode_functions_decide_the_device_not_the_file(tmp_path, cpu_mode, monkeypatch):
    # The file asks for the GPU; pycaffe's CPU mode wins, even where a GPU is usable.
    monkeypatch.setattr(solver_base, "gpu_available", lambda: True)
    path = solver_file(tmp_path, "solver_mode: GPU device_id: 1")
    assert mgcaffe.SGDSolver(path).device == CPU
    assert mgcaffe.get_solver(path).device == CPU
    assert isinstance(mgcaffe.get_solver(path), mgcaffe.solvers.SGDSolver)
    # ... while the library's own constructor keeps `caffe train`'s rule (the file decides).
    monkeypatch.setattr(solver_base, "gpu_available", lambda: False)
    assert mgcaffe.solvers.SGDSolver(path).device == CPU  # falls back, with a log line
    # GPU mode: the solver is asked for GPU set_device(i); without one it says so.
    mgcaffe.set_mode_gpu()
    mgcaffe.set_device(2)
    assert mgcaffe._python_solver_options({}) == {"device": Device("gpu", 2)}
    with pytest.raises(SolverError, match="GPU 2 requested but no GPU is usable"):
        mgcaffe.SGDSolver(solver_file(tmp_path))
    with pytest.raises(SolverError, match="GPU 2 requested"):
        mgcaffe.AdamSolver(solver_file(tmp_path))
    # An explicit device still wins.
    assert mgcaffe.SGDSolver(solver_file(tmp_path), device=CPU).device == CPU


def test_set_random_seed_seeds_solvers_without_random_seed(tmp_path, cpu_mode):
    net = NET.replace('type: "constant" value: 0.5', 'type: "gaussian" std: 1')
    (tmp_path / "net.prototxt").write_text(net)
    path = tmp_path / "s.prototxt"
    path.write_text('net: "net.prototxt" base_lr: 0.01 lr_policy: "fixed" display: 0')
    try:
        mgcaffe.set_random_seed(5)
        a = mgcaffe.SGDSolver(str(path)).net.params["ip"][0].data.copy()
        b = mgcaffe.get_solver(str(path)).net.params["ip"][0].data.copy()
    finally:
        mgcaffe._random_seed = None
    np.testing.assert_array_equal(a, b)


def test_solver_from_a_message(cpu_mode):
    param = text_format.Parse('base_lr: 0.1 lr_policy: "fixed" display: 0',
                              caffe_pb2.SolverParameter())
    param.net_param.CopyFrom(text_format.Parse(NET, caffe_pb2.NetParameter()))
    solver = mgcaffe.SGDSolver(param)
    solver.step(1)
    assert solver.iter == 1
