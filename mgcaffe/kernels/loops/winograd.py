"""Winograd F(2x2, 3x3)'s four tile transforms as compiled loops (numba), for the CPU.

Why: kernels.winograd does the transforms as small GEMMs over im2col's tile columns
(V = kron(B^T, B^T) @ tiles: 256 multiply-adds per tile and channel where B^T d B needs 32
additions), plus the copies of im2col, col2im, padding and cropping around them. A loop per
(sample, channel) plane reads each 4x4 tile from the image once, keeps it in registers and
writes the 16 results in the layout the GEMMs use, with the padding and the crop done by
bounds checks instead of copies.

Layouts are kernels.winograd's (P = tiles_h * tiles_w, tiles in row-major order):
- `input_tiles`: image (N, C, H, W) -> V (C, 16, N, P) = B^T d B, zeros past the pad.
- `output_tiles`: M (16, O, N, P) -> top (N, O, Ho, Wo) = A^T M A (+ bias), the partial
  last tile of an odd size cropped.
- `output_grad_tiles`: dY (N, O, Ho, Wo) -> dM (16, O, N, P) = A dY A^T (output_tiles'
  adjoint; dY is zero past the output's edge).
- `input_grad_tiles`: dV (16, C, N, P) -> dd (N, C, H, W) = B dV B^T added onto the
  overlapping tiles, cropped by the pad (input_tiles' adjoint; overwritten). Each plane's
  tiles are added in the same order whatever the threads, so the result does not depend
  on them.

Each function works on the planes of samples [s0, s1) and channels [c0, c1) (input side) or
outputs [o0, o1) (output side), so the layer's chunk runner calls it from several threads
on disjoint planes (`nogil`: they run in parallel). The arithmetic stays in the
blob's type (`zero` is a 0 of it).

`load()` imports numba on first use and returns the compiled functions, or None when numba
cannot be imported (kernels.winograd then keeps its GEMM transforms). The on-disk cache
(`cache=True`) saves the compilation for later processes; where no cache directory is
writable, the functions compile in memory in each process instead.
"""

from __future__ import annotations

import functools
import types

import numpy as np

from ...cpu import compiled


def _column_in(padded, y0, x):
    """B^T times the 4-cell column x of the tile from row y0 of `padded` (B^T's rows:
    d0 - d2, d1 + d2, d2 - d1, d1 - d3)."""
    d0, d1, d2, d3 = padded[y0, x], padded[y0 + 1, x], padded[y0 + 2, x], padded[y0 + 3, x]
    return d0 - d2, d1 + d2, d2 - d1, d1 - d3


def _input_tiles(image, v, s0, s1, c0, c1, ph, pw, th, tw, zero):
    vt = v.transpose(1, 0, 2, 3)  # (16, C, N, P)
    # A tile row's four padded image rows, copied with the zero border: the tiles then read
    # them unchecked (reading the image with a bounds check per cell took 7x as long).
    rows = np.empty((4, 2 * tw + 2), dtype=v.dtype)
    for q in range((s1 - s0) * (c1 - c0)):
        s, c = s0 + q // (c1 - c0), c0 + q % (c1 - c0)
        out = vt[:, c, s]
        for ty in range(th):
            for i in range(4):
                _padded_row(image, s, c, 2 * ty + i - ph, pw, rows[i], zero)
            _input_row(rows, out, ty * tw, tw)


def _padded_row(image, s, c, y, pw, row, zero):
    """row = image[s, c, y] shifted right by pw, zero outside it (all zero where y is
    outside the image)."""
    width = image.shape[3] if 0 <= y < image.shape[2] else 0
    for x in range(min(pw, row.shape[0])):
        row[x] = zero
    for x in range(width):
        row[pw + x] = image[s, c, y, x]
    for x in range(pw + width, row.shape[0]):
        row[x] = zero


