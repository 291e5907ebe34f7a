"""The CUDA twins' C source, compiled for the host, against the generic kernels (no GPU).

The kernels are plain C apart from their launch indices; with blockIdx = threadIdx = 0 and
blockDim = gridDim = 1 the grid-stride loop visits every index on one host thread. So the
very source that NVRTC compiles on a GPU machine is checked here, bit for bit, against the
generic im2col/col2im and the Pooling layer's MAX loops. Also: the module imports without
CuPy and refuses numpy arrays with a clear message.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest
from google.protobuf import text_format
from im2col_reference import GEOMETRIES
from layer_rules import changed

from mgcaffe.blob import Blob
from mgcaffe.kernels.cuda import im2col_pool as ck
from mgcaffe.kernels.im2col import col2im, conv_output_size, im2col
from mgcaffe.layer_types import LayerContext, create_layer
from mgcaffe.proto import caffe_pb2

HOST_PRELUDE = r"""
#include <algorithm>
using std::min;
#define __global__
struct mgcaffe_dim3 { unsigned int x; };
static const mgcaffe_dim3 blockIdx = {0}, threadIdx = {0}, blockDim = {1}, gridDim = {1};
"""

GEOMETRIES = GEOMETRIES + [((7, 7), (3, 3), (2, 2), (1, 1))]

POOLS = [
    # pooling_param text, bottom shape
    ("pool: MAX kernel_size: 3 stride: 2", (2, 3, 9, 9)),
    ("pool: MAX kernel_size: 3 stride: 2 pad: 1", (2, 3, 8, 7)),
    ("pool: MAX kernel_size: 2 stride: 2", (1, 2, 6, 6)),
    ("pool: MAX kernel_size: 3 stride: 1 pad: 1", (1, 2, 5, 6)),
    ("pool: MAX kernel_h: 3 kernel_w: 2 stride_h: 1 stride_w: 3 pad_h: 1 pad_w: 1",
     (2, 2, 7, 8)),
    ("pool: MAX kernel_size: 3 stride: 2 round_mode: FLOOR", (1, 2, 8, 8)),
    ("pool: MAX kernel_size: 2 stride: 3", (1, 1, 8, 8)),  # stride > kernel: gaps
    ("pool: MAX kernel_size: 12 stride: 4 pad: 2", (1, 2, 17, 15)),  # int16 winner tags
]

C_INT, C_LL, PTR = ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p
C_REAL = {np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double}


@pytest.fixture(scope="module")
def host_kernel(tmp_path_factory):
    """host_kernel(name, dtype, index_dtype=None) -> the kernel compiled as a host function."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler to build the kernels for the host")
    folder = tmp_path_factory.mktemp("host_kernels")
    cache = {}

    def build(name, dtype, index_dtype=None):
        key = (name, np.dtype(dtype), index_dtype and np.dtype(index_dtype))
        if key not in cache:
            stem = "_".join(str(k) for k in key if k is not None).replace(" ", "")
            source = folder / f"{stem}.cpp"
            source.write_text(HOST_PRELUDE + ck.kernel_source(name, dtype, index_dtype))
            library = folder / f"{stem}.so"
            subprocess.run([compiler, "-O1", "-shared", "-fPIC", "-o", str(library),
                            str(source)], check=True, capture_output=True)
            cache[key] = getattr(ctypes.CDLL(str(library)), name)
        return cache[key]

    return build


def ptr(array):
    assert array.flags.c_contiguous
    return array.ctypes.data_as(PTR)


def ints(*values):
    return [C_INT(int(v)) for v in values]


def host_im2col(build, x, kernel, pad, stride, dilation):
    n, c, h, w = x.shape
    oh = conv_output_size(h, kernel[0], pad[0], stride[0], dilation[0])
    ow = conv_output_size(w, kernel[1], pad[1], stride[1], dilation[1])
    col = np.full((c * kernel[0] * kernel[1], n * oh * ow), np.nan, dtype=x.dtype)
    total = c * n * oh * ow
    build("mgcaffe_im2col", x.dtype)(ptr(x), ptr(col), C_LL(total),
                                     *ints(n, c, h, w, *kernel, *pad, *stride, *dilation, oh, ow))
    return col


