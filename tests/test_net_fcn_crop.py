"""An FCN-style net (skip connection cropped to the upsampled score, final crop to the
input): Crop's bottom[1] only gives a shape, so a gradient wanted there is zero (Caffe's
Crop never writes it) instead of an error."""

from __future__ import annotations

import numpy as np

from mgcaffe.formats.protoio import parse_net_text
from mgcaffe.layer_types.base import TRAIN
from mgcaffe.net import Net

# data 16x16 -> conv1 (pad 5) 24x24 -> pool 12x12 -> score 12x12 -> upscore2 (x2) 24x24;
# score_pool (pad 2) on conv1 is 28x28 and is cropped to upscore2 (offset 2), which also
# feeds the Eltwise: upscore2 needs a gradient, also through Crop's bottom[1].
FCN = """
name: "fcn_mini"
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 2 dim: 3 dim: 16 dim: 16 } shape { dim: 2 dim: 1 dim: 16
                      dim: 16 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 4 kernel_size: 3 pad: 5
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "score" type: "Convolution" bottom: "pool1" top: "score"
        convolution_param { num_output: 3 kernel_size: 1
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "upscore2" type: "Deconvolution" bottom: "score" top: "upscore2"
        convolution_param { num_output: 3 kernel_size: 2 stride: 2
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "score_pool" type: "Convolution" bottom: "conv1" top: "score_pool"
        convolution_param { num_output: 3 kernel_size: 1 pad: 2
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "score_poolc" type: "Crop" bottom: "score_pool" bottom: "upscore2"
        top: "score_poolc" crop_param { axis: 2 offset: 2 } }
layer { name: "fuse" type: "Eltwise" bottom: "upscore2" bottom: "score_poolc" top: "fuse" }
layer { name: "upscore" type: "Crop" bottom: "fuse" bottom: "data" top: "upscore"
        crop_param { axis: 2 offset: 4 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "upscore" bottom: "label" top: "loss" }
"""


def _net():
    net = Net(parse_net_text(FCN), TRAIN, dtype=np.float64, seed=0)
    rng = np.random.default_rng(1)
    net.blobs["data"].data[...] = rng.standard_normal((2, 3, 16, 16))
    net.blobs["label"].data[...] = rng.integers(0, 3, (2, 1, 16, 16))
    return net


def test_fcn_crop_net_builds_and_backprops_into_the_reference_input():
    net = _net()
    assert net.blobs["upscore"].shape == (2, 3, 16, 16)
    layer = net.layer_names.index("score_poolc")
    assert net.bottom_need_backward[layer] == [True, True]


def test_fcn_gradients_match_central_differences():
    net = _net()
    net.clear_param_diffs()
    net.forward_backward()
    rng = np.random.default_rng(2)
    for name in ("upscore2", "score", "conv1"):
        blob = net.params[name][0]
        analytic = blob.diff.copy()
        flat = blob.data.reshape(-1)
        for index in rng.choice(flat.size, 4, replace=False):
            saved = flat[index]
            flat[index] = saved + 1e-5
            net.forward()
            up = net.loss
            flat[index] = saved - 1e-5
            net.forward()
            down = net.loss
            flat[index] = saved
            numeric = (up - down) / 2e-5
            np.testing.assert_allclose(analytic.reshape(-1)[index], numeric, rtol=1e-4,
                                       atol=1e-8, err_msg=f"{name} weight {index}")
