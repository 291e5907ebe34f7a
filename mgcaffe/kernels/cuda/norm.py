"""CUDA kernels of BatchNorm and Scale: at most two launches each way (Scale forward: one).

The layers' array code makes 10-16 device calls per pass (means, squares, the running sums'
updates, square roots, divisions, copies); ResNet-50 has 53 of each layer. Here:

- per-channel sums (BatchNorm's mean and variance, its backward's sums of dy and dy * y,
  Scale's bias and scale gradients) run one block per channel: the block's threads stride
  over the channel's values, accumulating in double, and combine their partial sums in shared
  memory; the block's thread 0 writes the channel's results (and BatchNorm's running sums and
  scale factor, so the update needs no launch of its own);
- the element-wise passes (normalise, the input gradient, scale and shift) run one thread per
  element and read their channel's values.

The values are those of the array code up to rounding (double sums instead of numpy's
pairwise float sums; variance from deviations about the double mean). Each element-wise
kernel reads an element before writing the same element only, so they run in place.
Nothing here imports CuPy (launch.py compiles and launches them).
"""

from __future__ import annotations

import numpy as np

from .launch import cupy_of, launch, launch_blocks, register

__all__ = ["CHANNEL_THREADS", "bn_backward", "bn_forward", "bn_global_stats",
           "scale_backward", "scale_forward"]

#: Threads of a per-channel block (a power of two: the shared-memory tree halves it).
CHANNEL_THREADS = 256

_BLOCK_SUM = f"""
typedef REAL real;
#define MGCAFFE_BLOCK {CHANNEL_THREADS}
""" + r"""
// The element k of value i of channel c in an (outer, dim, inner) array, i < outer * inner.
#define MGCAFFE_AT(i, c, dim, inner) \
  (((i) / (inner)) * (long long)(dim) * (inner) + (long long)(c) * (inner) + (i) % (inner))
// part[0] = the sum of part[0 .. blockDim.x) (every thread of the block calls it)
__device__ void mgcaffe_block_sum(double* part) {
  __syncthreads();
  for (int h = blockDim.x / 2; h > 0; h >>= 1) {
    if (threadIdx.x < h) part[threadIdx.x] += part[threadIdx.x + h];
    __syncthreads();
  }
}
"""

_BN_STATS_SOURCE = _BLOCK_SUM + r"""
extern "C" __global__ void mgcaffe_bn_stats(
    const real* x, real* mean, real* std, real* mean_sum, real* var_sum, real* factor,
    int outer, int channels, int inner, real eps, real maf, real correction) {
  __shared__ double part[MGCAFFE_BLOCK];
  const long long m = (long long)outer * inner;
  for (int c = blockIdx.x; c < channels; c += gridDim.x) {
    double s = 0;
    for (long long i = threadIdx.x; i < m; i += blockDim.x)
      s += x[MGCAFFE_AT(i, c, channels, inner)];
    part[threadIdx.x] = s;
    mgcaffe_block_sum(part);
    const double mu = part[0] / m;
    __syncthreads();
    double q = 0;
    for (long long i = threadIdx.x; i < m; i += blockDim.x) {
      const double d = x[MGCAFFE_AT(i, c, channels, inner)] - mu;
      q += d * d;
    }
    part[threadIdx.x] = q;
    mgcaffe_block_sum(part);
    if (threadIdx.x == 0) {
      const real mean_c = (real)mu, var_c = (real)(part[0] / m);
      mean[c] = mean_c;
      std[c] = sqrt(var_c + eps);
      mean_sum[c] = mean_sum[c] * maf + mean_c;
      var_sum[c] = var_sum[c] * maf + var_c * correction;
      if (c == 0) factor[0] = factor[0] * maf + (real)1;
    }
    __syncthreads();
  }
}
"""

_BN_GLOBAL_SOURCE = r"""
typedef REAL real;
extern "C" __global__ void mgcaffe_bn_global(
    const real* mean_sum, const real* var_sum, const real* factor, real* mean, real* std,
    int channels, real eps) {
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < channels;
       c += blockDim.x * gridDim.x) {
    const real f = factor[0];
    const real inverse = f == (real)0 ? (real)0 : (real)1 / f;  // Caffe: 0 for factor 0
    mean[c] = mean_sum[c] * inverse;
    std[c] = sqrt(var_sum[c] * inverse + eps);
  }
}
"""

_BN_NORMALIZE_SOURCE = r"""
typedef REAL real;
extern "C" __global__ void mgcaffe_bn_normalize(
    const real* x, real* y, real* keep, const real* mean, const real* std, long long total,
    int channels, int inner, int keeping) {
  for (long long index = blockIdx.x * (long long)blockDim.x + threadIdx.x; index < total;
       index += (long long)blockDim.x * gridDim.x) {
    const int c = (int)((index / inner) % channels);
    const real v = (x[index] - mean[c]) / std[c];
    y[index] = v;
    if (keeping) keep[index] = v;
  }
}
"""

