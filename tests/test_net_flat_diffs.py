"""Net.flatten_param_diffs: the reduced parameter diffs as views of one contiguous buffer.

The gradient sync all-reduces each planned group as one slice of that buffer, in place, so a
layer must write its parameter gradients INTO the diff array (`+=`, `out=`), never replace
it. The checks here read the gradients back through the buffer (not through `blob.diff`)
and compare them bit for bit with an unflattened twin, over a net with every learnable layer
type and over the bundled small models.
"""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from mgcaffe.errors import NetError
from mgcaffe.formats.protoio import read_net_param
from mgcaffe.layer_types.base import TRAIN
from mgcaffe.net import Net
from mgcaffe.net.synthetic_data import fill_labels, synthesize_data_layers
from mgcaffe.proto import caffe_pb2

# Every layer type with a learned blob: Convolution, BatchNorm (lr_mult 0: kept, not
# reduced), Scale with bias, PReLU, Deconvolution, Bias, InnerProduct (two of them sharing
# weights by ParamSpec name), Parameter; plus a conv bias with lr_mult 0.
EVERY_LEARNABLE = """
name: "every_learnable"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 2 dim: 3 dim: 6 dim: 6 } shape { dim: 2 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 1 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  param { lr_mult: 1 } param { lr_mult: 2 }
  convolution_param { num_output: 4 kernel_size: 3 pad: 1
    weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "constant" value: 0.1 } } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" }
layer { name: "scale1" type: "Scale" bottom: "conv1" top: "conv1"
  scale_param { bias_term: true filler { type: "gaussian" std: 0.5 mean: 1 }
    bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "prelu1" type: "PReLU" bottom: "conv1" top: "conv1" }
layer { name: "deconv1" type: "Deconvolution" bottom: "conv1" top: "deconv1"
  param { lr_mult: 1 } param { lr_mult: 0 }
  convolution_param { num_output: 3 kernel_size: 3 pad: 1
    weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "constant" value: 0.2 } } }
layer { name: "bias1" type: "Bias" bottom: "deconv1" top: "bias1"
  bias_param { filler { type: "gaussian" std: 0.1 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "bias1" top: "ip1"
  inner_product_param { num_output: 8 weight_filler { type: "gaussian" std: 0.1 }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
  param { name: "tied_w" } param { name: "tied_b" }
  inner_product_param { num_output: 8 weight_filler { type: "gaussian" std: 0.3 }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "ip3" type: "InnerProduct" bottom: "ip2" top: "ip3"
  param { name: "tied_w" } param { name: "tied_b" }
  inner_product_param { num_output: 8 weight_filler { type: "gaussian" std: 0.3 }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "ip4" type: "InnerProduct" bottom: "ip3" top: "ip4"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "offset" type: "Parameter" top: "offset"
  parameter_param { shape { dim: 2 dim: 3 } } }
layer { name: "sum" type: "Eltwise" bottom: "ip4" bottom: "offset" top: "sum" }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "sum" bottom: "label" top: "loss" }
"""

# The bundled train nets, their file-reading data layers replaced by seeded random data.
SMALL_MODELS = {
    "digits": ("models/digits/train_test.prototxt", {"data": (4, 1, 8, 8)}),
    "lenet": ("models/lenet/lenet_train_test.prototxt", {"data": (2, 1, 28, 28)}),
    "cifar10_quick": ("models/cifar10_quick/cifar10_quick_train_test.prototxt",
                      {"data": (2, 3, 32, 32)}),
}


def every_learnable_param():
    return text_format.Parse(EVERY_LEARNABLE, caffe_pb2.NetParameter())


def model_param(repo_root, name):
    path, shapes = SMALL_MODELS[name]
    param, labels = synthesize_data_layers(read_net_param(str(repo_root / path)), shapes)
    return param, labels


def twins(param, labels=()):
    """Two identical nets (same seed, same data); the first one flattened."""
    nets = []
    for _ in range(2):
        net = Net(param, TRAIN, seed=3)
        fill_labels(net, labels, seed=5)
        nets.append(net)
    nets[0].flatten_param_diffs()
    return nets


def flat_gradients(net):
    """Every owned parameter gradient as the gradient sync sees it: flattened ones read from
    the buffer (where the all-reduce works), the others from their blob."""
    out = [None] * len(net.learnable_params)
    offset = 0
    for p in net.flat_param_ids:
        blob = net.learnable_params[p]
        out[p] = net.param_diff_buffer[offset:offset + blob.count].reshape(blob.shape)
        offset += blob.count
    for p, blob in enumerate(net.learnable_params):
        if out[p] is None:
            out[p] = blob.diff
    return out


def assert_same_gradients(flat, reference):
    """Bit-identical gradients, the flattened net's read through its buffer."""
    for p, (got, want) in enumerate(zip(flat_gradients(flat),
                                        [b.diff for b in reference.learnable_params])):
        assert np.array_equal(got, want), f"learnable param {p}: gradient differs"


def train_passes(net, passes=2):
    """clear, then `passes` forward/backward passes accumulating into the diffs."""
    net.clear_param_diffs()
    for _ in range(passes):
        net.forward_backward()


