"""The CUDA twins on a GPU: bit-identical to the generic kernels run by CuPy and by numpy, and
to the Pooling layer's MAX loops on the CPU (values, winner tags, mask, gradient)."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from mgcaffe.blob import Blob
from mgcaffe.kernels.cuda import im2col_pool as ck
from mgcaffe.kernels.im2col import col2im, conv_output_size, im2col
from mgcaffe.layer_types import LayerContext, create_layer
from mgcaffe.proto import caffe_pb2

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

GEOMETRIES = [
    # input shape, kernel, pad, stride, dilation
    ((2, 3, 9, 8), (1, 1), (0, 0), (1, 1), (1, 1)),
    ((2, 3, 9, 8), (3, 3), (1, 1), (1, 1), (1, 1)),
    ((2, 3, 9, 8), (3, 2), (0, 1), (2, 1), (1, 1)),
    ((1, 4, 11, 10), (2, 3), (2, 1), (1, 3), (1, 2)),
    ((3, 2, 12, 12), (3, 3), (2, 2), (2, 2), (2, 2)),
    ((4, 3, 32, 32), (7, 7), (3, 3), (2, 2), (1, 1)),
]

POOLS = [
    ("pool: MAX kernel_size: 3 stride: 2", (2, 3, 9, 9)),
    ("pool: MAX kernel_size: 3 stride: 2 pad: 1", (2, 3, 8, 7)),
    ("pool: MAX kernel_size: 2 stride: 2", (4, 5, 16, 16)),
    ("pool: MAX kernel_h: 3 kernel_w: 2 stride_h: 1 stride_w: 3 pad_h: 1 pad_w: 1",
     (2, 2, 7, 8)),
    ("pool: MAX kernel_size: 3 stride: 2 round_mode: FLOOR", (1, 2, 8, 8)),
    ("pool: MAX kernel_size: 12 stride: 4 pad: 2", (1, 2, 17, 15)),
]


def test_use_cuda_kernels_for_cupy():
    assert ck.use_cuda_kernels(cp)
    assert ck.use_cuda_kernels(cp, np.float32) and ck.use_cuda_kernels(cp, np.float64)
    assert not ck.use_cuda_kernels(cp, np.float16)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, kernel, pad, stride, dilation", GEOMETRIES)
def test_im2col_and_col2im_equal_the_generic_ones(dtype, shape, kernel, pad, stride, dilation):
    geometry = (kernel, pad, stride, dilation)
    host = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    x = cp.asarray(host)
    col = ck.im2col(x, *geometry)
    cp.testing.assert_array_equal(col, im2col(x, *geometry))
    np.testing.assert_array_equal(col.get(), im2col(host, *geometry))
    back = ck.col2im(col, shape, *geometry)
    cp.testing.assert_array_equal(back, col2im(col, shape, *geometry))
    np.testing.assert_array_equal(back.get(), col2im(col.get(), shape, *geometry))


def test_twins_write_into_given_outputs_even_non_contiguous_ones():
    shape, geometry = (2, 3, 6, 6), ((3, 3), (1, 1), (1, 1), (1, 1))
    x = cp.asarray(np.random.default_rng(1).standard_normal(shape), dtype=cp.float32)
    oh = conv_output_size(6, 3, 1, 1, 1)
    rows, cols = 3 * 9, 2 * oh * oh
    big = cp.zeros((rows, 2 * cols), cp.float32)
    out = big[:, ::2]  # a strided view
    assert ck.im2col(x, *geometry, out=out) is out
    cp.testing.assert_array_equal(out, im2col(x, *geometry))
    image = cp.full((2, 3, 6, 12), cp.nan, cp.float32)[..., ::2]
    ck.col2im(out, shape, *geometry, out=image)
    cp.testing.assert_array_equal(image, col2im(im2col(x, *geometry), shape, *geometry))


def test_shape_errors_are_value_errors():
    x = cp.zeros((1, 1, 4, 4), cp.float32)
    with pytest.raises(ValueError, match="out has shape"):
        ck.im2col(x, (3, 3), out=cp.zeros((2, 2), cp.float32))
    with pytest.raises(ValueError, match="col has shape"):
        ck.col2im(cp.zeros((2, 2), cp.float32), (1, 1, 4, 4), (3, 3))


def pooling(text, shape, xp, host_x):
    param = text_format.Parse(f'name: "pool" type: "Pooling" pooling_param {{ {text} }}',
                              caffe_pb2.LayerParameter())
    layer = create_layer(param, LayerContext(xp=xp, dtype=np.float32, seed=0))
    bottom = Blob(shape, xp=xp, dtype=np.float32, name="x")
    bottom.data[...] = xp.asarray(host_x)
    top = [Blob((), xp=xp, dtype=np.float32, name=f"t{i}") for i in range(2)]
    layer.setup([bottom], top)
    return layer, bottom, top


@pytest.mark.parametrize("text, shape", POOLS)
def test_max_pooling_twins_equal_the_layer_on_the_cpu(text, shape):
    rng = np.random.default_rng(2)
    host_x = rng.integers(-3, 4, size=shape).astype(np.float32)  # ties everywhere
    layer, bottom, top = pooling(text, shape, np, host_x)
    layer.forward([bottom], top)
    top_diff = rng.standard_normal(top[0].shape).astype(np.float32)
    top[0].diff[...] = top_diff
    layer.backward(top, [True], [bottom])

    geometry = (layer.kernel_now, layer.pad, layer.stride)
    out = cp.empty(top[0].shape, cp.float32)
    mask = cp.empty(top[0].shape, cp.float32)
    winner = cp.empty(top[0].shape, layer._winner.dtype)
    ck.max_pool_forward(cp.asarray(host_x), *geometry, layer.out_hw, out, winner, mask)
    np.testing.assert_array_equal(out.get(), top[0].data)
    np.testing.assert_array_equal(winner.get(), layer._winner)
    np.testing.assert_array_equal(mask.get(), top[1].data)
    grad = cp.empty(shape, cp.float32)
    ck.max_pool_backward(cp.asarray(top_diff), winner, *geometry, grad)
    np.testing.assert_array_equal(grad.get(), bottom.diff)


def test_max_pooling_without_a_mask():
    layer, bottom, top = pooling("pool: MAX kernel_size: 2 stride: 2", (1, 1, 4, 4), np,
                                 np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
    out = cp.empty((1, 1, 2, 2), cp.float32)
    winner = cp.empty((1, 1, 2, 2), layer._winner.dtype)
    ck.max_pool_forward(cp.asarray(bottom.data), (2, 2), (0, 0), (2, 2), (2, 2), out, winner)
    np.testing.assert_array_equal(out.get().ravel(), [5, 7, 13, 15])
    np.testing.assert_array_equal(winner.get().ravel(), [4, 4, 4, 4])  # 1 + offset 3
