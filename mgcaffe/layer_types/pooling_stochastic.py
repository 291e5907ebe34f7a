"""STOCHASTIC pooling (Zeiler & Fergus; Caffe's StoPool kernels), called by the Pooling layer.

Windows start at (ph * stride_h, pw * stride_w) and are clipped to the input: Caffe's
stochastic pooling ignores `pad` in the windows (it still enters the output size). Inputs are
meant to be non-negative (after a ReLU).

TRAIN: per window, with u uniform in [0, 1), the first cell in row-major order whose running
sum reaches u * (window sum) is picked; the top is its value and the gradient goes to it alone.
TEST: the top is the probability-weighted average sum(x^2) / sum(x) (0 when the sum is not
positive); its backward (which Caffe leaves undefined, reusing the last TRAIN pick) is the
exact gradient of that expression here.
"""

from __future__ import annotations

from ..proto import caffe_pb2
from .embed import scatter_add


def _window_cells(layer, x):
    """(values, valid, flat index) per kernel offset, each (K, N, C, Ph, Pw), row-major."""
    xp = layer.xp
    _, _, h, w = x.shape
    (kh, kw), (sh, sw) = layer.kernel_now, layer.stride
    ph, pw = layer.out_hw
    values, valid, index = [], [], []
    for i in range(kh):
        rows = xp.arange(ph) * sh + i
        for j in range(kw):
            cols = xp.arange(pw) * sw + j
            ok = (rows[:, None] < h) & (cols[None, :] < w)
            r, c = xp.minimum(rows, h - 1), xp.minimum(cols, w - 1)
            v = x[:, :, r[:, None], c[None, :]]
            values.append(v * ok)
            valid.append(xp.broadcast_to(ok, v.shape))
            index.append(xp.broadcast_to(r[:, None] * w + c[None, :], v.shape))
    return xp.stack(values), xp.stack(valid), xp.stack(index)


def forward(layer, bottom, top):
    """Sample (TRAIN) or weight (TEST) each window into top[0]."""
    xp = layer.xp
    values, valid, index = _window_cells(layer, bottom[0].data)
    total = values.sum(axis=0)
    if layer.phase == caffe_pb2.TEST:
        squares = (values * values).sum(axis=0)
        positive = total > 0
        top[0].data[...] = xp.where(positive, squares / xp.where(positive, total, 1), 0)
        layer._stochastic_test = (values, valid, index, total, squares)
        return
    threshold = layer.rng.random(total.shape).astype(layer.dtype) * total
    hit = (xp.cumsum(values, axis=0) >= threshold) & valid
    first = xp.argmax(hit, axis=0)[None]
    picked = xp.take_along_axis(values, first, axis=0)[0]
    found = hit.any(axis=0)
    top[0].data[...] = picked * found
    # The flat plane index of each pick, -1 for a window with none (no gradient).
    layer._stochastic_pick = xp.where(found, xp.take_along_axis(index, first, axis=0)[0], -1)


def backward(layer, top, propagate_down, bottom):
    """bottom diff: each top diff at its picked cell (TRAIN), or the weighted average's
    gradient (TEST)."""
    xp = layer.xp
    n, c, h, w = bottom[0].shape
    diff = bottom[0].diff
    diff[...] = 0
    top_diff = top[0].diff
    if layer.phase == caffe_pb2.TEST:
        values, valid, index, total, squares = layer._stochastic_test
        positive = total > 0
        safe = xp.where(positive, total, 1)
        # d(Q/S)/dx_k = (2 x_k S - Q) / S^2, for the cells of positive-sum windows.
        grad = (2 * values * safe - squares) / (safe * safe) * (positive * top_diff) * valid
        planes = xp.broadcast_to(xp.arange(n * c).reshape(1, n, c, 1, 1), index.shape)
        scatter_add(xp, diff.reshape(n * c, h * w), (planes.reshape(-1), index.reshape(-1)),
                    grad.reshape(-1))
        return
    pick = layer._stochastic_pick.reshape(n * c, -1)
    rows = xp.broadcast_to(xp.arange(n * c)[:, None], pick.shape)
    keep = pick >= 0
    scatter_add(xp, diff.reshape(n * c, h * w), (rows[keep], pick[keep]),
                top_diff.reshape(n * c, -1)[keep])
