"""BatchNorm's and Scale's CUDA kernels (kernels/cuda_norm.py) on the CuPy double, where they
run compiled for the host, against the layers' numpy array code on the CPU: tops, running
statistics, parameter and input gradients; batch and global statistics, in place and not,
odd shapes (batch 1, 1x1 cells, 3 and 7 channels), float32 and float64; two launches forward
and backward for BatchNorm, one forward and two backward for Scale."""

from __future__ import annotations

import cupy_double
import numpy as np
import pytest
from google.protobuf import text_format

from mgcaffe.backend import to_device, to_host
from mgcaffe.blob import Blob
from mgcaffe.layer_types import LayerContext, create_layer
from mgcaffe.layer_types.choice.normalization import BatchNormRules, ScaleRules
from mgcaffe.layer_types.choice.rules import LayerRules
from mgcaffe.proto import caffe_pb2

SHAPES = [(2, 16, 5, 5), (1, 3, 4, 3), (3, 7, 1, 1), (4, 5, 2, 9)]
DTYPES = [np.float32, np.float64]
# the CPU reference: numpy's whole-array passes, the array code the kernels follow
NUMPY = LayerRules(batch_norm=BatchNormRules(compiled_loops=False),
                   scale=ScaleRules(fused_rows=False))


@pytest.fixture
def double():
    with cupy_double.installed() as d:
        yield d


def tol(dtype):
    return dict(rtol=2e-5, atol=2e-5) if dtype == np.float32 else dict(rtol=1e-11, atol=1e-11)


def layer_of(xp, text, dtype, phase=caffe_pb2.TRAIN):
    param = text_format.Parse(text, caffe_pb2.LayerParameter())
    param.phase = phase
    return create_layer(param, LayerContext(xp=xp, dtype=dtype, seed=0, rules=NUMPY,
                                            phase=phase))


def blobs_for(xp, shape, dtype, in_place, seed=0):
    rng = np.random.default_rng(seed)
    bottom = Blob(shape, xp=xp, dtype=dtype, name="x")
    bottom.data[...] = to_device(rng.standard_normal(shape).astype(dtype) * 3 + 1, xp)
    top = bottom if in_place else Blob((), xp=xp, dtype=dtype, name="y")
    return bottom, top


def step(layer, bottom, top, seed=1):
    """forward, a random top diff, backward: (top, input gradient) on the host."""
    layer.forward([bottom], [top])
    y = to_host(top.data).copy()
    top.diff[...] = to_device(
        np.random.default_rng(seed).standard_normal(top.shape).astype(top.dtype), layer.xp)
    layer.backward([top], [True], [bottom])
    return y, to_host(bottom.diff).copy()


BN = 'name: "bn" type: "BatchNorm" batch_norm_param { moving_average_fraction: 0.9 %s }'


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_place", [False, True])
def test_batch_norm_kernels_follow_the_array_code(double, shape, dtype, in_place):
    results = {}
    for name, xp in (("cpu", np), ("gpu", double.cupy)):
        layer = layer_of(xp, BN % "", dtype)
        bottom, top = blobs_for(xp, shape, dtype, in_place)
        layer.setup([bottom], [top])
        if name == "gpu":
            assert layer.choice.path == "gpu-cuda-kernels", layer.choice
            double.counters.reset()
        runs = []
        for seed in (1, 2):  # twice: the running sums and factor build up
            bottom.data[...] = to_device(np.random.default_rng(seed).standard_normal(
                shape).astype(dtype) * 2 - 0.5, xp)
            runs.append(step(layer, bottom, top, seed))
        if name == "gpu":
            assert sum(double.counters.launches_by_name[f"RawKernel mgcaffe_{k}"]
                       for k in ("bn_stats", "bn_normalize", "channel_sums",
                                 "bn_backward")) == 8
        results[name] = runs, [to_host(b.data).copy() for b in layer.blobs]
    (cpu_runs, cpu_stats), (gpu_runs, gpu_stats) = results["cpu"], results["gpu"]
    for (y_c, dx_c), (y_g, dx_g) in zip(cpu_runs, gpu_runs):
        np.testing.assert_allclose(y_g, y_c, **tol(dtype))
        np.testing.assert_allclose(dx_g, dx_c, **tol(dtype))
        assert np.any(dx_c != 0)
    for got, want in zip(gpu_stats, cpu_stats):
        np.testing.assert_allclose(got, want, **tol(dtype))
    assert cpu_stats[2][0] == pytest.approx(1.9)  # 0.9 * 1 + 1: the factor of two passes


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_norm_kernels_with_global_statistics(double, dtype):
    shape = (2, 7, 3, 1)
    rng = np.random.default_rng(5)
    stats = [rng.uniform(-1, 1, 7), rng.uniform(0.5, 2, 7), np.array([2.5])]
    results = {}
    for name, xp in (("cpu", np), ("gpu", double.cupy)):
        layer = layer_of(xp, BN % "use_global_stats: true", dtype)
        bottom, top = blobs_for(xp, shape, dtype, in_place=False)
        layer.setup([bottom], [top])
        for blob, values in zip(layer.blobs, stats):
            blob.data[...] = to_device(values.astype(dtype), xp)
        results[name] = step(layer, bottom, top)
    for got, want in zip(results["gpu"], results["cpu"]):
        np.testing.assert_allclose(got, want, **tol(dtype))
    # the factor 0 of a layer never trained gives mean 0 and variance 0, as in Caffe (eps a
    # float field: 1e-5 as float32)
    layer = layer_of(double.cupy, BN % "use_global_stats: true", dtype)
    bottom, top = blobs_for(double.cupy, shape, dtype, in_place=False)
    layer.setup([bottom], [top])
    layer.forward([bottom], [top])
    np.testing.assert_allclose(to_host(top.data), to_host(bottom.data) / np.sqrt(
        dtype(np.float32(1e-5))), **tol(dtype))


