"""Lazily cleared parameter diffs (Blob.clear_diff_lazily, Net.clear_param_diffs_for_pass).

The solver's clear only marks the diffs zero; the first backward writer overwrites (GEMM
beta = 0) and every other access fills the zeros first. The checks: the Blob rules, and
whole nets/solvers/two thread-ranks against the same run with the eager fill
(`lazy_param_diff_clear = False`), bit for bit. After each lazy clear the raw diff memory
is poisoned with NaN, so any path that reads a lazily cleared diff without the zeros being
filled (or overwritten) shows up as NaN or as a different value.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from comm_fakes import run_ranks
from google.protobuf import text_format
from layer_rules import changed

from mgcaffe.blob import Blob
from mgcaffe.comm.backends.local import LocalWorld
from mgcaffe.comm.training.trainer import attach
from mgcaffe.layer_types.base import TRAIN
from mgcaffe.net import Net
from mgcaffe.proto import caffe_pb2
from mgcaffe.solvers import get_solver

# Every learnable layer type: Convolution (3x3, grouped, 1x1 direct), Deconvolution with a
# frozen bias, BatchNorm (lr 0), Scale with bias, PReLU, Bias, InnerProduct (two sharing
# weights by name, one frozen), Embed, RNN, Parameter; plus "side", a learnable layer whose
# output reaches no loss, so its backward is skipped and its diffs must read as zeros.
NET = """
name: "lazy"
layer { name: "data" type: "DummyData" top: "data" top: "label" top: "seq" top: "cont"
  dummy_data_param { shape { dim: 2 dim: 3 dim: 14 dim: 14 } shape { dim: 2 }
    shape { dim: 3 dim: 2 dim: 4 } shape { dim: 3 dim: 2 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 1 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 1 } } }
layer { name: "side" type: "InnerProduct" bottom: "data" top: "side"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "silence" type: "Silence" bottom: "side" }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  param { lr_mult: 1 } param { lr_mult: 2 }
  convolution_param { num_output: 4 kernel_size: 3 pad: 1
    weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "constant" value: 0.1 } } }
layer { name: "convg" type: "Convolution" bottom: "conv1" top: "convg"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 group: 2
    weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "constant" value: 0.1 } } }
layer { name: "conv1x1" type: "Convolution" bottom: "convg" top: "conv1x1"
  convolution_param { num_output: 4 kernel_size: 1
    weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "constant" value: 0.1 } } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1x1" top: "conv1x1" }
layer { name: "scale1" type: "Scale" bottom: "conv1x1" top: "conv1x1"
  scale_param { bias_term: true filler { type: "gaussian" std: 0.5 mean: 1 }
    bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "prelu1" type: "PReLU" bottom: "conv1x1" top: "conv1x1" }
layer { name: "deconv1" type: "Deconvolution" bottom: "conv1x1" top: "deconv1"
  param { lr_mult: 1 } param { lr_mult: 0 }
  convolution_param { num_output: 3 kernel_size: 3 stride: 2
    weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "constant" value: 0.2 } } }