def test_layout_follows_the_reduction_order():
    net = Net(every_learnable_param(), TRAIN, seed=3)
    flat = net.flatten_param_diffs()
    assert net.param_diff_buffer is flat and flat.dtype == np.float32 and flat.ndim == 1
    # learnable layers L..1, each layer's blobs in order; BatchNorm (lr_mult 0) and the
    # deconvolution bias (lr_mult 0) are not reduced, so not in the buffer
    names = [layer.name for layer in reversed(net.learnable_layers)]
    assert names == ["offset", "ip4", "ip2", "ip1", "bias1", "deconv1", "prelu1", "scale1",
                     "conv1"]
    assert list(net.flat_param_ids) == net.reduced_param_ids()
    assert flat.size == sum(layer.count for layer in net.learnable_layers)
    offset = 0
    for p in net.flat_param_ids:
        diff = net.learnable_params[p].diff
        assert diff.base is flat
        assert diff.ctypes.data == flat.ctypes.data + 4 * offset
        offset += diff.size
    for layer in ("bn1",):
        assert not any(np.shares_memory(b.diff, flat) for b in net.params[layer])
    assert not np.shares_memory(net.params["deconv1"][1].diff, flat)


def test_sharers_alias_the_owner_slice():
    net = Net(every_learnable_param(), TRAIN, seed=3)
    flat = net.flatten_param_diffs()
    for owner, sharer in zip(net.params["ip2"], net.params["ip3"]):
        assert sharer is not owner
        assert np.shares_memory(sharer.diff, flat) and np.shares_memory(sharer.data, owner.data)
        sharer.diff[...] = 7.0
        assert (owner.diff == 7.0).all()


def test_values_are_kept_and_clear_zeroes_everything():
    flat_net, reference = twins(every_learnable_param())
    for net in (flat_net, reference):
        net.clear_param_diffs()
        net.forward_backward()
    before = [b.diff.copy() for b in flat_net.learnable_params]
    flat_net.flatten_param_diffs()  # again, with gradients in the diffs: they stay
    for b, want in zip(flat_net.learnable_params, before):
        assert np.array_equal(b.diff, want)
    for b in flat_net.learnable_params:  # the lr_mult 0 blobs outside the buffer too
        b.diff[...] = 1.0
    flat_net.clear_param_diffs()
    assert not flat_net.param_diff_buffer.any()
    assert not any(b.diff.any() for b in flat_net.learnable_params)


def test_every_learnable_layer_writes_into_the_buffer():
    flat, reference = twins(every_learnable_param())
    for net in (flat, reference):
        train_passes(net)
    assert_same_gradients(flat, reference)
    assert flat.param_diff_buffer.any()  # (the comparison is not of zeros)


@pytest.mark.parametrize("model", sorted(SMALL_MODELS))
def test_bundled_models_write_into_the_buffer(repo_root, model):
    flat, reference = twins(*model_param(repo_root, model))
    for net in (flat, reference):
        train_passes(net)
    assert_same_gradients(flat, reference)
    assert flat.param_diff_buffer.size == sum(b.count for b in flat.learnable_params)


def test_a_layer_replacing_its_diff_is_caught():
    """The check above can fail: a layer that assigns a new array to a parameter's diff
    (instead of adding into it) leaves the buffer, and the comparison sees it."""
    flat, reference = twins(every_learnable_param())
    layer = flat.layer_by_name("ip1")
    original = layer.backward

    def replacing_backward(top, propagate_down, bottom):
        weight = layer.blobs[0]
        weight._diff = weight.diff.copy()  # a new array: what a careless layer would do
        original(top, propagate_down, bottom)

    layer.backward = replacing_backward
    for net in (flat, reference):
        train_passes(net)
    with pytest.raises(AssertionError, match="gradient differs"):
        assert_same_gradients(flat, reference)


def test_a_custom_order_and_bad_orders():
    net = Net(every_learnable_param(), TRAIN, seed=3)
    forward = [p for layer in net.learnable_layers for p in layer.param_ids]
    net.flatten_param_diffs(forward)
    assert list(net.flat_param_ids) == forward
    with pytest.raises(NetError, match=rf"\[99\] are not in 0..{len(net.learnable_params) - 1}"):
        net.flatten_param_diffs([0, 99])
    with pytest.raises(NetError, match="repeats a parameter id"):
        net.flatten_param_diffs([0, 0])


def test_solver_update_on_a_flattened_net_is_unchanged():
    """The SGD update (clip, regularise, momentum) reads and rewrites the diffs in place:
    the same weights after a few steps with or without the flat buffer."""
    from mgcaffe.solvers import get_solver  # noqa: PLC0415

    def solver():
        param = caffe_pb2.SolverParameter(base_lr=0.05, momentum=0.9, weight_decay=0.01,
                                          lr_policy="fixed", max_iter=10, display=0,
                                          type="SGD", random_seed=3, clip_gradients=1.0,
                                          snapshot_after_train=False)
        param.net_param.CopyFrom(every_learnable_param())
        return get_solver(param)

    flat, reference = solver(), solver()
    flat.net.flatten_param_diffs()
    flat.step(3)
    reference.step(3)
    for a, b in zip(flat.net.learnable_params, reference.net.learnable_params):
        assert np.array_equal(a.data, b.data)
