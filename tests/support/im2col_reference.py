"""Element-by-element im2col / col2im, and the geometries the kernel tests run them on."""

from __future__ import annotations

import itertools

import numpy as np

from mgcaffe.kernels.im2col import conv_output_size

GEOMETRIES = [
    # kernel, pad, stride, dilation
    ((1, 1), (0, 0), (1, 1), (1, 1)),
    ((3, 3), (1, 1), (1, 1), (1, 1)),
    ((3, 2), (0, 1), (2, 1), (1, 1)),
    ((2, 3), (2, 1), (1, 3), (1, 2)),
    ((3, 3), (2, 2), (2, 2), (2, 2)),
    ((5, 4), (1, 3), (3, 2), (1, 1)),
]


def _out_hw(h, w, kernel, pad, stride, dilation):
    return (conv_output_size(h, kernel[0], pad[0], stride[0], dilation[0]),
            conv_output_size(w, kernel[1], pad[1], stride[1], dilation[1]))


def _cells(c, kernel, n, oh, ow):
    return itertools.product(range(c), range(kernel[0]), range(kernel[1]), range(n),
                             range(oh), range(ow))


def naive_im2col(x, kernel, pad, stride, dilation):
    """Columns (C*kh*kw, N*H_out*W_out) of x (N, C, H, W), one element at a time."""
    n, c, h, w = x.shape
    oh, ow = _out_hw(h, w, kernel, pad, stride, dilation)
    col = np.zeros((c, kernel[0], kernel[1], n, oh, ow), dtype=x.dtype)
    for ci, i, j, ni, y, z in _cells(c, kernel, n, oh, ow):
        hi = y * stride[0] - pad[0] + i * dilation[0]
        wi = z * stride[1] - pad[1] + j * dilation[1]
        if 0 <= hi < h and 0 <= wi < w:
            col[ci, i, j, ni, y, z] = x[ni, ci, hi, wi]
    return col.reshape(c * kernel[0] * kernel[1], n * oh * ow)


def naive_col2im(col, shape, kernel, pad, stride, dilation):
    """im2col's adjoint onto an image of `shape` (N, C, H, W), one element at a time."""
    n, c, h, w = shape
    oh, ow = _out_hw(h, w, kernel, pad, stride, dilation)
    col6 = col.reshape(c, kernel[0], kernel[1], n, oh, ow)
    x = np.zeros(shape, dtype=col.dtype)
    for ci, i, j, ni, y, z in _cells(c, kernel, n, oh, ow):
        hi = y * stride[0] - pad[0] + i * dilation[0]
        wi = z * stride[1] - pad[1] + j * dilation[1]
        if 0 <= hi < h and 0 <= wi < w:
            x[ni, ci, hi, wi] += col6[ci, i, j, ni, y, z]
    return x
