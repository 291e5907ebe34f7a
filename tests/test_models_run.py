"""Every bundled deploy model builds, and runs forward and backward on the CPU at batch 1.

The backward is `caffe time`'s (parameter gradients and every bottom diff but the data
input's), started from a random diff on the output, so that every layer's backward runs.
"""

from __future__ import annotations

import numpy as np
import pytest

from mgcaffe.layer_types.base import TEST
from mgcaffe.net import Net
from mgcaffe.net.profiling import timing_propagate_down

# (path, output blob, published output shape at batch 1, input C, H, W)
MODELS = [
    ("models/lenet/lenet.prototxt", "prob", (1, 10), (1, 28, 28)),
    ("models/cifar10_quick/cifar10_quick.prototxt", "prob", (1, 10), (3, 32, 32)),
    pytest.param("models/alexnet/deploy.prototxt", "prob", (1, 1000), (3, 227, 227),
                 marks=pytest.mark.slow),
    pytest.param("models/caffenet/deploy.prototxt", "prob", (1, 1000), (3, 227, 227),
                 marks=pytest.mark.slow),
    pytest.param("models/googlenet/deploy.prototxt", "prob", (1, 1000), (3, 224, 224),
                 marks=pytest.mark.slow),
    pytest.param("models/resnet50/deploy.prototxt", "prob", (1, 1000), (3, 224, 224),
                 marks=pytest.mark.slow),
    pytest.param("models/resnet101/deploy.prototxt", "prob", (1, 1000), (3, 224, 224),
                 marks=pytest.mark.slow),
    pytest.param("models/resnet152/deploy.prototxt", "prob", (1, 1000), (3, 224, 224),
                 marks=pytest.mark.slow),
]


@pytest.mark.parametrize("path, output, shape, chw", MODELS)
def test_deploy_model_forward_backward(repo_root, path, output, shape, chw):
    net = Net(str(repo_root / path), TEST, seed=0)
    assert net.inputs == ["data"] and net.outputs == [output]
    rng = np.random.default_rng(0)
    # Deploy files carry no fillers (their weights come from a .caffemodel): draw
    # He-scaled weights, unit BatchNorm statistics and identity Scale layers, so that
    # signals and gradients reach every layer.
    for layer in net.layers:
        if layer.type == "BatchNorm":
            for blob, value in zip(layer.blobs, (0.0, 1.0, 1.0)):
                blob.data[...] = value
        elif layer.type == "Scale":
            for blob, value in zip(layer.blobs, (1.0, 0.0)):
                blob.data[...] = value
        else:
            for blob in layer.blobs:
                fan_in = blob.count // blob.shape[0]
                blob.data[...] = rng.standard_normal(blob.shape) * np.sqrt(2.0 / fan_in)
    image = rng.uniform(-1, 1, (1, *chw)).astype(np.float32)
    net.blobs["data"].reshape(*image.shape)  # forward(data=) takes the net's batch size
    net.forward(data=image)
    # Keep the softmax out of saturation (a one-hot output would stop every gradient):
    # scale the classifier so its outputs have unit spread.
    last = net.learnable_layers[-1]
    spread = float(net.blobs[net.top_names[last.name][0]].data.std())
    for blob in net.layers[last.layer_id].blobs:
        blob.data[...] /= spread
    prob = net.forward(data=image)[output]
    assert prob.shape == shape
    # A softmax output: a probability distribution per image.
    assert np.all(prob >= 0) and np.isclose(prob.sum(), 1.0, atol=1e-4)

    net.blobs[output].diff[...] = rng.standard_normal(shape)
    propagate = timing_propagate_down(net)
    for i in range(len(net.layers) - 1, -1, -1):
        net.backward_layer(i, propagate[i])
    first = net.learnable_layers[0]
    first_grad = net.learnable_params[first.param_ids[0]].diff
    assert np.all(np.isfinite(first_grad)) and np.abs(first_grad).sum() > 0
    # The data input gets no diff, as in `caffe time`.
    assert not net.blobs["data"].diff.any()
