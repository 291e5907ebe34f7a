"""A parameter diff array a pycaffe user holds reads what a fresh read reads, at every point
user code can look: after clear_param_diffs, after backward, after solver steps, in the
solver's callbacks and the net's per-layer callbacks, after a failure half-way. The
solver's per-iteration clear stays lazy where no user code can look (its speed).

BVLC's python/caffe/test/test_net.py::test_clear_param_diffs is the first case: it keeps
`diff = net.params["conv"][0].diff`, runs forward/backward, clears, and expects zeros.
"""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from mgcaffe.layer_types.base import TRAIN
from mgcaffe.net import Net
from mgcaffe.net.param_diffs import EAGER, LAZY, clear_way
from mgcaffe.proto import caffe_pb2
from mgcaffe.solvers import get_solver

# conv and ip learn; "frozen" (lr 0) and "side" (its output reaches no loss) have parameter
# diffs that no backward writes.
NET = """
name: "held"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 4 dim: 2 dim: 6 dim: 6 } shape { dim: 4 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 1 } } }
layer { name: "side" type: "InnerProduct" bottom: "data" top: "side"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "silence" type: "Silence" bottom: "side" }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 3 kernel_size: 3
    weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "constant" value: 0.1 } } }
layer { name: "frozen" type: "InnerProduct" bottom: "conv" top: "frozen"
  param { lr_mult: 0 } param { lr_mult: 0 }
  inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.3 }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "frozen" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def net_param():
    return text_format.Parse(NET, caffe_pb2.NetParameter())


def held(net):
    """{(layer, i): the diff array as a user keeps it}."""
    return {(name, i): blob.diff for name, blobs in net.params.items()
            for i, blob in enumerate(blobs)}


def assert_held_reads_fresh(net, arrays, when):
    # what the held arrays hold before any fresh read (a fresh read may write the memory)
    values = {k: np.array(a) for k, a in arrays.items()}
    for (name, i), value in values.items():
        fresh = net.params[name][i].diff
        assert fresh is arrays[name, i], f"{when}: {name}[{i}] is another array"
        assert np.array_equal(value, np.array(fresh)), f"{when}: {name}[{i}]"


def held_and_fresh(net, arrays):
    """{key: (what the held array holds, what a fresh read then holds)}."""
    kept = {k: np.array(a) for k, a in arrays.items()}
    return {k: (v, np.array(net.params[k[0]][k[1]].diff)) for k, v in kept.items()}


def dirty(net):
    """Values in every parameter diff, as a previous iteration leaves them."""
    for blob in net.learnable_params:
        blob.diff[...] = 7


def solver_for(iter_size=1):
    param = caffe_pb2.SolverParameter(base_lr=0.01, momentum=0.9, lr_policy="fixed",
                                      max_iter=10, display=0, type="SGD", random_seed=3,
                                      iter_size=iter_size, snapshot_after_train=False)
    param.net_param.CopyFrom(net_param())
    return get_solver(param)


# ------------------------------------------------------------------ the net
@pytest.mark.parametrize("flatten", [False, True], ids=["loose", "flat"])
def test_bvlc_clear_param_diffs_zeroes_the_array_the_user_holds(flatten):
    net = Net(net_param(), TRAIN, seed=1)
    if flatten:
        net.flatten_param_diffs()
    net.forward()
    net.backward()
    diff = net.params["conv"][0].diff
    assert diff.max() > 0
    net.clear_param_diffs()
    assert (diff == 0).all()
    assert all(not a.any() for a in held(net).values())


def test_after_a_pass_every_held_diff_holds_its_gradient_written_or_not():
    """The solver's clear is lazy here; the diffs no backward writes (frozen, a skipped
    branch) are zeros in the held arrays too, not the previous values."""
    net = Net(net_param(), TRAIN, seed=1)
    arrays = held(net)
    dirty(net)
    assert net.clear_param_diffs_for_pass() == LAZY
    net.forward_backward()
    assert_held_reads_fresh(net, arrays, "after the pass")
    assert not arrays[("side", 0)].any() and not arrays[("frozen", 0)].any()
    assert arrays[("ip", 0)].any() and arrays[("conv", 0)].any()


def test_a_failure_half_way_leaves_no_held_diff_stale(monkeypatch):
    net = Net(net_param(), TRAIN, seed=1)
    arrays = held(net)
    dirty(net)
    net.clear_param_diffs_for_pass()

    def fail(*args):
        raise RuntimeError("injected")

    monkeypatch.setattr(net.layer_by_name("conv"), "backward", fail)
    with pytest.raises(Exception, match="injected"):
        net.forward_backward()
    assert_held_reads_fresh(net, arrays, "after the failure")
    assert not arrays[("conv", 0)].any()  # its backward never ran: zeros, as cleared
    assert arrays[("ip", 0)].any()


def test_per_layer_callbacks_see_zeros_in_held_diffs_of_layers_not_run_yet():
    net = Net(net_param(), TRAIN, seed=1)
    arrays = held(net)
    dirty(net)
    seen = []
    conv = net.layer_id("conv")
    net.before_backward(lambda i: seen.append(arrays[("conv", 0)].copy()) if i == conv
                        else None)
    assert net.clear_param_diffs_for_pass() == EAGER  # user code runs inside the pass
    net.forward_backward()
    assert len(seen) == 1 and not seen[0].any()
    assert_held_reads_fresh(net, arrays, "after the pass")


# ------------------------------------------------------------------ the solver
@pytest.mark.parametrize("iter_size", [1, 2])
def test_after_solver_steps_held_diffs_read_as_fresh(iter_size):
    solver = solver_for(iter_size)
    arrays = held(solver.net)
    for _ in range(3):
        solver.step(1)
        assert_held_reads_fresh(solver.net, arrays, f"after iteration {solver.iter}")
    assert solver.net.param_diff_clear_way == LAZY  # nothing of the user's looked


def test_on_start_sees_zeros_and_on_gradients_ready_the_gradients_in_held_diffs():
    solver = solver_for()
    net = solver.net
    arrays = held(net)
    at_start, at_ready = [], []
    solver.add_callback(
        lambda: at_start.append({k: a.copy() for k, a in arrays.items()}),
        lambda: at_ready.append(held_and_fresh(net, arrays)))
    solver.step(3)
    assert len(at_start) == 3 and len(at_ready) == 3
    for state in at_start:  # Caffe: ClearParamDiffs, then on_start
        assert all(not a.any() for a in state.values())
    for k, (kept, fresh) in at_ready[-1].items():
        assert np.array_equal(kept, fresh), k
    assert at_ready[-1]["ip", 0][0].any() and not at_ready[-1]["side", 0][0].any()
    assert net.param_diff_clear_way == EAGER


def test_the_clear_stays_lazy_only_where_no_user_code_can_look():
    assert clear_way(lazy_allowed=True, user_code=False) == LAZY
    assert clear_way(lazy_allowed=True, user_code=True) == EAGER
    assert clear_way(lazy_allowed=False, user_code=False) == EAGER
    net = Net(net_param(), TRAIN, seed=1)
    assert not net.runs_user_code and net.clear_param_diffs_for_pass() == LAZY
    net.settle_param_diffs()
    assert not any(b.diff_is_lazy_zero for b in net.learnable_params)


def test_a_python_layer_in_the_net_is_user_code(tmp_path, monkeypatch):
    (tmp_path / "held_diffs_layer.py").write_text(
        "import mgcaffe\n"
        "class Sink(mgcaffe.Layer):\n"
        "    def setup(self, bottom, top):\n        pass\n"
        "    def reshape(self, bottom, top):\n        pass\n"
        "    def forward(self, bottom, top):\n        pass\n"
        "    def backward(self, top, propagate_down, bottom):\n        pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    text = NET.replace('layer { name: "silence" type: "Silence" bottom: "side" }',
                       'layer { name: "py" type: "Python" bottom: "side" '
                       'python_param { module: "held_diffs_layer" layer: "Sink" } }')
    assert text != NET
    net = Net(text_format.Parse(text, caffe_pb2.NetParameter()), TRAIN, seed=1)
    assert net.runs_user_code
    assert net.clear_param_diffs_for_pass() == EAGER
