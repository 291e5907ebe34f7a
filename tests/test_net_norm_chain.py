"""BatchNorm, Scale and ReLU in place on one blob run as one sweep (layer_types.norm_chain):
found only where the three share the blob, the same results as layer by layer, and layer by
layer wherever a run, a callback or debug_info looks at the layers one at a time."""

from __future__ import annotations

import numpy as np
import pytest

from mgcaffe.kernels.loops import batch_norm as batch_norm_loops
from mgcaffe.layer_types import TEST, TRAIN
from mgcaffe.layer_types.scale_bias import ScaleLayer
from mgcaffe.net import Net
from mgcaffe.net import norm_chain as chain_module
from mgcaffe.net.profiling import profile_net

pytestmark = pytest.mark.skipif(batch_norm_loops.load() is None,
                                reason="numba is not importable: no compiled loops to chain")

CONV = ('convolution_param { num_output: 6 kernel_size: 3 pad: 1 '
        'weight_filler { type: "gaussian" std: 0.3 } }')
SCALE = ('scale_param {{ bias_term: {bias} filler {{ type: "uniform" min: 0.5 max: 1.5 }} '
         'bias_filler {{ type: "uniform" min: -0.5 max: 0.5 }} }}')
NET = f"""
name: "chains"
layer {{ name: "data" type: "Input" top: "data" top: "label"
  input_param {{ shape {{ dim: 4 dim: 3 dim: 7 dim: 9 }} shape {{ dim: 4 }} }} }}
layer {{ name: "conv1" type: "Convolution" bottom: "data" top: "conv1" {CONV} }}
layer {{ name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" }}
layer {{ name: "sc1" type: "Scale" bottom: "conv1" top: "conv1" {SCALE.format(bias='true')} }}
layer {{ name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }}
layer {{ name: "conv2" type: "Convolution" bottom: "conv1" top: "conv2" {CONV} }}
layer {{ name: "bn2" type: "BatchNorm" bottom: "conv2" top: "conv2" }}
layer {{ name: "sc2" type: "Scale" bottom: "conv2" top: "conv2" {SCALE.format(bias='false')} }}
layer {{ name: "sum" type: "Eltwise" bottom: "conv1" bottom: "conv2" top: "sum" }}
layer {{ name: "bn3" type: "BatchNorm" bottom: "sum" top: "bn3" }}
layer {{ name: "sc3" type: "Scale" bottom: "bn3" top: "bn3" {SCALE.format(bias='true')} }}
layer {{ name: "leaky" type: "ReLU" bottom: "bn3" top: "bn3" relu_param {{ negative_slope: 0.1 }} }}
layer {{ name: "fc" type: "InnerProduct" bottom: "bn3" top: "fc"
  inner_product_param {{ num_output: 5 weight_filler {{ type: "gaussian" std: 0.1 }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }}
"""


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "chains.prototxt"
    path.write_text(NET)
    return str(path)


def make(model, phase=TRAIN, fuse=True):
    net = Net(model, phase, seed=1)
    net.fuse_norm_chains = fuse
    rng = np.random.default_rng(0)
    net.blobs["data"].data[...] = rng.standard_normal(net.blobs["data"].shape)
    net.blobs["label"].data[...] = rng.integers(0, 5, 4)
    for name in ("bn1", "bn2"):  # global statistics for TEST
        mean, var, factor = net.params[name]
        mean.data[...] = rng.standard_normal(mean.shape)
        var.data[...] = 1 + rng.random(var.shape)
        factor.data[...] = 1.5
    return net


def state(net):
    blobs = {k: (b.data.copy(), b.diff.copy()) for k, b in net.blobs.items()}
    params = {k: [(p.data.copy(), p.diff.copy()) for p in ps] for k, ps in net.params.items()}
    return blobs, params


def passes(net, count=2):
    for _ in range(count):
        net.clear_param_diffs()
        net.forward_backward()
    return state(net)


