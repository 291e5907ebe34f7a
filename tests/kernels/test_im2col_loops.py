"""The compiled per-sample im2col / col2im (kernels.im2col_loops) against the element-by-element
reference, col2im also bit for bit against the numpy col2im's sums (same order), over kernel,
pad, stride and dilation."""

from __future__ import annotations

import numpy as np
import pytest
from im2col_reference import GEOMETRIES, naive_col2im, naive_im2col

from mgcaffe.kernels.im2col import col2im, conv_output_size
from mgcaffe.kernels.loops import im2col as im2col_loops

pytest.importorskip("numba")

CASES = GEOMETRIES + [
    ((3, 3), (5, 4), (1, 1), (1, 1)),  # pad wider than the kernel: rows of zeros only
    ((4, 4), (0, 0), (1, 1), (1, 1)),  # one output row
]


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
    np.testing.assert_array_equal(out, naive_im2col(x[None], kernel, pad, stride, dilation))


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
    np.testing.assert_allclose(out, naive_col2im(col.astype(np.float64), (1,) + shape, kernel,
                                                 pad, stride, dilation)[0], rtol=1e-5, atol=1e-5)
