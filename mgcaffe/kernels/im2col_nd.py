"""im2col / col2im for any number of spatial axes (Caffe's im2col_nd), generic `xp` code.

For x of shape (N, C, *S) and a kernel of shape K (len(K) = len(S)), the columns have shape
(N, C, *K, *O), O the output size per axis: columns[n, c, *k, *o] = x[n, c, *(o*stride - pad
+ k*dilation)], 0 where that index falls in the padding. Flattened per sample to
(C*prod(K), prod(O)) this is Caffe's column buffer (rows ordered c, k...), so a weight of shape
(num_output, C, *K) reshapes to the GEMM operand. One strided slice of the zero-padded input is
copied (or, in col2im, added back) per kernel offset. The 2-D convolution layers use the
specialised kernels in im2col.py; these serve 1-D, 3-D and higher.
"""

from __future__ import annotations

import itertools

from ..backend import get_array_module
from .im2col import conv_output_size


def output_shape(spatial, kernel, pad, stride, dilation) -> tuple[int, ...]:
    """Convolution output size per spatial axis."""
    return tuple(conv_output_size(*a) for a in zip(spatial, kernel, pad, stride, dilation))


def _offsets(kernel, out, stride, dilation, pad):
    """Per kernel offset: its index and the slices of the padded input it reads."""
    for offs in itertools.product(*(range(k) for k in kernel)):
        yield offs, tuple(slice(o * d, o * d + s * (n - 1) + 1, s)
                          for o, d, s, n in zip(offs, dilation, stride, out))


def im2col_nd(x, kernel, pad, stride, dilation):
    """The (N, C, *kernel, *out) columns of x (N, C, *spatial)."""
    xp = get_array_module(x)
    n, c, *spatial = x.shape
    out = output_shape(spatial, kernel, pad, stride, dilation)
    padded = xp.zeros((n, c) + tuple(s + 2 * p for s, p in zip(spatial, pad)), dtype=x.dtype)
    padded[(slice(None), slice(None)) + tuple(slice(p, p + s) for p, s in zip(pad, spatial))] = x
    cols = xp.empty((n, c) + tuple(kernel) + out, dtype=x.dtype)
    for offs, window in _offsets(kernel, out, stride, dilation, pad):
        cols[(slice(None), slice(None)) + offs] = padded[(slice(None), slice(None)) + window]
    return cols


def col2im_nd(cols, spatial, kernel, pad, stride, dilation):
    """The (N, C, *spatial) image whose im2col_nd is `cols` under summation: each column
    entry is added back at the input position it was read from (padding dropped)."""
    xp = get_array_module(cols)
    n, c = cols.shape[:2]
    out = cols.shape[2 + len(kernel):]
    padded = xp.zeros((n, c) + tuple(s + 2 * p for s, p in zip(spatial, pad)), dtype=cols.dtype)
    for offs, window in _offsets(kernel, out, stride, dilation, pad):
        padded[(slice(None), slice(None)) + window] += cols[(slice(None), slice(None)) + offs]
    return padded[(slice(None), slice(None)) + tuple(slice(p, p + s)
                                                     for p, s in zip(pad, spatial))]