def _input_row(rows, out, first, count):
    """out[:, first + t] = V of the tiles over columns 2t .. 2t + 3 of the four rows."""
    for t in range(count):
        x0 = 2 * t
        # B^T per column (d0 - d2, d1 + d2, d2 - d1, d1 - d3), then the same along the row.
        c0 = _column_in(rows, 0, x0)
        c1 = _column_in(rows, 0, x0 + 1)
        c2 = _column_in(rows, 0, x0 + 2)
        c3 = _column_in(rows, 0, x0 + 3)
        p = first + t
        out[0, p], out[1, p] = c0[0] - c2[0], c1[0] + c2[0]
        out[2, p], out[3, p] = c2[0] - c1[0], c1[0] - c3[0]
        out[4, p], out[5, p] = c0[1] - c2[1], c1[1] + c2[1]
        out[6, p], out[7, p] = c2[1] - c1[1], c1[1] - c3[1]
        out[8, p], out[9, p] = c0[2] - c2[2], c1[2] + c2[2]
        out[10, p], out[11, p] = c2[2] - c1[2], c1[2] - c3[2]
        out[12, p], out[13, p] = c0[3] - c2[3], c1[3] + c2[3]
        out[14, p], out[15, p] = c2[3] - c1[3], c1[3] - c3[3]


