"""The Scale layer's per-row work as compiled loops (numba), for the CPU.

Why: Scale runs on every BatchNorm output of ResNet-style nets, in place, so its forward
copies x (the scale gradient needs it), multiplies and adds the bias, and its backward sums
dy and dy * x per channel and writes dy * s: several passes over arrays of up to 13 MB. In
numpy each pass is a call per block of rows, and on 14x14 and 7x7 planes the calls cost
more than the arithmetic. One loop per row does all of a row's passes while it is in the
cache, with no call per pass.

The arrays are (rows, inner): row r = (outer index, channel), with the operands given per
row. The forward computes x * s (+ b) exactly as numpy's multiply then add (two roundings,
no fused multiply-add), so its bits equal the numpy path's. The backward sums in float64
(in an order the compiled code fixes): more exact than the float32 sums of the numpy path,
and the same bits on any thread count, since each row is summed by one thread.

Every function works on rows [r0, r1), so the layer's chunk runner calls it from several
threads on disjoint rows (`nogil`). `load()` imports numba on first use and returns the
compiled functions, or None when numba cannot be imported (the layer keeps its numpy path).
"""

from __future__ import annotations

import functools
import types

import numpy as np

from ...cpu import compiled


def _forward(x, y, copy, s, b, keep, bias, r0, r1):
    """y[r] = x[r] * s[r] (+ b[r]) for rows [r0, r1); with `keep`, x[r] is first copied into
    copy[r] (in place, y is x) and read from there."""
    inner = x.shape[1]
    for r in range(r0, r1):
        source = x[r]
        if keep:
            kept = copy[r]
            for i in range(inner):
                kept[i] = source[i]
            source = kept
        target = y[r]
        sr = s[r]
        if bias:
            br = b[r]
            for i in range(inner):
                target[i] = source[i] * sr + br
        else:
            for i in range(inner):
                target[i] = source[i] * sr


def _row_sum(g):
    """sum(g) in float64."""
    total = 0.0
    for i in range(g.shape[0]):
        total += np.float64(g[i])
    return total


def _row_dot(g, x):
    """sum(g * x) in float64 (each product exact)."""
    total = 0.0
    for i in range(g.shape[0]):
        total += np.float64(g[i]) * np.float64(x[i])
    return total


def _backward(dy, x, dx, s, bias_sum, scale_sum, want_bias, want_scale, want_dx, r0, r1):
    """For rows [r0, r1): bias_sum[r] = sum(dy[r]), scale_sum[r] = sum(dy[r] * x[r])
    (float64), then dx[r] = dy[r] * s[r]. dx may be dy (in place): each row is read before
    it is overwritten."""
    inner = dy.shape[1]
    row = np.empty(inner if want_dx else 0, dtype=dy.dtype)
    in_place = dx.ctypes.data == dy.ctypes.data
    for r in range(r0, r1):
        g = dy[r]
        if want_bias:
            bias_sum[r] = _row_sum(g)
        if want_scale:
            scale_sum[r] = _row_dot(g, x[r])
        if want_dx:
            # In place (dx is dy), made in `row` and then copied: a loop whose output may
            # overlap its input is not vectorised (1.3x as long).
            sr = s[r]
            made = row if in_place else dx[r]
            for i in range(inner):
                made[i] = g[i] * sr
            if in_place:
                target = dx[r]
                for i in range(inner):
                    target[i] = row[i]


def _compile(numba) -> types.SimpleNamespace:
    # The sums may be reassociated: numba then keeps several partial sums in vector lanes
    # (1.1 ms instead of 4.7 for 1024 rows of 56x56 on one core; one chain of dependent
    # float64 additions runs at the adder's latency, slower than memory). The order is
    # fixed by the compiled code, not by the thread count.
    sums = functools.partial(compiled.jit, numba, fastmath={"reassoc"})
    # Helpers first: the kernels call the compiled versions through the module globals.
    global _row_sum, _row_dot
    _row_sum, _row_dot = sums(_row_sum), sums(_row_dot)
    return types.SimpleNamespace(forward=compiled.jit(numba, _forward),
                                 backward=compiled.jit(numba, _backward))


load = compiled.loader(
    _compile, "The compiled loops (compiled on first call per dtype), or None without numba.")
