"""CUDA kernels of LRN across channels: one launch forward, one backward.

The layer's array code makes about a dozen device calls per pass (square, a window sum of
2 * half + 1 shifted adds, scale, shift, power, multiply; the backward likewise). Here one
thread per element (n, c, cell) sums its channel window itself, in the array code's order:
the centre, then for each distance d = 1..half the channel above and then the one below
((acc + up) + down), so the sums and scales equal the array code's bit for bit; pow is the
device's, so scale^-beta and what follows equal it within rounding. The backward recomputes
the window of dtop * top / scale the same way (each thread reads its neighbours' terms: no
running sum, whose subtraction cancels badly in float32). Neither kernel may run in place
(a thread reads channels that others write): the layer keeps its array code then.
Nothing here imports CuPy (launch.py compiles and launches them).
"""

from __future__ import annotations

import numpy as np

from .launch import cupy_of, launch, register

__all__ = ["lrn_across_backward", "lrn_across_forward"]

_WINDOW = r"""
// acc = the sum of TERM(j) over the channels j of c's window, in the array code's order.
#define MGCAFFE_WINDOW(acc, TERM)                                                          \
  real acc = TERM(c);                                                                      \
  for (int d = 1; d <= half; ++d) {                                                        \
    if (c + d < channels) acc += TERM(c + d);                                              \
    if (c - d >= 0) acc += TERM(c - d);                                                    \
  }
"""

_FORWARD_SOURCE = r"""
typedef REAL real;
""" + _WINDOW + r"""
extern "C" __global__ void mgcaffe_lrn_across_forward(
    const real* x, real* top, real* scale, real* scale_pow, long long total, int channels,
    int inner, int half, real a, real k, real neg_beta) {
  for (long long index = blockIdx.x * (long long)blockDim.x + threadIdx.x; index < total;
       index += (long long)blockDim.x * gridDim.x) {
    const int c = (int)((index / inner) % channels);
    const long long base = index - (long long)c * inner;  // channel 0 of this (n, cell)
#define MGCAFFE_SQUARE(j) (x[base + (long long)(j) * inner] * x[base + (long long)(j) * inner])
    MGCAFFE_WINDOW(acc, MGCAFFE_SQUARE)
#undef MGCAFFE_SQUARE
    const real s = acc * a + k;
    const real p = pow(s, neg_beta);
    scale[index] = s;
    scale_pow[index] = p;
    top[index] = x[index] * p;
  }
}
"""

_BACKWARD_SOURCE = r"""
typedef REAL real;
""" + _WINDOW + r"""
extern "C" __global__ void mgcaffe_lrn_across_backward(
    const real* x, const real* top, const real* top_diff, const real* scale,
    const real* scale_pow, real* diff, long long total, int channels, int inner, int half,
    real coef) {
  for (long long index = blockIdx.x * (long long)blockDim.x + threadIdx.x; index < total;
       index += (long long)blockDim.x * gridDim.x) {
    const int c = (int)((index / inner) % channels);
    const long long base = index - (long long)c * inner;
#define MGCAFFE_RATIO(j) (top_diff[base + (long long)(j) * inner] *                          \
                          top[base + (long long)(j) * inner] /                               \
                          scale[base + (long long)(j) * inner])
    MGCAFFE_WINDOW(acc, MGCAFFE_RATIO)
#undef MGCAFFE_RATIO
    diff[index] = acc * x[index] * coef + top_diff[index] * scale_pow[index];
  }
}
"""

register({"mgcaffe_lrn_across_forward": _FORWARD_SOURCE,
          "mgcaffe_lrn_across_backward": _BACKWARD_SOURCE})


def _dims(what, first, arrays):
    if first.ndim != 4:
        raise ValueError(f"{what}: arrays must be (N, C, H, W), got shape {first.shape}")
    for name, array in [("x", first), *arrays]:
        if array.shape != first.shape or not array.flags.c_contiguous:
            raise ValueError(f"{what}: {name} must be C-contiguous of shape {first.shape}, "
                             f"got {array.shape}")
    n, channels, h, w = (int(d) for d in first.shape)
    return n * channels * h * w, channels, h * w


def lrn_across_forward(x, top, scale, scale_pow, half: int, a, k, beta: float):
    """scale = k + a * (sum of x^2 over the 2 * half + 1 channels around each), scale_pow =
    scale^-beta, top = x * scale_pow; (N, C, H, W) C-contiguous arrays of one float type,
    `top` not `x`."""
    xp = cupy_of(x, "lrn_across_forward")
    total, channels, inner = _dims("lrn_across_forward", x, [
        ("top", top), ("scale", scale), ("scale_pow", scale_pow)])
    t = x.dtype.type
    launch(xp, "mgcaffe_lrn_across_forward", x.dtype, total,
           (x, top, scale, scale_pow, np.int64(total), np.int32(channels), np.int32(inner),
            np.int32(half), t(a), t(k), t(-beta)))
    return top


def lrn_across_backward(x, top, top_diff, scale, scale_pow, diff, half: int, coef):
    """diff = (window sum of top_diff * top / scale) * x * coef + top_diff * scale_pow, coef
    = -2 alpha beta / local_size; arrays as `lrn_across_forward`'s, `diff` none of the
    others."""
    xp = cupy_of(x, "lrn_across_backward")
    total, channels, inner = _dims("lrn_across_backward", x, [
        ("top", top), ("top_diff", top_diff), ("scale", scale), ("scale_pow", scale_pow),
        ("diff", diff)])
    launch(xp, "mgcaffe_lrn_across_backward", x.dtype, total,
           (x, top, top_diff, scale, scale_pow, diff, np.int64(total), np.int32(channels),
            np.int32(inner), np.int32(half), x.dtype.type(coef)))
    return diff