layer { name: "bias1" type: "Bias" bottom: "deconv1" top: "bias1"
  bias_param { filler { type: "gaussian" std: 0.1 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "bias1" top: "ip1"
  inner_product_param { num_output: 8 weight_filler { type: "gaussian" std: 0.05 }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "frozen" type: "InnerProduct" bottom: "ip1" top: "frozen"
  param { lr_mult: 0 } param { lr_mult: 0 }
  inner_product_param { num_output: 8 weight_filler { type: "gaussian" std: 0.3 }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "ip2" type: "InnerProduct" bottom: "frozen" top: "ip2"
  param { name: "tied_w" } param { name: "tied_b" }
  inner_product_param { num_output: 8 weight_filler { type: "gaussian" std: 0.3 }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "ip3" type: "InnerProduct" bottom: "ip2" top: "ip3"
  param { name: "tied_w" } param { name: "tied_b" }
  inner_product_param { num_output: 8 weight_filler { type: "gaussian" std: 0.3 }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "ip4" type: "InnerProduct" bottom: "ip3" top: "ip4"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "embed" type: "Embed" bottom: "label" top: "embed"
  embed_param { num_output: 3 input_dim: 3 weight_filler { type: "gaussian" std: 0.3 }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "offset" type: "Parameter" top: "offset"
  parameter_param { shape { dim: 2 dim: 3 } } }
layer { name: "sum" type: "Eltwise" bottom: "ip4" bottom: "offset" bottom: "embed" top: "sum" }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "sum" bottom: "label" top: "loss" }
layer { name: "rnn" type: "RNN" bottom: "seq" bottom: "cont" top: "rnn"
  recurrent_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "rnn_loss" type: "Reduction" bottom: "rnn" top: "rnn_loss" loss_weight: 0.5 }
"""

# Convolution layouts (rules): every path that writes a weight gradient.
LAYOUTS = {
    "default": {},
    "per_sample": {"per_sample_from": 0, "per_sample_from_pointwise": 0,
                   "direct_from": 10 ** 9},
    "whole_batch_scratch": {"batch_last_upto": 0, "weight_diff_in_gemm": False,
                            "direct_from": 10 ** 9},
    "per_sample_scratch": {"per_sample_from": 0, "per_sample_from_pointwise": 0,
                           "weight_diff_in_gemm": False},
}


@pytest.fixture(params=sorted(LAYOUTS))
def layout(request):
    """(name, the layer rules that put the net's convolutions on it)."""
    return request.param, changed(convolution=LAYOUTS[request.param])


def net_param():
    return text_format.Parse(NET, caffe_pb2.NetParameter())


def poison(net):
    """Stale values under every lazily cleared diff: reading one unfilled gives NaN."""
    for blob in net.learnable_params:
        if blob.diff_is_lazy_zero:
            blob._diff[...] = np.nan


def make_net(lazy, flatten, rules=None):
    net = Net(net_param(), TRAIN, seed=3, rules=rules)
    net.lazy_param_diff_clear = lazy
    if flatten:
        net.flatten_param_diffs()
    return net


# ------------------------------------------------------------------ Blob
def test_a_lazily_cleared_diff_reads_as_zeros_for_every_sharer():
    a = Blob((2, 3))
    a.diff[...] = 5
    b = Blob((3, 2))
    b.share_diff(a)
    a.clear_diff_lazily()
    assert b.diff_is_lazy_zero  # one array, one mark
    a._diff[...] = np.nan  # the fill must really write
    assert np.array_equal(b.diff, np.zeros((3, 2)))  # b's read fills a's memory too
    assert not a.diff_is_lazy_zero and np.array_equal(a.diff, np.zeros((2, 3)))


def test_diff_for_write_says_overwrite_once_and_add_to_diff_follows_it():
    blob = Blob((4,))
    blob.diff[...] = 7
    assert blob.diff_for_write()[1] is False
    blob.clear_diff_lazily()
    diff, overwrite = blob.diff_for_write()
    assert overwrite and diff is blob._diff
    assert blob.diff_for_write()[1] is False  # the writer owns it now
    blob.clear_diff_lazily()
    blob._diff[...] = np.nan
    blob.add_to_diff(np.array([1, 2, 3, 4], np.float32))  # no fill: a plain write
    blob.add_to_diff(np.array([1, 1, 1, 1], np.float32))
    assert blob.diff.tolist() == [2, 3, 4, 5]


def test_assigning_reshaping_and_new_storage_end_the_lazy_mark():
    blob = Blob((2, 2))
    blob.clear_diff_lazily()
    blob.diff = np.ones((2, 2))
    assert not blob.diff_is_lazy_zero and blob.diff.tolist() == [[1, 1], [1, 1]]
    blob.clear_diff_lazily()
    storage = np.full((2, 2), 9, np.float32)
    blob.use_diff_storage(storage)  # carries the (lazy) zeros into the new memory
    assert not blob.diff_is_lazy_zero and not storage.any() and blob.diff is storage
    blob.clear_diff_lazily()
    blob.reshape(3, 3)  # a new array of zeros: nothing left to fill
    assert not blob.diff_is_lazy_zero and not blob.diff.any()


# ------------------------------------------------------------------ nets
@pytest.mark.parametrize("flatten", [False, True], ids=["loose", "flat"])
def test_two_accumulated_passes_match_the_eager_clear_bit_for_bit(layout, flatten):
    """iter_size 2 by hand, 3 iterations: every parameter gradient (shared, frozen,
    skipped, each conv layout) equals the eager fill's, bit for bit, and is finite."""
    rules = layout[1]
    lazy, eager = make_net(True, flatten, rules), make_net(False, flatten, rules)
    side = lazy.layer_id("side")
    assert not lazy.layer_need_backward[side]  # its diffs are never written
    for _ in range(3):
        for net in (lazy, eager):
            net.clear_param_diffs_for_pass()
        assert lazy.learnable_params[0].diff_is_lazy_zero
        assert not any(b.diff_is_lazy_zero for b in eager.learnable_params)
        poison(lazy)
        for net in (lazy, eager):
            net.forward_backward()
            net.forward_backward()
        for i, (a, b) in enumerate(zip(lazy.learnable_params, eager.learnable_params)):
            got = np.array(a.diff)
            assert np.isfinite(got).all(), f"parameter {i}: a stale value survived"
            assert np.array_equal(got, b.diff), f"parameter {i} differs"
        assert not lazy.params["side"][0].diff.any()
        assert not lazy.params["frozen"][0].diff.any()
        # the gradients must not be trivially zero (the comparison means something)
        assert lazy.params["ip1"][0].diff.any() and lazy.params["ip2"][0].diff.any()
        # small steps move the weights, so the next iteration's gradients differ
        for net in (lazy, eager):
            for blob in net.learnable_params:
                blob.data[...] -= np.float32(0.01) * blob.diff


def test_the_flat_buffer_read_directly_holds_the_zeros():
    net = make_net(True, flatten=True)
    net.forward_backward()
    net.clear_param_diffs_for_pass()
    poison(net)
    buffer = net.param_diff_buffer  # what the gradient sync or a user reads
    assert buffer.size and not buffer.any()
    assert not any(net.learnable_params[i].diff_is_lazy_zero for i in net.flat_param_ids)


def test_pycaffe_and_python_side_readers_see_zeros_after_a_lazy_clear():
    net = make_net(True, flatten=False)
    net.forward_backward()
    assert net.params["ip1"][0].diff.any()
    net.clear_param_diffs_for_pass()
    poison(net)
    for name, blobs in net.params.items():
        for k, blob in enumerate(blobs):
            assert not blob.diff.any(), f"{name}[{k}]"


def test_the_largest_gradients_are_written_without_a_fill(monkeypatch):
    """InnerProduct's weight diff goes straight from 'lazy zero' to written: the backward
    never fills it (a fill would cost a pass over the memory, which is the point)."""
    net = make_net(True, flatten=True)
    filled = []
    original = Blob.diff.fget

    def watching(blob):
        if blob._dstate.zero:
            filled.append(blob.name)
        return original(blob)

    monkeypatch.setattr(Blob, "diff", property(watching, Blob.diff.fset))
    weight = net.params["ip1"][0]
    weight.name = "ip1_weight"
    net.clear_param_diffs_for_pass()
    net.forward_backward()
    assert "ip1_weight" not in filled
    assert weight.diff.any()


# ------------------------------------------------------------------ solvers
def solver(lazy, solver_type, iter_size=2):
    param = caffe_pb2.SolverParameter(base_lr=0.05, momentum=0.9, weight_decay=0.01,
                                      lr_policy="fixed", max_iter=10, display=0,
                                      type=solver_type, random_seed=3, clip_gradients=1.0,
                                      iter_size=iter_size, snapshot_after_train=False)
    param.net_param.CopyFrom(net_param())
    s = get_solver(param)
    poisoned_clear(s.net, lazy)
    return s


def poisoned_clear(net, lazy):
    net.lazy_param_diff_clear = lazy
    clear = net.clear_param_diffs_for_pass

    def clear_and_poison(user_code=False):
        way = clear(user_code)
        poison(net)
        return way

    net.clear_param_diffs_for_pass = clear_and_poison


@pytest.mark.parametrize("solver_type", ["SGD", "Adam"])
def test_solver_weights_after_iterations_match_the_eager_clear(solver_type):
    lazy, eager = solver(True, solver_type), solver(False, solver_type)
    for s in (lazy, eager):
        s.step(4)
    for i, (a, b) in enumerate(zip(lazy.net.learnable_params, eager.net.learnable_params)):
        assert np.isfinite(a.data).all() and np.array_equal(a.data, b.data), f"param {i}"


# ------------------------------------------------------------------ two thread-ranks
FLAGS = ("comm", "merge", "bucket_mb", "profile", "network", "plan", "save_plan",
         "profile_iters", "timeline", "emulate_network", "emulate_nodes", "check_sync",
         "comm_timeout", "replan_after")


def train_two_ranks(lazy, comm):
    comms = LocalWorld(2, timeout=20).communicators()
    solvers = []
    for r in range(2):
        param = caffe_pb2.SolverParameter(base_lr=0.05, momentum=0.9, weight_decay=0.001,
                                          lr_policy="fixed", max_iter=10, display=0,
                                          type="SGD", random_seed=7 + r,
                                          snapshot_after_train=False)
        param.net_param.CopyFrom(net_param())
        solvers.append(get_solver(param, rank=r, world_size=2))
    args = SimpleNamespace(**{**{f: None for f in FLAGS}, "comm": comm, "bucket_mb": 0.0001})

    def rank_main(r):
        with attach(solvers[r], args, comms[r]):
            poisoned_clear(solvers[r].net, lazy)
            solvers[r].step(3)

    _, errors = run_ranks(2, rank_main, timeout=60)
    assert errors == [None, None]
    return [[np.array(b.data) for b in s.net.learnable_params] for s in solvers], \
        solvers[0].net.reduced_param_ids()


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("comm", ["wfbp", "synceasgd"])
def test_two_ranks_train_the_same_weights_as_with_the_eager_clear(comm):
    (lazy, reduced), (eager, _) = train_two_ranks(True, comm), train_two_ranks(False, comm)
    for r in range(2):
        for i, (a, b) in enumerate(zip(lazy[r], eager[r])):
            assert np.isfinite(a).all() and np.array_equal(a, b), f"rank {r} param {i}"
    for i in reduced:  # (BatchNorm's statistics, lr 0, stay each rank's own)
        assert np.array_equal(lazy[0][i], lazy[1][i]), f"param {i}"
