"""The double's RawKernel checks every launch against the kernel's parameter list, as CuPy
would marshal the arguments (tests/support/cupy_double/signature.py, CuPy 14.2.0's rules).

On a GPU a mismatch is silent garbage: cuLaunchKernel copies as many bytes as the parameter
has, so an np.int32 given for a `long long` reads four bytes past it, and a float64 array
given for `float*` is read as floats. The host build of the same source often hides both.
Here they fail the launch; the planted mismatches below show it, through the engine too.
"""

from __future__ import annotations

import re

import cupy_double
import numpy as np
import pytest
from cupy_double.rawkernel import check_launch
from cupy_double.signature import check_arguments, kernel_parameters

from mgcaffe.kernels.cuda import im2col_pool as ck
from mgcaffe.kernels.cuda import launch

IM2COL = ck.kernel_source("mgcaffe_im2col", np.float32)


@pytest.fixture
def double():
    with cupy_double.installed() as d:
        yield d


def test_the_parameter_list_is_read_from_the_source():
    params = kernel_parameters(IM2COL, "mgcaffe_im2col")
    assert [p.name for p in params[:4]] == ["x", "col", "total", "num"]
    assert [(str(p.dtype), p.pointer) for p in params[:3]] == [
        ("float32", True), ("float32", True), ("int64", False)]
    assert all((str(p.dtype), p.pointer) == ("int32", False) for p in params[3:])
    assert len(params) == 17
    # typedefs resolved: the winner tags of MAX pooling are `index_t*`, here `signed char*`
    pool = kernel_parameters(ck.kernel_source("mgcaffe_max_pool_forward", np.float64, np.int8),
                             "mgcaffe_max_pool_forward")
    assert [(p.name, str(p.dtype)) for p in pool[:3]] == [
        ("x", "float64"), ("top", "float64"), ("winner", "int8")]
    assert (pool[-1].name, str(pool[-1].dtype), pool[-1].pointer) == ("lowest", "float64", False)


def test_every_registered_variant_has_a_readable_signature():
    from nvrtc_report import all_variants

    for variant in all_variants():
        params = kernel_parameters(variant.source, variant.name)
        assert params and all(p.dtype is not None for p in params), variant


def _im2col_args(double, x_dtype=np.float32, total=None):
    cupy = double.cupy
    x = cupy.zeros((2, 3, 4, 4), dtype=x_dtype)
    col = cupy.empty((27, 32), dtype=np.float32)
    total = np.int64(2 * 3 * 4 * 4) if total is None else total
    return (x, col, total) + tuple(np.int32(v) for v in (2, 3, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1,
                                                         4, 4))


def test_a_correct_launch_runs(double):
    kernel = double.cupy.RawKernel(IM2COL, "mgcaffe_im2col")
    try:
        kernel((1,), (256,), _im2col_args(double))
    except RuntimeError as exc:  # no C++ compiler to build the host library
        pytest.skip(str(exc))
    assert double.counters.launches_by_name["RawKernel mgcaffe_im2col"] == 1


def test_planted_int32_for_long_long_fails_the_launch(double):
    kernel = double.cupy.RawKernel(IM2COL, "mgcaffe_im2col")
    with pytest.raises(TypeError, match=r"mgcaffe_im2col: parameter 2 `long long total` takes "
                                        r"int64, got numpy.int32 \(its own 4 bytes\)"):
        kernel((1,), (256,), _im2col_args(double, total=np.int32(96)))
    assert "RawKernel mgcaffe_im2col" not in double.counters.launches_by_name


def test_planted_float64_array_for_float_pointer_fails_the_launch(double):
    kernel = double.cupy.RawKernel(IM2COL, "mgcaffe_im2col")
    with pytest.raises(TypeError, match=r"parameter 0 `const real \* x` takes a float32 "
                                        r"pointer, got a float64 device array"):
        kernel((1,), (256,), _im2col_args(double, x_dtype=np.float64))