def host_col2im(build, col, shape, kernel, pad, stride, dilation):
    n, c, h, w = shape
    oh = conv_output_size(h, kernel[0], pad[0], stride[0], dilation[0])
    ow = conv_output_size(w, kernel[1], pad[1], stride[1], dilation[1])
    image = np.full(shape, np.nan, dtype=col.dtype)
    build("mgcaffe_col2im", col.dtype)(ptr(col), ptr(image), C_LL(image.size),
                                       *ints(n, c, h, w, *kernel, *pad, *stride, *dilation, oh,
                                             ow))
    return image


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kernel, pad, stride, dilation", GEOMETRIES)
def test_im2col_source_matches_generic_exactly(host_kernel, dtype, kernel, pad, stride,
                                               dilation):
    x = np.random.default_rng(0).standard_normal((2, 3, 9, 8)).astype(dtype)
    expected = im2col(x, kernel, pad, stride, dilation)
    got = host_im2col(host_kernel, x, kernel, pad, stride, dilation)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kernel, pad, stride, dilation", GEOMETRIES)
def test_col2im_source_matches_generic_exactly(host_kernel, dtype, kernel, pad, stride,
                                               dilation):
    shape = (2, 3, 9, 8)
    oh = conv_output_size(shape[2], kernel[0], pad[0], stride[0], dilation[0])
    ow = conv_output_size(shape[3], kernel[1], pad[1], stride[1], dilation[1])
    rows, cols = shape[1] * kernel[0] * kernel[1], shape[0] * oh * ow
    col = np.random.default_rng(1).standard_normal((rows, cols)).astype(dtype)
    expected = col2im(col, shape, kernel, pad, stride, dilation)
    got = host_col2im(host_kernel, col, shape, kernel, pad, stride, dilation)
    # Same additions in the same order: the same bits, not just close.
    np.testing.assert_array_equal(got, expected)


def pooling_layer(text, shape, dtype, with_mask):
    param = text_format.Parse(f'name: "pool" type: "Pooling" pooling_param {{ {text} }}',
                              caffe_pb2.LayerParameter())
    # The twin gathers offset by offset, as the layer's generic (device) path does; the CPU's
    # default scatter by winner index (and the compiled loops') adds in another order
    # (tests/layer_types/test_pooling).
    rules = changed(pooling={"max_backward_by_index": False, "compiled": False})
    layer = create_layer(param, LayerContext(dtype=dtype, seed=0, rules=rules))
    rng = np.random.default_rng(2)
    bottom = Blob(shape, dtype=dtype, name="x")
    # Few distinct values: ties everywhere, so the first-maximum rule is exercised.
    bottom.data[...] = rng.integers(-3, 4, size=shape)
    top = [Blob((), dtype=dtype, name=f"t{i}") for i in range(2 if with_mask else 1)]
    layer.setup([bottom], top)
    return layer, bottom, top


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("text, shape", POOLS)
def test_max_pool_sources_match_the_pooling_layer(host_kernel, dtype, text, shape):
    layer, bottom, top = pooling_layer(text, shape, dtype, with_mask=True)
    layer.forward([bottom], top)
    winner_ref = layer._winner
    out_hw = top[0].shape[2:]
    n, c, h, w = shape
    out = np.full(top[0].shape, np.nan, dtype=dtype)
    winner = np.full(top[0].shape, 99, dtype=winner_ref.dtype)  # tags: 1 + offset, 0 none
    mask = np.full(top[0].shape, np.nan, dtype=dtype)
    kernel, pad, stride = layer.kernel_now, layer.pad, layer.stride
    forward = host_kernel("mgcaffe_max_pool_forward", dtype, winner.dtype)
    forward(ptr(bottom.data), ptr(out), ptr(winner), ptr(mask), C_INT(1), C_LL(out.size),
            *ints(h, w, *out_hw, *kernel, *pad, *stride),
            C_REAL[np.dtype(dtype)](np.finfo(np.float32).min))
    np.testing.assert_array_equal(out, top[0].data)
    np.testing.assert_array_equal(winner, winner_ref)
    np.testing.assert_array_equal(mask, top[1].data)

    top[0].diff[...] = np.random.default_rng(3).standard_normal(top[0].shape)
    layer.backward(top, [True], [bottom])
    grad = np.full(shape, np.nan, dtype=dtype)
    backward = host_kernel("mgcaffe_max_pool_backward", dtype, winner.dtype)
    backward(ptr(top[0].diff), ptr(winner), ptr(grad), C_LL(grad.size),
             *ints(h, w, *out_hw, *kernel, *pad, *stride))
    np.testing.assert_array_equal(grad, bottom.diff)


