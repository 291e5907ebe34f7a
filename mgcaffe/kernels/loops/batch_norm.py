"""The BatchNorm layer's batch statistics, normalisation and input gradient as compiled row
loops (numba), for the CPU.

Why: numpy's forward over batch statistics makes six passes over input-sized arrays (the
mean, x - mean, its squares, their mean, the division, the copy kept for backward) and its
backward eight, each a call through memory. Here each row, a (sample, channel) plane, does
its share of a pass while it is in the cache:

- `row_moments`: the row's mean and the sum of its squared deviations from that mean, in
  float64 (the row swept twice from the cache). The layer combines a channel's rows with
  the pairwise update (Chan, Golub and LeVeque): the statistics take one trip through
  memory, and are as exact as a two-pass float64 variance.
- `normalize`: y = (x - mean) / std, in the blob's type and numpy's order of operations
  (the same bits as numpy's for the same mean and std), and the copy kept for backward in
  the same sweep. y may be x (in place).
- BatchNorm's own input gradient, dx = (dy + (y * sum(dy * y) + sum(dy)) * (-1 / m)) / std
  in the numpy path's order, is `scaled_input_grad` below with g = 1 and keep = y (d2 = dy
  exactly). The sums per row are those of kernels.scale_loops' backward, in float64.

For a BatchNorm, Scale and ReLU run in place on one blob (layer_types.norm_chain) the
three layers' passes are one sweep each way:

- `scaled_normalize`: keep = (x - mean) / std, y = keep * g (+ b), then max(y, 0) with
  `relu`: each operation as the separate layers' (numpy's) in the same order, so the same
  bits (zeros aside: this ReLU gives +0 for -0).
- `scaled_grad_sums`: with d1 = dy * (y > 0) (or dy) and d2 = d1 * g, the row sums of d1,
  d1 * keep, d2 and d2 * keep in float64: Scale's bias and scale gradients, and BatchNorm's.
- `scaled_input_grad`: dx = (d2 + (keep * sum(d2 * keep) + sum(d2)) * (-1/m)) / std, or
  d2 / std over global statistics.

Every function works on rows [r0, r1) with its operands given per row, so the layer's chunk
runner calls it from several threads on disjoint rows (`nogil`); each row is summed by one
thread, so the bits do not depend on the thread count. `load()` imports numba on first use
and returns the compiled functions, or None when numba cannot be imported (the layer keeps
its numpy path).
"""

from __future__ import annotations

import functools
import types

import numpy as np

from ...cpu import compiled


def _row_mean(x):
    """The mean of x in float64."""
    total = 0.0
    for i in range(x.shape[0]):
        total += np.float64(x[i])
    return total / x.shape[0]


def _row_squared_deviations(x, mean):
    """sum((x - mean)^2) in float64."""
    total = 0.0
    for i in range(x.shape[0]):
        d = np.float64(x[i]) - mean
        total += d * d
    return total


def _row_moments(x, means, deviations, r0, r1):
    """means[r], deviations[r] = mean(x[r]), sum((x[r] - mean)^2) for rows [r0, r1)."""
    for r in range(r0, r1):
        mean = _row_mean(x[r])
        means[r] = mean
        deviations[r] = _row_squared_deviations(x[r], mean)


def _normalize(x, y, keep, mean, std, keeping, r0, r1):
    """y[r] = (x[r] - mean[r]) / std[r] for rows [r0, r1); with `keeping`, keep[r] = y[r]."""
    inner = x.shape[1]
    row = np.empty(inner, dtype=y.dtype)
    in_place = _same(x, y)
    for r in range(r0, r1):
        # In place, made in another array (keep's row, else `row`) and then copied: a loop
        # whose output may overlap its input is not vectorised (3x as long).
        source, m, s = x[r], mean[r], std[r]
        made = y[r] if not in_place else keep[r] if keeping else row
        for i in range(inner):
            made[i] = (source[i] - m) / s
        if in_place:
            _copy(made, y[r])
        elif keeping:
            _copy(made, keep[r])


