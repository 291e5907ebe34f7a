"""SoftmaxWithLoss's CUDA kernels (kernels/cuda_softmax_loss.py) on the CuPy double, where
they run compiled for the host, against the layer's array code on the CPU: loss, probability
top and gradient, with ignored labels, several predictions per sample, every normalisation,
and an out-of-range label reported with the loss."""

from __future__ import annotations

import cupy_double
import numpy as np
import pytest
from google.protobuf import text_format

from mgcaffe.backend import to_device, to_host
from mgcaffe.blob import Blob
from mgcaffe.layer_types import LayerContext, create_layer
from mgcaffe.proto import caffe_pb2

CASES = [
    # (loss_param text, scores shape, dtype)
    ("", (6, 5), np.float32),
    ("", (4, 3, 2, 3), np.float32),                       # inner 6: softmax over axis 1
    ("loss_param { ignore_label: 2 }", (8, 4), np.float32),
    ("loss_param { ignore_label: 1 normalization: VALID }", (3, 4, 5), np.float64),
    ("loss_param { ignore_label: 0 normalization: FULL }", (3, 4, 5), np.float32),
    ("loss_param { normalization: BATCH_SIZE }", (3, 4, 5), np.float64),
    ("loss_param { normalization: NONE }", (5, 7), np.float32),
]


@pytest.fixture
def double():
    with cupy_double.installed() as d:
        yield d


def make(xp, text, shape, dtype, labels, tops):
    param = text_format.Parse(f'name: "loss" type: "SoftmaxWithLoss" {text}',
                              caffe_pb2.LayerParameter())
    layer = create_layer(param, LayerContext(xp=xp, dtype=dtype, seed=0))
    scores = Blob(shape, xp=xp, dtype=dtype, name="scores")
    scores.data[...] = to_device(
        np.random.default_rng(0).standard_normal(shape).astype(dtype) * 3, xp)
    label = Blob(labels.shape, xp=xp, dtype=dtype, name="label")
    label.data[...] = to_device(labels.astype(dtype), xp)
    top = [Blob((), xp=xp, dtype=dtype, name=f"top{i}") for i in range(tops)]
    layer.setup([scores, label], top)
    return layer, [scores, label], top


def run(layer, bottom, top):
    layer.forward(bottom, top)
    top[0].diff[...] = 1.5  # a loss weight
    layer.backward(top, [True, False], bottom)
    return ([to_host(t.data) for t in top], to_host(bottom[0].diff))


@pytest.mark.parametrize("tops", [1, 2])
@pytest.mark.parametrize("text, shape, dtype", CASES)
def test_kernels_follow_the_array_code(double, text, shape, dtype, tops):
    predictions = (shape[0],) + shape[2:]
    labels = np.random.default_rng(1).integers(0, shape[1], size=predictions)
    cpu = make(np, text, shape, dtype, labels, tops)
    gpu = make(double.cupy, text, shape, dtype, labels, tops)
    assert gpu[0].choice.path == "gpu-cuda-kernels", gpu[0].choice
    double.counters.reset()
    (tops_gpu, diff_gpu) = run(*gpu)
    assert double.counters.launches_by_name["RawKernel mgcaffe_softmax_loss_forward"] == 1
    assert double.counters.launches_by_name["RawKernel mgcaffe_softmax_loss_backward"] == 1
    (tops_cpu, diff_cpu) = run(*cpu)
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    for got, want in zip(tops_gpu, tops_cpu):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(diff_gpu, diff_cpu, rtol=rtol, atol=rtol)
    assert np.any(diff_cpu != 0)


def test_every_label_ignored_gives_zero_loss_and_gradient(double):
    labels = np.full((4,), 3)
    layer, bottom, top = make(double.cupy, "loss_param { ignore_label: 3 }", (4, 5),
                              np.float32, labels, 1)
    (loss,), diff = run(layer, bottom, top)
    assert float(loss) == 0.0
    assert not np.any(diff)


@pytest.mark.parametrize("bad", [5, -1, 7.0])
def test_a_label_out_of_range_is_reported_with_the_loss(double, bad):
    labels = np.array([0, 1, bad, 2])
    layer, bottom, top = make(double.cupy, "", (4, 5), np.float32, labels, 1)
    launches = double.counters.launches
    layer.forward(bottom, top)
    assert double.counters.launches - launches <= 3  # kernel, reduction, division
    (flag, error), = layer.deferred_checks
    assert float(to_host(flag)) == 1  # one bad label counted
    message = str(error())
    assert f"label {int(bad)} is out of range for 5 classes" in message
    # meanwhile the bad label reads class 0: a finite loss, no read past the class axis
    assert np.isfinite(to_host(top[0].data))
    cpu = make(np, "", (4, 5), np.float32, labels, 1)
    with pytest.raises(Exception, match=f"label {int(bad)} is out of range"):
        cpu[0].forward(cpu[1], cpu[2])


def test_an_ignored_label_out_of_range_is_no_error(double):
    labels = np.array([0, 9, 1])
    layer, bottom, top = make(double.cupy, "loss_param { ignore_label: 9 }", (3, 4),
                              np.float32, labels, 1)
    layer.forward(bottom, top)
    (flag, _), = layer.deferred_checks
    assert float(to_host(flag)) == 0