_BN_BACKWARD_SOURCE = r"""
typedef REAL real;
extern "C" __global__ void mgcaffe_bn_backward(
    const real* dy, const real* y, const real* sum_dy, const real* sum_dy_y, const real* std,
    real* dx, long long total, int channels, int inner, real coef) {
  for (long long index = blockIdx.x * (long long)blockDim.x + threadIdx.x; index < total;
       index += (long long)blockDim.x * gridDim.x) {
    const int c = (int)((index / inner) % channels);
    const real work = (y[index] * sum_dy_y[c] + sum_dy[c]) * coef + dy[index];
    dx[index] = work / std[c];
  }
}
"""

_SCALE_FORWARD_SOURCE = r"""
typedef REAL real;
extern "C" __global__ void mgcaffe_scale_forward(
    const real* x, real* y, real* copy, const real* s, const real* b, long long total, int dim,
    int inner, int copying, int biased) {
  for (long long index = blockIdx.x * (long long)blockDim.x + threadIdx.x; index < total;
       index += (long long)blockDim.x * gridDim.x) {
    const int c = (int)((index / inner) % dim);
    const real v = x[index];
    if (copying) copy[index] = v;
    real r = v * s[c];
    if (biased) r += b[c];
    y[index] = r;
  }
}
"""

_CHANNEL_SUMS_SOURCE = _BLOCK_SUM + r"""
// Per channel c: sum_dy[c] (+)= the sum of dy; sum_dy_x[c] (+)= the sum of dy * x (accumulate:
// add to it, else overwrite it); want 0 skips that sum. Scale's bias and scale gradients,
// BatchNorm's backward sums of dy and dy * y.
extern "C" __global__ void mgcaffe_channel_sums(
    const real* dy, const real* x, real* sum_dy, real* sum_dy_x, int outer, int dim,
    int inner, int want_dy, int want_dy_x, int accumulate_dy, int accumulate_dy_x) {
  __shared__ double part[MGCAFFE_BLOCK];
  __shared__ double part_x[MGCAFFE_BLOCK];
  const long long m = (long long)outer * inner;
  for (int c = blockIdx.x; c < dim; c += gridDim.x) {
    double s = 0, sx = 0;
    for (long long i = threadIdx.x; i < m; i += blockDim.x) {
      const long long k = MGCAFFE_AT(i, c, dim, inner);
      if (want_dy) s += dy[k];
      if (want_dy_x) sx += (double)dy[k] * x[k];
    }
    part[threadIdx.x] = s;
    part_x[threadIdx.x] = sx;
    mgcaffe_block_sum(part);
    mgcaffe_block_sum(part_x);
    if (threadIdx.x == 0) {
      if (want_dy) sum_dy[c] = accumulate_dy ? sum_dy[c] + (real)part[0] : (real)part[0];
      if (want_dy_x)
        sum_dy_x[c] = accumulate_dy_x ? sum_dy_x[c] + (real)part_x[0] : (real)part_x[0];
    }
    __syncthreads();
  }
}
"""

_SCALE_INPUT_GRAD_SOURCE = r"""
typedef REAL real;
extern "C" __global__ void mgcaffe_scale_input_grad(
    const real* dy, const real* s, real* dx, long long total, int dim, int inner) {
  for (long long index = blockIdx.x * (long long)blockDim.x + threadIdx.x; index < total;
       index += (long long)blockDim.x * gridDim.x) {
    dx[index] = dy[index] * s[(int)((index / inner) % dim)];
  }
}
"""

# one block of CHANNEL_THREADS per channel (MGCAFFE_BLOCK, the shared arrays' size, is the same)
register({"mgcaffe_bn_stats": _BN_STATS_SOURCE, "mgcaffe_channel_sums": _CHANNEL_SUMS_SOURCE},
         threads=CHANNEL_THREADS)
register({"mgcaffe_bn_global": _BN_GLOBAL_SOURCE,
          "mgcaffe_bn_normalize": _BN_NORMALIZE_SOURCE,
          "mgcaffe_bn_backward": _BN_BACKWARD_SOURCE,
          "mgcaffe_scale_forward": _SCALE_FORWARD_SOURCE,
          "mgcaffe_scale_input_grad": _SCALE_INPUT_GRAD_SOURCE})


def _dims(what, dims, *arrays):
    outer, dim, inner = (int(d) for d in dims)
    total = outer * dim * inner
    for name, array in arrays:
        if array is not None and (array.size != total or not array.flags.c_contiguous):
            raise ValueError(f"{what}: {name} must be C-contiguous with {total} elements "
                             f"({outer} x {dim} x {inner}), got shape {array.shape}")
    return outer, dim, inner, total