AVE_POOLS = [(text.replace("MAX", "AVE"), shape) for text, shape in POOLS] + [
    ("pool: AVE kernel_size: 3 stride: 2 pad: 1", (2, 3, 8, 8)),  # CIFAR-10's pool2/pool3
    ("pool: AVE kernel_size: 5 stride: 3", (1, 2, 14, 14)),       # GoogleNet's loss pools
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("text, shape", AVE_POOLS)
def test_ave_pool_sources_match_the_offset_passes(host_kernel, dtype, text, shape):
    param = text_format.Parse(f'name: "pool" type: "Pooling" pooling_param {{ {text} }}',
                              caffe_pb2.LayerParameter())
    # The offset passes, as on a GPU without the kernels (not the window GEMM or the loops).
    rules = changed(pooling={"compiled": False, "ave_gemm_below": 0})
    layer = create_layer(param, LayerContext(dtype=dtype, seed=0, rules=rules))
    bottom = Blob(shape, dtype=dtype, name="x")
    bottom.data[...] = np.random.default_rng(4).standard_normal(shape)
    top = [Blob((), dtype=dtype, name="t")]
    layer.setup([bottom], top)
    assert layer.choice.path == "offset-passes"
    layer.forward([bottom], top)
    n, c, h, w = shape
    out_hw = top[0].shape[2:]
    geometry = (*layer.kernel_now, *layer.pad, *layer.stride)
    out = np.full(top[0].shape, np.nan, dtype=dtype)
    host_kernel("mgcaffe_ave_pool_forward", dtype)(
        ptr(bottom.data), ptr(out), C_LL(out.size), *ints(h, w, *out_hw, *geometry))
    # Same additions in the same order, the same multiply: the same bits.
    np.testing.assert_array_equal(out, top[0].data)

    top[0].diff[...] = np.random.default_rng(5).standard_normal(top[0].shape)
    layer.backward(top, [True], [bottom])
    grad = np.full(shape, np.nan, dtype=dtype)
    host_kernel("mgcaffe_ave_pool_backward", dtype)(
        ptr(top[0].diff), ptr(grad), C_LL(grad.size), *ints(h, w, *out_hw, *geometry))
    np.testing.assert_array_equal(grad, bottom.diff)


def test_int8_and_int16_winner_tags_are_exercised():
    dtypes = {pooling_layer(text, shape, np.float32, with_mask=False)[0]._winner.dtype
              for text, shape in POOLS}
    assert dtypes == {np.dtype(np.int8), np.dtype(np.int16)}


def test_use_cuda_kernels_is_false_for_numpy():
    assert ck.use_cuda_kernels(np) is False
    assert ck.use_cuda_kernels(np, np.float32) is False


@pytest.mark.parametrize("call", [
    lambda x: ck.im2col(x, (3, 3)),
    lambda x: ck.col2im(x.reshape(1, -1), (1, 1, 1, 1), (1, 1)),
    lambda x: ck.max_pool_forward(x, (2, 2), (0, 0), (1, 1), (1, 1), x, x),
    lambda x: ck.ave_pool_forward(x, (2, 2), (0, 0), (1, 1), (1, 1), x),
    lambda x: ck.ave_pool_backward(x, (2, 2), (0, 0), (1, 1), x),
])
def test_twins_refuse_numpy_arrays_with_a_clear_message(call):
    with pytest.raises(TypeError, match="CUDA kernels take CuPy arrays"):
        call(np.zeros((1, 1, 3, 3), np.float32))


def test_kernel_source_rejects_unsupported_types():
    with pytest.raises(ValueError, match="no CUDA kernel for dtype int32"):
        ck.kernel_source("mgcaffe_im2col", np.int32)
    with pytest.raises(ValueError, match="int8, int16 or int32"):
        ck.kernel_source("mgcaffe_max_pool_forward", np.float32, np.int64)
    with pytest.raises(ValueError, match="unknown kernel"):
        ck.kernel_source("nope", np.float32)