def _scaled_normalize(x, y, keep, mean, std, g, b, has_bias, relu, r0, r1):
    """keep[r] = (x[r] - mean[r]) / std[r], y[r] = keep[r] * g[r] (+ b[r]) (then
    max(., 0) with `relu`) for rows [r0, r1); y may be x, keep may not."""
    inner = x.shape[1]
    zero = y.dtype.type(0)
    for r in range(r0, r1):
        source, kept, m, s, gr = x[r], keep[r], mean[r], std[r], g[r]
        br = b[r] if has_bias else zero
        for i in range(inner):
            kept[i] = (source[i] - m) / s
        target = y[r]
        for i in range(inner):
            t = kept[i] * gr
            if has_bias:
                t = t + br
            if relu and not (t > zero or t != t):  # NaN passes, as numpy's maximum
                t = zero
            target[i] = t


def _scaled_grad_sums(dy, y, keep, g, relu, sums, r0, r1):
    """sums[r] = (sum d1, sum d1 * keep, sum d2, sum d2 * keep) of row r in float64, with
    d1 = dy * (y > 0) (`relu`) or dy, and d2 = d1 * g[r] in the blob's type."""
    inner = dy.shape[1]
    one, zero = dy.dtype.type(1), dy.dtype.type(0)
    for r in range(r0, r1):
        d, out, kept, gr = dy[r], y[r], keep[r], g[r]
        s1 = s2 = s3 = s4 = 0.0
        for i in range(inner):
            d1 = d[i] * (one if out[i] > zero else zero) if relu else d[i]
            d2 = d1 * gr
            k = np.float64(kept[i])
            s1 += np.float64(d1)
            s2 += np.float64(d1) * k
            s3 += np.float64(d2)
            s4 += np.float64(d2) * k
        sums[r, 0], sums[r, 1], sums[r, 2], sums[r, 3] = s1, s2, s3, s4


def _scaled_input_grad(dy, y, keep, dx, g, sum_d2, sum_d2_keep, std, scale, relu,
                       global_stats, r0, r1):
    """dx[r] = (d2 + (keep * sum_d2_keep + sum_d2) * scale) / std (or d2 / std with
    `global_stats`) for rows [r0, r1), d2 as in _scaled_grad_sums; dx may be dy."""
    inner = dy.shape[1]
    one, zero = dy.dtype.type(1), dy.dtype.type(0)
    row = np.empty(inner, dtype=dx.dtype)
    in_place = _same(dy, dx)
    for r in range(r0, r1):
        d, out, kept, gr = dy[r], y[r], keep[r], g[r]
        a, b, s = sum_d2_keep[r], sum_d2[r], std[r]
        made = row if in_place else dx[r]  # in place via `row`, as _normalize's y
        for i in range(inner):
            d1 = d[i] * (one if out[i] > zero else zero) if relu else d[i]
            d2 = d1 * gr
            made[i] = d2 / s if global_stats else (d2 + (kept[i] * a + b) * scale) / s
        if in_place:
            _copy(row, dx[r])


def _same(a, b):
    """Whether arrays a and b start at the same address (in place: y is x, dx is dy)."""
    return a.ctypes.data == b.ctypes.data


def _copy(source, target):
    """target = source, element by element."""
    for i in range(source.shape[0]):
        target[i] = source[i]


def _compile(numba) -> types.SimpleNamespace:
    # The sums may be reassociated into vector lanes (as kernels.scale_loops' sums: a chain
    # of dependent float64 additions runs at the adder's latency); the order is fixed by the
    # compiled code, not by the thread count.
    sums = functools.partial(compiled.jit, numba, fastmath={"reassoc"})
    global _row_mean, _row_squared_deviations, _same, _copy
    _row_mean, _row_squared_deviations = sums(_row_mean), sums(_row_squared_deviations)
    _same, _copy = compiled.jit(numba, _same), compiled.jit(numba, _copy)
    return types.SimpleNamespace(
        row_moments=compiled.jit(numba, _row_moments),
        normalize=compiled.jit(numba, _normalize),
        scaled_normalize=compiled.jit(numba, _scaled_normalize),
        scaled_grad_sums=sums(_scaled_grad_sums),
        scaled_input_grad=compiled.jit(numba, _scaled_input_grad))


load = compiled.loader(
    _compile, "The compiled loops (compiled on first call per dtype), or None without numba.")
