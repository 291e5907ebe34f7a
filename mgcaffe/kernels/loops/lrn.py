"""LRN across channels as compiled loops (numba), one sample at a time, for the CPU.

Why: the numpy formulation (`layer_types/lrn.py`) makes about nine whole-array passes per
sample each way (square, a window sum of a copy and 2*half adds, scale, shift, power,
multiply), and numpy's float power is slow. A loop per channel works on rows of H*W cells:
the 2*half + 1 input rows of a channel's window stay in the cache as the window slides, so
each array is read or written once from memory.

The window sum is recomputed per channel (local_size terms, in the numpy path's order: the
centre, then the channels at distance 1, 2, ... above and below; one pass for local_size 5
away from the edges), not kept as a running sum with the entering channel added and the
leaving one subtracted (Caffe's CPU code): the subtraction cancels badly in float32 when a
large square leaves the window, and the terms are rows already in the cache, so
recomputing measured as fast. The sums and scales equal the numpy path's bit for bit; only
scale^-beta differs: beta = 0.75 (every Caffe reference net) is 1 / (sqrt(s) *
sqrt(sqrt(s))), within 4 ulps of exact and about twice as fast as numpy's power; for any
other beta the layer takes numpy's power after the loop (numba's pow is a scalar call per
element, several times slower).

The backward keeps a ring of local_size rows of dtop * top / scale (each row computed once,
when its channel enters the window) and sums the window from the ring in the same order.

Every function works on samples [n0, n1) of (N, C, H*W) arrays, so the layer's chunk runner
calls it from several threads on disjoint samples (`nogil`: they run in parallel).
`load()` imports numba on first use and returns the compiled functions, or None when numba
cannot be imported (the layer then keeps its numpy path).
"""

from __future__ import annotations

import functools
import types

import numpy as np

from ...cpu import compiled


def _window_squares(x, n, c, half, out):
    """out = the sum of x[n, j]^2 over the window of channel c (the numpy path's order)."""
    channels, cells = x.shape[1], x.shape[2]
    if half == 2 and 2 <= c < channels - 2:
        # local_size 5 (every Caffe reference net) away from the edges: one pass.
        a0, a1, a2, a3, a4 = x[n, c], x[n, c + 1], x[n, c - 1], x[n, c + 2], x[n, c - 2]
        for p in range(cells):
            out[p] = ((((a0[p] * a0[p] + a1[p] * a1[p]) + a2[p] * a2[p]) + a3[p] * a3[p])
                      + a4[p] * a4[p])
        return
    # Inner loops index 1-D views with the bare loop counter: vectorised.
    centre = x[n, c]
    for p in range(cells):
        out[p] = centre[p] * centre[p]
    for d in range(1, half + 1):
        if c + d < channels and c - d >= 0:
            up, down = x[n, c + d], x[n, c - d]
            for p in range(cells):
                out[p] = (out[p] + up[p] * up[p]) + down[p] * down[p]
        elif c + d < channels:
            up = x[n, c + d]
            for p in range(cells):
                out[p] += up[p] * up[p]
        elif c - d >= 0:
            down = x[n, c - d]
            for p in range(cells):
                out[p] += down[p] * down[p]


def _across_forward(x, top, scale, scale_pow, n0, n1, half, a, k, three_quarters):
    """Samples [n0, n1): scale = k + a * (window sum of x^2), a = alpha / local_size (the
    arrays' type); with three_quarters (beta = 0.75) also scale_pow = scale^-0.75 and
    top = x * scale_pow (for any other beta the caller takes the power: numba's pow is a
    scalar call per element, several times slower than numpy's)."""
    one = x.dtype.type(1)
    for n in range(n0, n1):
        for c in range(x.shape[1]):
            acc = scale[n, c]
            _window_squares(x, n, c, half, acc)
            if not three_quarters:
                for p in range(acc.shape[0]):
                    acc[p] = acc[p] * a + k
                continue
            centre, out_pow, out = x[n, c], scale_pow[n, c], top[n, c]
            for p in range(acc.shape[0]):
                s = acc[p] * a + k
                acc[p] = s
                root = np.sqrt(s)
                power = one / (root * np.sqrt(root))
                out_pow[p] = power
                out[p] = centre[p] * power


def _ratio(dtop, top, scale, out):
    """out = dtop * top / scale over one row."""
    for p in range(out.shape[0]):
        out[p] = dtop[p] * top[p] / scale[p]


def _across_backward(x, top, top_diff, scale, scale_pow, diff, n0, n1, half, coef):
    """Samples [n0, n1): diff = (window sum of top_diff * top / scale) * x * coef +
    top_diff * scale_pow, coef = -2 * alpha * beta / local_size (the arrays' type), in the
    numpy path's order of operations (the same roundings)."""
    channels, cells = x.shape[1], x.shape[2]
    size = 2 * half + 1
    ring = np.empty((size, cells), dtype=x.dtype)  # the ratio row of channel j at j % size
    acc = np.empty(cells, dtype=x.dtype)
    for n in range(n0, n1):
        for j in range(min(half, channels)):
            _ratio(top_diff[n, j], top[n, j], scale[n, j], ring[j])
        for c in range(channels):
            entering = c + half
            if entering < channels:
                _ratio(top_diff[n, entering], top[n, entering], scale[n, entering],
                       ring[entering % size])
            out, xr, dtop, spow = diff[n, c], x[n, c], top_diff[n, c], scale_pow[n, c]
            if half == 2 and 2 <= c < channels - 2:
                r0, r1, r2 = ring[c % size], ring[(c + 1) % size], ring[(c - 1) % size]
                r3, r4 = ring[(c + 2) % size], ring[(c - 2) % size]
                for p in range(cells):
                    total = (((r0[p] + r1[p]) + r2[p]) + r3[p]) + r4[p]
                    out[p] = total * xr[p] * coef + dtop[p] * spow[p]
                continue
            centre = ring[c % size]
            for p in range(cells):
                acc[p] = centre[p]
            for d in range(1, half + 1):
                if c + d < channels:
                    src = ring[(c + d) % size]
                    for p in range(cells):
                        acc[p] += src[p]
                if c - d >= 0:
                    src = ring[(c - d) % size]
                    for p in range(cells):
                        acc[p] += src[p]
            for p in range(cells):
                out[p] = acc[p] * xr[p] * coef + dtop[p] * spow[p]


def _compile(numba) -> types.SimpleNamespace:
    # Float division by zero gives inf as in numpy (scale is at least k > 0 in practice): no
    # per-element check, so the loops that divide are vectorised.
    jit = functools.partial(compiled.jit, numba, error_model="numpy")
    # Helpers first: the kernels call the compiled versions through the module globals.
    global _window_squares, _ratio
    _window_squares, _ratio = jit(_window_squares), jit(_ratio)
    return types.SimpleNamespace(across_forward=jit(_across_forward),
                                 across_backward=jit(_across_backward))


load = compiled.loader(
    _compile, "The compiled loops (compiled on first call per dtype), or None without numba.")