def test_a_planted_mismatch_at_a_launch_site_fails_the_layer(double, monkeypatch):
    """The int32-for-`long long` slip planted in im2col's launch: a Convolution forward on
    the double now fails, where the host build would have run it."""
    from google.protobuf import text_format

    from mgcaffe.blob import Blob
    from mgcaffe.layer_types import LayerContext, create_layer
    from mgcaffe.proto import caffe_pb2

    real = launch.launch

    def slipped(xp, name, dtype, total, args, index_dtype=None):
        if name == "mgcaffe_im2col":
            args = args[:2] + (np.int32(args[2]),) + args[3:]
        return real(xp, name, dtype, total, args, index_dtype)

    monkeypatch.setattr(ck, "launch", slipped)
    cupy = double.cupy
    param = text_format.Parse('name: "c" type: "Convolution" convolution_param { num_output: 2 '
                              'kernel_size: 3 pad: 1 weight_filler { type: "xavier" } }',
                              caffe_pb2.LayerParameter())
    layer = create_layer(param, LayerContext(xp=cupy, dtype=np.float32, seed=0))
    bottom = Blob((2, 3, 5, 5), xp=cupy, dtype=np.float32, name="x")
    top = [Blob((), xp=cupy, dtype=np.float32, name="y")]
    layer.setup([bottom], top)
    assert "cuda" in layer.choice.path  # the layer does take the CUDA im2col
    with pytest.raises(TypeError, match="`long long total` takes int64, got numpy.int32"):
        layer.forward([bottom], top)


SCALARS = kernel_parameters('typedef float real;\nextern "C" __global__ void k(int n, real s) {}',
                           "k")


@pytest.mark.parametrize("args, message", [
    # CuPy passes a Python int as 8 bytes: wrong for a 4-byte `int`, whatever the value
    ((7, np.float32(1)), "parameter 0 `int n` takes int32, got a Python int (CuPy passes int64)"),
    ((np.int64(7), np.float32(1)), "parameter 0 `int n` takes int32, got numpy.int64"),
    ((True, np.float32(1)), "parameter 0 `int n` takes int32, got a Python bool"),
    ((np.int32(7), 1.0), "parameter 1 `real s` takes float32, got a Python float (CuPy passes "
                         "float64)"),
    ((np.int32(7), np.float64(1)), "parameter 1 `real s` takes float32, got numpy.float64"),
], ids=["python-int", "int64", "bool", "python-float", "float64"])
def test_scalars_are_taken_as_cupy_passes_them(args, message):
    with pytest.raises(TypeError, match=re.escape(message)):
        check_arguments("k", SCALARS, args, lambda v: False)


def test_scalars_of_the_parameters_types_pass():
    check_arguments("k", SCALARS, (np.int32(7), np.float32(2.0)), lambda v: False)


def test_counts_kinds_and_numpy_arrays_are_checked(double):
    params = kernel_parameters('extern "C" __global__ void k(const float* x, int n) {}', "k")
    device = double.cupy.zeros(3, dtype=np.float32)
    is_device = lambda v: hasattr(v, "_a")  # noqa: E731
    with pytest.raises(TypeError, match="1 arguments for 2 parameters"):
        check_arguments("k", params, (device,), is_device)
    with pytest.raises(TypeError, match="parameter 0 .* is a pointer, got numpy.int32"):
        check_arguments("k", params, (np.int32(1), np.int32(1)), is_device)
    with pytest.raises(TypeError, match="numpy.ndarray of shape \\(3,\\)"):
        check_arguments("k", params, (np.zeros(3, np.float32), np.int32(1)), is_device)
    check_arguments("k", params, (None, np.array([3], np.int32)), is_device)  # as CuPy


@pytest.mark.parametrize("grid, block", [((1,), (1025,)), ((0,), (256,)), ((1,), (8, 8, 65)),
                                         ((2**31,), (256,)), ((1, 65536), (32,))])
def test_launches_outside_cudas_limits_fail(grid, block):
    with pytest.raises(ValueError, match="outside CUDA's limits"):
        check_launch("k", grid, block)

