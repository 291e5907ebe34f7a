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

from . import compiled

_loaded: types.SimpleNamespace | None | bool = False  # False: not tried yet


#: Tiles per block of the transforms that write 16 streams (V, dM): each block's 16 results
#: are made in a small buffer (in the L1 cache) and copied out as 16 contiguous runs.
#: Written tile by tile straight into the 16 rows, the stores ran at ~1 GB/s (conv2/3x3
#: b8: the output gradient 88 ms, the input transform 174 ms).
BLOCK_TILES = 64


def _pad_plane(image, s, c, ph, pw, padded, zero):
    """padded (Hp, Wp) = plane (s, c) of image with its zero border (the pad, and the
    extra row or column of an odd output size)."""
    height, width = image.shape[2], image.shape[3]
    for y in range(padded.shape[0]):
        row = padded[y]
        if y < ph or y >= ph + height:
            for x in range(padded.shape[1]):
                row[x] = zero
            continue
        source = image[s, c, y - ph]
        for x in range(pw):
            row[x] = zero
        for x in range(width):
            row[pw + x] = source[x]
        for x in range(pw + width, padded.shape[1]):
            row[x] = zero


def _column_in(padded, y0, x):
    """B^T times the 4-cell column x of the tile from row y0 (B^T's rows: d0 - d2, d1 + d2,
    d2 - d1, d1 - d3)."""
    d0, d1, d2, d3 = padded[y0, x], padded[y0 + 1, x], padded[y0 + 2, x], padded[y0 + 3, x]
    return d0 - d2, d1 + d2, d2 - d1, d1 - d3


def _copy_block(block, out, first, at, count, k0, s):
    """out[k0 + k, first, s, at:at + count] = block[k, :count] for the 16 k (16 runs)."""
    for k in range(16):
        row, target = block[k], out[k0 + k, first, s]
        for t in range(count):
            target[at + t] = row[t]


def _input_tiles(image, v, s0, s1, c0, c1, ph, pw, th, tw, zero):
    block = np.empty((16, BLOCK_TILES), dtype=v.dtype)
    vt = v.transpose(1, 0, 2, 3)  # (16, C, N, P): _copy_block's layout
    tiles = th * tw
    # Each plane is first copied with its zero border: the tiles then read it unchecked
    # (reading the image with a bounds check per cell took 7x as long).
    padded = np.empty((2 * th + 2, 2 * tw + 2), dtype=v.dtype)
    for q in range((s1 - s0) * (c1 - c0)):
        s, c = s0 + q // (c1 - c0), c0 + q % (c1 - c0)
        _pad_plane(image, s, c, ph, pw, padded, zero)
        for at in range(0, tiles, BLOCK_TILES):
            count = min(BLOCK_TILES, tiles - at)
            for t in range(count):
                p = at + t
                y0, x0 = 2 * (p // tw), 2 * (p % tw)
                # t = B^T d per column, then V = t B per row: the same combination.
                t0, t1 = _column_in(padded, y0, x0), _column_in(padded, y0, x0 + 1)
                t2, t3 = _column_in(padded, y0, x0 + 2), _column_in(padded, y0, x0 + 3)
                for i in range(4):
                    a, b, e, f = t0[i], t1[i], t2[i], t3[i]
                    block[4 * i, t] = a - e
                    block[4 * i + 1, t] = b + e
                    block[4 * i + 2, t] = e - b
                    block[4 * i + 3, t] = b - f
            _copy_block(block, vt, c, at, count, 0, s)


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
    ho, wo = dy.shape[2], dy.shape[3]
    block = np.empty((16, BLOCK_TILES), dtype=dm.dtype)
    tiles = dm.shape[3]
    for q in range((s1 - s0) * (o1 - o0)):
        s, o = s0 + q // (o1 - o0), o0 + q % (o1 - o0)
        for at in range(0, tiles, BLOCK_TILES):
            count = min(BLOCK_TILES, tiles - at)
            _output_grad_block(dy, block, s, o, at, count, tw, ho, wo, zero)
            _copy_block(block, dm, o, at, count, 0, s)


def _output_grad_block(dy, block, s, o, at, count, tw, ho, wo, zero):
    """block[:, :count] = dM of tiles [at, at + count) of plane (s, o)."""
    for t in range(count):
        p = at + t
        y, x = 2 * (p // tw), 2 * (p % tw)
        right, down = x + 1 < wo, y + 1 < ho
        g00 = dy[s, o, y, x]
        g01 = dy[s, o, y, x + 1] if right else zero
        g10 = dy[s, o, y + 1, x] if down else zero
        g11 = dy[s, o, y + 1, x + 1] if right and down else zero
        # dM = A dY A^T; A's rows: (1, 0), (1, 1), (1, -1), (0, -1). Rows first.
        ra = (g00, g00 + g10, g00 - g10, -g10)
        rb = (g01, g01 + g11, g01 - g11, -g11)
        for i in range(4):
            a, b = ra[i], rb[i]
            block[4 * i, t] = a
            block[4 * i + 1, t] = a + b
            block[4 * i + 2, t] = a - b
            block[4 * i + 3, t] = -b


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
    global _pad_plane, _column_in, _column_back, _copy_block, _output_grad_block
    # The helpers called from compiled code are compiled themselves (looked up as globals).
    _pad_plane, _column_in, _column_back = jit(_pad_plane), jit(_column_in), jit(_column_back)
    _copy_block, _output_grad_block = jit(_copy_block), jit(_output_grad_block)
    return types.SimpleNamespace(
        input_tiles=jit(_input_tiles), output_tiles=jit(_output_tiles),
        output_grad_tiles=jit(_output_grad_tiles),
        input_grad_tiles=jit(_input_grad_tiles))


def load() -> types.SimpleNamespace | None:
    """The compiled transforms, or None when numba cannot be imported."""
    global _loaded
    if _loaded is False:  # two threads may both get here: compiled.load compiles once
        _loaded = compiled.load(_compile)
    return _loaded