def _output_tiles(m, top, bias, has_bias, s0, s1, o0, o1, tw):
    ho, wo = top.shape[2], top.shape[3]
    for q in range((s1 - s0) * (o1 - o0)):
        s, o = s0 + q // (o1 - o0), o0 + q % (o1 - o0)
        b = bias[o] if has_bias else bias[0]
        for p in range(m.shape[3]):
            y, x = 2 * (p // tw), 2 * (p % tw)
            # Y = A^T M A; A^T's rows: m0 + m1 + m2, m1 - m2 - m3. Per column j of M first:
            # r0[j] = M[0, j] + M[1, j] + M[2, j], r1[j] = M[1, j] - M[2, j] - M[3, j].
            a0, b0 = m[0, o, s, p] + m[4, o, s, p] + m[8, o, s, p], m[4, o, s, p] - m[8, o, s, p]
            a1, b1 = m[1, o, s, p] + m[5, o, s, p] + m[9, o, s, p], m[5, o, s, p] - m[9, o, s, p]
            a2 = m[2, o, s, p] + m[6, o, s, p] + m[10, o, s, p]
            b2 = m[6, o, s, p] - m[10, o, s, p]
            a3 = m[3, o, s, p] + m[7, o, s, p] + m[11, o, s, p]
            b3 = m[7, o, s, p] - m[11, o, s, p]
            b0, b1 = b0 - m[12, o, s, p], b1 - m[13, o, s, p]
            b2, b3 = b2 - m[14, o, s, p], b3 - m[15, o, s, p]
            y00, y01 = a0 + a1 + a2, a1 - a2 - a3
            y10, y11 = b0 + b1 + b2, b1 - b2 - b3
            if has_bias:
                y00, y01, y10, y11 = y00 + b, y01 + b, y10 + b, y11 + b
            top[s, o, y, x] = y00
            if x + 1 < wo:
                top[s, o, y, x + 1] = y01
            if y + 1 < ho:
                top[s, o, y + 1, x] = y10
                if x + 1 < wo:
                    top[s, o, y + 1, x + 1] = y11


def _output_grad_tiles(dy, dm, s0, s1, o0, o1, tw, zero):
    th = dm.shape[3] // tw
    # Each tile row's two image rows, copied with a zero past the edge: the tiles then read
    # them unchecked, and the 16 results of a tile go straight to dM's 16 slabs.
    upper = np.empty(2 * tw, dtype=dm.dtype)
    lower = np.empty(2 * tw, dtype=dm.dtype)
    for q in range((s1 - s0) * (o1 - o0)):
        s, o = s0 + q // (o1 - o0), o0 + q % (o1 - o0)
        out = dm[:, o, s]
        for ty in range(th):
            _padded_row(dy, s, o, 2 * ty, 0, upper, zero)
            _padded_row(dy, s, o, 2 * ty + 1, 0, lower, zero)
            _output_grad_row(upper, lower, out, ty * tw, tw)


def _output_grad_row(upper, lower, out, first, count):
    """out[:, first + t] = dM of the tiles over columns 2t, 2t + 1 of rows upper, lower."""
    for t in range(count):
        g00, g01 = upper[2 * t], upper[2 * t + 1]
        g10, g11 = lower[2 * t], lower[2 * t + 1]
        # dM = A dY A^T; A's rows: (1, 0), (1, 1), (1, -1), (0, -1).
        a1, a2 = g00 + g10, g00 - g10
        b1, b2 = g01 + g11, g01 - g11
        p = first + t
        out[0, p], out[1, p], out[2, p], out[3, p] = g00, g00 + g01, g00 - g01, -g01
        out[4, p], out[5, p], out[6, p], out[7, p] = a1, a1 + b1, a1 - b1, -b1
        out[8, p], out[9, p], out[10, p], out[11, p] = a2, a2 + b2, a2 - b2, -b2
        out[12, p], out[13, p] = -g10, -g10 - g11
        out[14, p], out[15, p] = g11 - g10, g11


def _column_back(dv, c, s, p, j):
    """B times column j of the tile gradient dV (B's rows: v0, v1 - v2 + v3,
    v1 + v2 - v0, -v3)."""
    w0, w1, w2, w3 = dv[j, c, s, p], dv[4 + j, c, s, p], dv[8 + j, c, s, p], dv[12 + j, c, s, p]
    return w0, w1 - w2 + w3, w1 + w2 - w0, -w3


def _input_grad_tiles(dv, out, s0, s1, c0, c1, ph, pw, th, tw, zero):
    height, width = out.shape[2], out.shape[3]
    for q in range((s1 - s0) * (c1 - c0)):
        s, c = s0 + q // (c1 - c0), c0 + q % (c1 - c0)
        for y in range(height):
            for x in range(width):
                out[s, c, y, x] = zero
        # Tiles in row-major order, each added cell by cell: a fixed order per plane.
        for ty in range(th):
            y0 = 2 * ty - ph
            for tx in range(tw):
                x0 = 2 * tx - pw
                p = ty * tw + tx
                t0, t1 = _column_back(dv, c, s, p, 0), _column_back(dv, c, s, p, 1)
                t2, t3 = _column_back(dv, c, s, p, 2), _column_back(dv, c, s, p, 3)
                for i in range(4):
                    y = y0 + i
                    if y < 0 or y >= height:
                        continue
                    e0, e1, e2, e3 = t0[i], t1[i], t2[i], t3[i]
                    row = (e0, e1 - e2 + e3, e1 + e2 - e0, -e3)
                    for j in range(4):
                        x = x0 + j
                        if 0 <= x < width:
                            out[s, c, y, x] += row[j]


def _compile(numba):
    """The functions compiled lazily per argument types (float32 / float64 blobs)."""
    jit = functools.partial(compiled.jit, numba)
    global _column_in, _column_back, _padded_row, _input_row, _output_grad_row
    # The helpers called from compiled code are compiled themselves (looked up as globals).
    _column_in, _column_back = jit(_column_in), jit(_column_back)
    _padded_row, _input_row = jit(_padded_row), jit(_input_row)
    _output_grad_row = jit(_output_grad_row)
    return types.SimpleNamespace(
        input_tiles=jit(_input_tiles), output_tiles=jit(_output_tiles),
        output_grad_tiles=jit(_output_grad_tiles),
        input_grad_tiles=jit(_input_grad_tiles))


load = compiled.loader(
    _compile, "The compiled transforms, or None when numba cannot be imported.")