SCALE = 'name: "s" type: "Scale" scale_param { %s }'


@pytest.mark.parametrize("text", ["bias_term: true", "",
                                  "axis: 1 num_axes: 2 bias_term: true"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_place", [False, True])
def test_scale_kernels_follow_the_array_code(double, text, shape, dtype, in_place):
    results = {}
    for name, xp in (("cpu", np), ("gpu", double.cupy)):
        layer = layer_of(xp, SCALE % (text + ' filler { type: "gaussian" std: 1 }'
                                      ' bias_filler { type: "gaussian" std: 1 }'), dtype)
        bottom, top = blobs_for(xp, shape, dtype, in_place)
        layer.setup([bottom], [top])
        for b in layer.blobs:  # a diff already holding a gradient: the sums add to it
            b.diff[...] = to_device(np.full(b.shape, 0.25, dtype), xp)
        if name == "gpu":
            assert layer.choice.path == "gpu-cuda-kernels", layer.choice
            double.counters.reset()
        y, dx = step(layer, bottom, top)
        if name == "gpu":
            assert sum(double.counters.launches_by_name[f"RawKernel mgcaffe_{k}"]
                       for k in ("scale_forward", "channel_sums", "scale_input_grad")) == 3
        results[name] = y, dx, [to_host(b.diff).copy() for b in layer.blobs]
    (y_c, dx_c, d_c), (y_g, dx_g, d_g) = results["cpu"], results["gpu"]
    np.testing.assert_allclose(y_g, y_c, **tol(dtype))
    np.testing.assert_allclose(dx_g, dx_c, **tol(dtype))
    for got, want in zip(d_g, d_c):
        np.testing.assert_allclose(got, want, **tol(dtype))
        assert np.all(want != 0.25)


def test_scale_kernels_with_the_operand_as_a_second_bottom(double):
    # the scale gradient goes to bottom[1]'s diff, overwritten (not added), as the CPU does
    shape, dtype = (2, 3, 4, 2), np.float64
    results = {}
    for name, xp in (("cpu", np), ("gpu", double.cupy)):
        layer = layer_of(xp, SCALE % "axis: 1", dtype)
        x, top = blobs_for(xp, shape, dtype, in_place=False)
        s = Blob((3, 4), xp=xp, dtype=dtype, name="s")
        s.data[...] = to_device(np.random.default_rng(3).standard_normal((3, 4)), xp)
        s.diff[...] = to_device(np.full((3, 4), 7.0), xp)
        layer.setup([x, s], [top])
        layer.forward([x, s], [top])
        top.diff[...] = to_device(np.random.default_rng(4).standard_normal(shape), xp)
        layer.backward([top], [True, True], [x, s])
        results[name] = [to_host(a).copy() for a in (top.data, x.diff, s.diff)]
    for got, want in zip(results["gpu"], results["cpu"]):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_other_types_keep_the_array_code(double):
    layer = layer_of(double.cupy, BN % "", np.float16)
    bottom, top = blobs_for(double.cupy, (2, 3, 2, 2), np.float16, in_place=False)
    layer.setup([bottom], [top])
    assert layer.choice.path == "gpu-passes" and "float16" in layer.choice.reason