def assert_same(a, b):
    """Data bit for bit; diffs to the float64 sums' other order."""
    (blobs_a, params_a), (blobs_b, params_b) = a, b
    for name in blobs_a:
        np.testing.assert_array_equal(blobs_a[name][0], blobs_b[name][0], err_msg=name)
        np.testing.assert_allclose(blobs_a[name][1], blobs_b[name][1], rtol=1e-5, atol=1e-7,
                                   err_msg=name)
    for name in params_a:
        for (data_a, diff_a), (data_b, diff_b) in zip(params_a[name], params_b[name]):
            np.testing.assert_array_equal(data_a, data_b, err_msg=name)
            np.testing.assert_allclose(diff_a, diff_b, rtol=1e-5, atol=1e-7, err_msg=name)


def test_chains_are_the_in_place_runs_only(model):
    """bn1-sc1-relu1 and bn2-sc2 share their blob; bn3 writes a new one, and a leaky ReLU
    is not in a chain."""
    net = make(model)
    found = {net.layer_names[c.first]: net.layer_names[c.last] for c in net._chains}
    assert found == {"bn1": "relu1", "bn2": "sc2"}


@pytest.mark.parametrize("phase", [TRAIN, TEST])
def test_a_chained_pass_gives_the_layers_results(model, phase, monkeypatch):
    expected = passes(make(model, phase, fuse=False))
    calls = []
    for name in ("forward", "backward"):
        real = getattr(chain_module.NormChain, name)
        monkeypatch.setattr(chain_module.NormChain, name,
                            lambda self, real=real, name=name: (calls.append(name), real(self)))
    got = passes(make(model, phase))
    assert calls == ["forward", "forward", "backward", "backward"] * 2
    assert_same(expected, got)


def test_the_chain_runs_instead_of_its_layers(model, monkeypatch):
    ran = []
    real = ScaleLayer.forward
    monkeypatch.setattr(ScaleLayer, "forward",
                        lambda self, b, t: (ran.append(self.name), real(self, b, t)))
    make(model).forward()
    assert ran == ["sc3"]


def test_a_run_that_ends_inside_a_chain_runs_layer_by_layer(model):
    fused, plain = make(model), make(model, fuse=False)
    for net in (fused, plain):
        net.forward(end="sc1")
    np.testing.assert_array_equal(fused.blobs["conv1"].data, plain.blobs["conv1"].data)
    assert (plain.blobs["conv1"].data < 0).any()  # Scale's output, before the ReLU


def test_callbacks_see_each_layer_of_a_chain(model):
    seen = {}
    net = make(model)
    net.after_forward(lambda i: seen.setdefault(net.layer_names[i],
                                                net.blobs["conv1"].data.copy()))
    net.forward()
    plain = make(model, fuse=False)
    plain.forward(end="bn1")
    np.testing.assert_array_equal(seen["bn1"], plain.blobs["conv1"].data)


def test_layers_run_alone_after_a_chained_forward(model):
    """The chain leaves each layer's kept arrays set: a backward layer by layer after a
    chained forward gives the layers' own results."""
    expected = passes(make(model, fuse=False), count=1)
    net = make(model)
    net.clear_param_diffs()
    net.forward()
    net.fuse_norm_chains = False
    net.backward()
    assert_same(expected, state(net))


def test_scale_takes_its_own_copy_back_after_a_lent_one(model):
    net = make(model)
    scale = net.layer_by_name("sc1")
    lent = np.full(net.blobs["conv1"].shape, 7.0, np.float32)
    scale.lend_input_copy(lent)
    net.fuse_norm_chains = False
    net.forward()
    assert scale._input_copy is not lent and (lent == 7.0).all()


def test_profiles_put_a_chain_on_its_first_layer_forward_and_last_backward(model):
    net = make(model)
    r = profile_net(net, 2)
    times = dict(zip(r["layer_names"], zip(r["forward"], r["backward"])))
    assert times["bn1"][0] > 0 and times["sc1"][0] == times["relu1"][0] == 0
    assert times["relu1"][1] > 0 and times["sc1"][1] == times["bn1"][1] == 0
    assert times["sc2"][1] > 0 and times["bn2"][1] == 0
