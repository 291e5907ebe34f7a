"""End-to-end gradient check of a whole Net in float64 against central differences.

conv -> relu (in place) -> max pool -> two InnerProducts sharing their weight (pool1 feeds
both: an automatic Split) -> Eltwise sum -> SoftmaxWithLoss. Every owned parameter blob and
the data input (force_backward) are checked element by element.
"""

from __future__ import annotations

import numpy as np
from google.protobuf import text_format

from mgcaffe.net import Net
from mgcaffe.proto import caffe_pb2

NET = """
name: "gradcheck" force_backward: true
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 2 dim: 2 dim: 6 dim: 6 } shape { dim: 2 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 3 kernel_size: 3 pad: 1
          weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip_a" type: "InnerProduct" bottom: "pool1" top: "ip_a"
        param { name: "w" } param { name: "b_a" }
        inner_product_param { num_output: 4
          weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "ip_b" type: "InnerProduct" bottom: "pool1" top: "ip_b" param { name: "w" }
        inner_product_param { num_output: 4
          weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "sum" type: "Eltwise" bottom: "ip_a" bottom: "ip_b" top: "score" }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "score" bottom: "label" top: "loss" }
"""


def test_whole_net_gradients_match_central_differences():
    net = Net(text_format.Parse(NET, caffe_pb2.NetParameter()), seed=3, dtype=np.float64)
    assert "pool1_pool1_0_split" in net.layer_names
    assert len(net.learnable_params) == 5  # conv W, b; shared w; b_a; ip_b's own bias
    rng = np.random.default_rng(0)
    net.blobs["data"].data[...] = rng.standard_normal((2, 2, 6, 6))
    net.blobs["label"].data[...] = [1, 3]

    net.clear_param_diffs()
    net.forward_backward()
    targets = [("data", net.blobs["data"])]
    targets += [(f"param {i}", blob) for i, blob in enumerate(net.learnable_params)]
    analytic = {name: blob.diff.copy() for name, blob in targets}
    assert np.abs(analytic["param 2"]).sum() > 0  # the shared weight did get gradients

    eps = 1e-6
    for name, blob in targets:
        flat = blob.data.reshape(-1)
        grad = analytic[name].reshape(-1)
        for k in range(flat.size):
            saved = flat[k]
            flat[k] = saved + eps
            plus = _loss(net)
            flat[k] = saved - eps
            minus = _loss(net)
            flat[k] = saved
            numeric = (plus - minus) / (2 * eps)
            assert abs(numeric - grad[k]) <= 1e-8 + 1e-5 * max(abs(numeric), abs(grad[k])), \
                f"{name} element {k}: analytic {grad[k]:.10g} vs numeric {numeric:.10g}"
    # Labels may not be forced to take a diff (SoftmaxWithLoss forbids it).
    assert not net.blobs["label"].diff.any()


def _loss(net) -> float:
    net.forward()
    return net.loss
