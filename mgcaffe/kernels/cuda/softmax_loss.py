"""CUDA kernels of SoftmaxWithLoss: one launch forward, one backward, whatever the classes.

The layer's array code makes some twenty device calls per forward (the softmax, the label
checks, the pick, the log, the sums); here one thread per prediction (outer, inner) computes
its softmax over the classes, its loss, and whether its label is ignored or out of range,
into a (3, predictions) table of statistics whose row sums are the summed loss, the count of
bad labels and the count of valid ones (one reduction). Backward is one thread per element of
the score gradient: probability, minus 1 at the label, times the valid flag and the loss
scale (top diff / normaliser, a device scalar: no host read).

The same rules as the array code (layer_types/softmax.py): the maximum subtracted before
exp, probabilities clipped at FLT_MIN before the log, a label read as an integer truncating
towards zero, an out-of-range label counted (the layer raises its error when the loss is read
back) and meanwhile treated as class 0, an ignored label giving no loss and no gradient.
exp and log are the device's, so the results equal the array code within rounding, not bit
for bit. Nothing here imports CuPy (launch.py compiles and launches them).
"""

from __future__ import annotations

import numpy as np

from .launch import cupy_of, launch, register

__all__ = ["STAT_BAD", "STAT_LOSS", "STAT_VALID", "softmax_loss_backward",
           "softmax_loss_forward"]

#: Rows of the statistics table the forward kernel writes.
STAT_LOSS, STAT_BAD, STAT_VALID = 0, 1, 2

#: Caffe clips probabilities at FLT_MIN before the log.
_FLT_MIN = float(np.finfo(np.float32).tiny)

_LABEL = r"""
// The label of prediction `pos` as the array code reads it (truncated towards zero; NaN and
// values past the integer range are out of range), whether it counts (not ignored) and
// whether it is out of range; `used` is the class it selects (0 for a bad label).
#define MGCAFFE_LABEL(labels, pos)                                                         \
  const real raw = labels[pos];                                                            \
  const long long label = (raw > (real)-9.0e18 && raw < (real)9.0e18) ? (long long)raw     \
                                                                      : -1;                \
  const int valid = !(has_ignore && label == ignore_label);                                \
  const int bad = valid && (label < 0 || label >= channels);                               \
  const int used = (valid && !bad) ? (int)label : 0;
"""

_FORWARD_SOURCE = r"""
typedef REAL real;
""" + _LABEL + r"""
extern "C" __global__ void mgcaffe_softmax_loss_forward(
    const real* x, const real* labels, real* prob, real* stats, long long total,
    int channels, int inner, int has_ignore, long long ignore_label, real floor) {
  // One thread per prediction (outer o, inner i): its scores lie `inner` apart.
  for (long long index = blockIdx.x * (long long)blockDim.x + threadIdx.x; index < total;
       index += (long long)blockDim.x * gridDim.x) {
    const long long o = index / inner;
    const long long base = o * channels * inner + index % inner;
    real best = x[base];
    for (int c = 1; c < channels; ++c) {
      const real v = x[base + (long long)c * inner];
      if (v > best || v != v) best = v;  // NaN wins, as numpy's max propagates it
    }
    real sum = 0;
    for (int c = 0; c < channels; ++c) {
      const real e = exp(x[base + (long long)c * inner] - best);
      prob[base + (long long)c * inner] = e;
      sum += e;
    }
    for (int c = 0; c < channels; ++c) prob[base + (long long)c * inner] /= sum;
    MGCAFFE_LABEL(labels, index)
    const real p = prob[base + (long long)used * inner];
    stats[index] = valid ? -log(p > floor ? p : floor) : (real)0;
    stats[total + index] = (real)bad;
    stats[2 * total + index] = (real)valid;
  }
}
"""

_BACKWARD_SOURCE = r"""
typedef REAL real;
""" + _LABEL + r"""
extern "C" __global__ void mgcaffe_softmax_loss_backward(
    const real* prob, const real* labels, const real* scale, real* dx, long long total,
    int channels, int inner, int has_ignore, long long ignore_label) {
  // One thread per score: dx = (prob - [class == label]) * valid * scale, the array code's
  // order of operations.
  for (long long index = blockIdx.x * (long long)blockDim.x + threadIdx.x; index < total;
       index += (long long)blockDim.x * gridDim.x) {
    const int i = (int)(index % inner);
    const long long rest = index / inner;
    const int c = (int)(rest % channels);
    const long long pos = (rest / channels) * inner + i;
    MGCAFFE_LABEL(labels, pos)
    real v = prob[index];
    if (c == used) v -= (real)1;
    v *= (real)valid;
    dx[index] = v * scale[0];
  }
}
"""

register({"mgcaffe_softmax_loss_forward": _FORWARD_SOURCE,
          "mgcaffe_softmax_loss_backward": _BACKWARD_SOURCE})


def _check(what, arrays, dims):
    outer, channels, inner = dims
    for name, array, shape in arrays:
        if int(array.size) != int(np.prod(shape)) or not array.flags.c_contiguous:
            raise ValueError(f"{what}: {name} must be C-contiguous with {int(np.prod(shape))} "
                             f"elements {shape}, got shape {tuple(array.shape)}")


def _ignore(ignore_label):
    return (np.int32(ignore_label is not None),
            np.int64(0 if ignore_label is None else ignore_label))


def softmax_loss_forward(x, labels, prob, stats, dims, ignore_label=None):
    """Softmax of scores `x` over the classes into `prob` (both (outer, channels, inner)
    elements), and into `stats` (3, outer*inner) per prediction: the loss
    -log(max(p[label], FLT_MIN)) (0 where ignored), 1 where the label is out of range, 1
    where it counts (not `ignore_label`). All C-contiguous, of one float type."""
    xp = cupy_of(x, "softmax_loss_forward")
    outer, channels, inner = (int(d) for d in dims)
    total = outer * inner
    _check("softmax_loss_forward", [("x", x, dims), ("prob", prob, dims),
                                    ("labels", labels, (total,)),
                                    ("stats", stats, (3, total))], dims)
    launch(xp, "mgcaffe_softmax_loss_forward", x.dtype, total,
           (x, labels, prob, stats, np.int64(total), np.int32(channels), np.int32(inner),
            *_ignore(ignore_label), x.dtype.type(_FLT_MIN)))
    return stats


def softmax_loss_backward(prob, labels, scale, dx, dims, ignore_label=None):
    """dx = (prob - one-hot of the label) * valid * scale[0] over (outer, channels, inner);
    `scale` a one-element device array (the top diff over the normaliser)."""
    xp = cupy_of(prob, "softmax_loss_backward")
    outer, channels, inner = (int(d) for d in dims)
    _check("softmax_loss_backward", [("prob", prob, dims), ("dx", dx, dims),
                                     ("labels", labels, (outer * inner,)),
                                     ("scale", scale, (1,))], dims)
    total = outer * channels * inner
    launch(xp, "mgcaffe_softmax_loss_backward", prob.dtype, total,
           (prob, labels, scale, dx, np.int64(total), np.int32(channels), np.int32(inner),
            *_ignore(ignore_label)))
    return dx
