"""The compiled per-sample im2col / col2im (kernels.im2col_loops): the naive loops' columns,
and bit for bit the numpy col2im's sums (same order), over kernel, pad, stride, dilation."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from mgcaffe.kernels import col2im, conv_output_size, im2col_loops

pytest.importorskip("numba")

CASES = [
    # kernel, pad, stride, dilation
    ((1, 1), (0, 0), (1, 1), (1, 1)),
    ((3, 3), (1, 1), (1, 1), (1, 1)),
    ((3, 2), (0, 1), (2, 1), (1, 1)),
    ((2, 3), (2, 1), (1, 3), (1, 2)),
    ((3, 3), (2, 2), (2, 2), (2, 2)),
    ((5, 4), (1, 3), (3, 2), (1, 1)),
    ((3, 3), (5, 4), (1, 1), (1, 1)),  # pad wider than the kernel: rows of zeros only
    ((4, 4), (0, 0), (1, 1), (1, 1)),  # one output row
]


def naive_im2col(x, kernel, pad, stride, dilation):
    """(C*kh*kw, H_out*W_out) columns of one (C, H, W) sample, element by element."""
    c, h, w = x.shape
    oh = conv_output_size(h, kernel[0], pad[0], stride[0], dilation[0])
    ow = conv_output_size(w, kernel[1], pad[1], stride[1], dilation[1])
    col = np.zeros((c, kernel[0], kernel[1], oh, ow), dtype=x.dtype)
    for ci, i, j, y, z in itertools.product(range(c), range(kernel[0]), range(kernel[1]),
                                            range(oh), range(ow)):
        hi = y * stride[0] - pad[0] + i * dilation[0]
        wi = z * stride[1] - pad[1] + j * dilation[1]
        if 0 <= hi < h and 0 <= wi < w:
            col[ci, i, j, y, z] = x[ci, hi, wi]
    return col.reshape(c * kernel[0] * kernel[1], oh * ow)


def _args(shape, kernel, pad, stride, dilation):
    out_hw = tuple(conv_output_size(s, k, p, st, d) for s, k, p, st, d in
                   zip(shape[1:], kernel, pad, stride, dilation))
    return (*kernel, *pad, *stride, *dilation, *out_hw), out_hw


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kernel,pad,stride,dilation", CASES)
def test_im2col_sample_writes_every_column_as_the_naive_loops(kernel, pad, stride, dilation,
                                                               dtype):
    x = np.random.default_rng(0).standard_normal((3, 7, 6)).astype(dtype)
    args, out_hw = _args(x.shape, kernel, pad, stride, dilation)
    out = np.full((3 * kernel[0] * kernel[1], out_hw[0] * out_hw[1]), np.nan, dtype)
    im2col_loops.load().im2col_sample(x, out, *args)
    np.testing.assert_array_equal(out, naive_im2col(x, kernel, pad, stride, dilation))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kernel,pad,stride,dilation", CASES)
def test_col2im_sample_overwrites_with_the_numpy_sums_bit_for_bit(kernel, pad, stride,
                                                                   dilation, dtype):
    shape = (3, 7, 6)
    args, out_hw = _args(shape, kernel, pad, stride, dilation)
    rng = np.random.default_rng(1)
    col = rng.standard_normal((3 * kernel[0] * kernel[1], out_hw[0] * out_hw[1])).astype(dtype)
    out = np.full(shape, np.nan, dtype)
    im2col_loops.load().col2im_sample(col, out, *args)
    expected = col2im(col, (1,) + shape, kernel, pad, stride, dilation)[0]
    np.testing.assert_array_equal(out, expected)
    # The adjoint of im2col: <im2col(x), col> == <x, col2im(col)>.
    x = rng.standard_normal(shape)
    cols = naive_im2col(x, kernel, pad, stride, dilation)
    assert np.isclose((cols * col).sum(), (x * out).sum(), rtol=1e-5)
