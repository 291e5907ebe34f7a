"""LRN's CUDA kernels (kernels/cuda_lrn.py) on the CuPy double, where they run compiled for
the host, against the layer's array code on the CPU: top, scale and the input gradient, at
the channel edges (a window wider than the channels), odd shapes, float32 and float64; one
launch each way; in place and WITHIN_CHANNEL keep the array code."""

from __future__ import annotations

import cupy_double
import numpy as np
import pytest
from google.protobuf import text_format

from mgcaffe.backend import to_device, to_host
from mgcaffe.blob import Blob
from mgcaffe.layer_types import LayerContext, create_layer
from mgcaffe.layer_types.choice.normalization import LRNRules
from mgcaffe.layer_types.choice.rules import LayerRules
from mgcaffe.proto import caffe_pb2

CASES = [
    # (lrn_param text, bottom shape, dtype)
    ("local_size: 5 alpha: 0.0001 beta: 0.75", (2, 16, 5, 5), np.float32),   # AlexNet's
    ("local_size: 5 alpha: 0.5 beta: 0.75 k: 2", (1, 3, 4, 3), np.float32),   # window > C
    ("local_size: 3 alpha: 1.5 beta: 0.6", (3, 7, 1, 1), np.float64),         # 1x1 cells
    ("local_size: 9 alpha: 0.2 beta: 1.3 k: 0.5", (2, 11, 2, 5), np.float64),
    ("local_size: 1 alpha: 1 beta: 0.75", (1, 4, 3, 3), np.float32),          # no neighbours
]


@pytest.fixture
def double():
    with cupy_double.installed() as d:
        yield d


def make(xp, text, shape, dtype, in_place=False, region=""):
    param = text_format.Parse(f'name: "norm" type: "LRN" lrn_param {{ {text} {region} }}',
                              caffe_pb2.LayerParameter())
    # the CPU reference: the numpy passes, the array code the kernels follow
    rules = LayerRules(lrn=LRNRules(compiled=False))
    layer = create_layer(param, LayerContext(xp=xp, dtype=dtype, seed=0, rules=rules))
    rng = np.random.default_rng(0)
    bottom = Blob(shape, xp=xp, dtype=dtype, name="x")
    bottom.data[...] = to_device(rng.standard_normal(shape).astype(dtype) * 2, xp)
    top = bottom if in_place else Blob((), xp=xp, dtype=dtype, name="y")
    layer.setup([bottom], [top])
    return layer, bottom, top


def run(layer, bottom, top):
    layer.forward([bottom], [top])
    y = to_host(top.data).copy()
    top.diff[...] = to_device(
        np.random.default_rng(1).standard_normal(top.shape).astype(top.dtype), layer.xp)
    layer.backward([top], [True], [bottom])
    return y, to_host(layer._scale).copy(), to_host(bottom.diff).copy()


@pytest.mark.parametrize("text, shape, dtype", CASES)
def test_kernels_follow_the_array_code(double, text, shape, dtype):
    cpu = make(np, text, shape, dtype)
    gpu = make(double.cupy, text, shape, dtype)
    assert gpu[0].choice.path == "gpu-cuda-kernels", gpu[0].choice
    double.counters.reset()
    y_gpu, scale_gpu, dx_gpu = run(*gpu)
    assert double.counters.launches_by_name["RawKernel mgcaffe_lrn_across_forward"] == 1
    assert double.counters.launches_by_name["RawKernel mgcaffe_lrn_across_backward"] == 1
    y_cpu, scale_cpu, dx_cpu = run(*cpu)
    np.testing.assert_array_equal(scale_gpu, scale_cpu)  # the same sums, the same order
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(y_gpu, y_cpu, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(dx_gpu, dx_cpu, rtol=rtol, atol=rtol)
    assert np.any(dx_cpu != 0)


@pytest.mark.parametrize("in_place, region", [(True, ""),
                                              (False, "norm_region: WITHIN_CHANNEL")])
def test_in_place_and_within_channel_keep_the_array_code(double, in_place, region):
    text, shape = "local_size: 3 alpha: 0.5 beta: 0.75", (2, 5, 3, 3)
    layer, bottom, top = make(double.cupy, text, shape, np.float32, in_place, region)
    double.counters.reset()
    layer.forward([bottom], [top])
    assert not any(name.startswith("RawKernel mgcaffe_lrn")
                   for name in double.counters.launches_by_name)