def bn_forward(x, y, keep, mean, std, dims, eps, running=None):
    """BatchNorm forward on (outer, channels, inner) arrays `x` -> `y` (may be `x`), the
    normalised values also into `keep` (None: not kept). With `running` = (mean_sum, var_sum,
    factor, moving_average_fraction, correction): the batch statistics into `mean` and `std`
    (sqrt(var + eps)) and the running sums updated; without it `mean` and `std` are read
    (`bn_global_stats`). Two launches with the statistics, one without."""
    xp = cupy_of(x, "bn_forward")
    outer, channels, inner, total = _dims("bn_forward", dims, ("x", x), ("y", y),
                                          ("keep", keep))
    t = x.dtype.type
    if running is not None:
        mean_sum, var_sum, factor, maf, correction = running
        launch_blocks(xp, "mgcaffe_bn_stats", x.dtype, channels,
                      (x, mean, std, mean_sum, var_sum, factor, np.int32(outer),
                       np.int32(channels), np.int32(inner), t(eps), t(maf), t(correction)))
    launch(xp, "mgcaffe_bn_normalize", x.dtype, total,
           (x, y, y if keep is None else keep, mean, std, np.int64(total),
            np.int32(channels), np.int32(inner), np.int32(keep is not None)))
    return y


def bn_global_stats(mean_sum, var_sum, factor, mean, std, eps):
    """mean = mean_sum / factor, std = sqrt(var_sum / factor + eps) per channel (both 0 /
    sqrt(eps) where the factor is 0, as Caffe): one launch."""
    xp = cupy_of(mean_sum, "bn_global_stats")
    channels = int(mean_sum.size)
    launch(xp, "mgcaffe_bn_global", mean_sum.dtype, channels,
           (mean_sum, var_sum, factor, mean, std, np.int32(channels),
            mean_sum.dtype.type(eps)))


def bn_backward(dy, y, std, dx, dims, sums):
    """BatchNorm's input gradient with batch statistics: dx = (dy - mean(dy) - mean(dy * y)
    * y) / std per channel (means over outer and inner); `sums` two (channels,) work arrays;
    `dx` may be `dy`. Two launches."""
    xp = cupy_of(dy, "bn_backward")
    outer, channels, inner, total = _dims("bn_backward", dims, ("dy", dy), ("y", y),
                                          ("dx", dx))
    sum_dy, sum_dy_y = sums
    launch_blocks(xp, "mgcaffe_channel_sums", dy.dtype, channels,
                  (dy, y, sum_dy, sum_dy_y, np.int32(outer), np.int32(channels),
                   np.int32(inner), np.int32(1), np.int32(1), np.int32(0), np.int32(0)))
    launch(xp, "mgcaffe_bn_backward", dy.dtype, total,
           (dy, y, sum_dy, sum_dy_y, std, dx, np.int64(total), np.int32(channels),
            np.int32(inner), dy.dtype.type(-1.0 / (outer * inner))))
    return dx


def scale_forward(x, y, s, b, dims, copy=None):
    """y = x * s (+ b) over (outer, dim, inner) arrays, s and b of `dim` values (b None: no
    bias); x first copied into `copy` (None: not). `y` may be `x`. One launch."""
    xp = cupy_of(x, "scale_forward")
    _, dim, inner, total = _dims("scale_forward", dims, ("x", x), ("y", y), ("copy", copy))
    launch(xp, "mgcaffe_scale_forward", x.dtype, total,
           (x, y, y if copy is None else copy, s, s if b is None else b, np.int64(total),
            np.int32(dim), np.int32(inner), np.int32(copy is not None),
            np.int32(b is not None)))
    return y


def scale_backward(dy, x, s, dims, *, bias_diff=None, scale_diff=None, accumulate=(True, True),
                   dx=None):
    """Scale's gradients: bias_diff (+)= the sum of dy per channel, scale_diff (+)= the sum of
    dy * x (None: that one not wanted; `accumulate` per diff: add to it, else overwrite it),
    then dx = dy * s (None: not wanted; may be `dy`: the sums read dy first). One launch for
    the sums, one for dx."""
    xp = cupy_of(dy, "scale_backward")
    outer, dim, inner, total = _dims("scale_backward", dims, ("dy", dy), ("x", x), ("dx", dx))
    if bias_diff is not None or scale_diff is not None:
        launch_blocks(xp, "mgcaffe_channel_sums", dy.dtype, dim,
                      (dy, dy if x is None else x,
                       bias_diff if bias_diff is not None else scale_diff,
                       scale_diff if scale_diff is not None else bias_diff,
                       np.int32(outer), np.int32(dim), np.int32(inner),
                       np.int32(bias_diff is not None), np.int32(scale_diff is not None),
                       np.int32(bool(accumulate[0])), np.int32(bool(accumulate[1]))))
    if dx is not None:
        launch(xp, "mgcaffe_scale_input_grad", dy.dtype, total,
               (dy, s, dx, np.int64(total), np.int32(dim), np.int32(inner)))
    return dx
