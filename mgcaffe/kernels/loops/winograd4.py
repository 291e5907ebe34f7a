"""Winograd F(4x4, 3x3)'s four tile transforms as compiled loops (numba), for the CPU.

The same four functions, with the same arguments and layouts, as kernels.winograd_loops has
for F(2x2, 3x3), for 6x6 input tiles at a stride of 4 and 4x4 output tiles (36 tile
positions, k = 6*i + j): with B^T (6x6), A^T (4x6) the F(4x4, 3x3) matrices (Lavin and
Gray's, points 0, +-1, +-2 and infinity),

- `input_tiles`: V = B^T d B, 36 values per tile and channel;
- `output_tiles`: Y = A^T M A (+ bias), cropped where the output size is not a multiple of
  4;
- `output_grad_tiles`: dM = A dY A^T, dY zero past the output's edge;
- `input_grad_tiles`: B dV B^T added onto the overlapping tiles (in the same order whatever
  the threads), cropped by the pad.

Each transform is applied along the tile's columns and then along its rows, six-term
combinations with the coefficients 1, 2, 4, 5 and 8 in the blob's type (exact), so float32
results differ from float64 ones by a few units in the last place of the largest terms
(more than F(2x2)'s: more terms and larger coefficients; tests bound it).
"""

from __future__ import annotations

import functools
import types

import numpy as np

from ...cpu import compiled
from . import winograd as winograd_loops

#: A tile row's image rows are padded as for F(2x2): winograd_loops' row copy.
_padded_row = winograd_loops._padded_row


def _bt(d0, d1, d2, d3, d4, d5, two, four, five):
    """B^T times (d0 .. d5)."""
    return (four * d0 - five * d2 + d4, d3 + d4 - four * (d1 + d2),
            four * (d1 - d2) - d3 + d4, d4 - d2 + two * (d3 - d1),
            d4 - d2 + two * (d1 - d3), four * d1 - five * d3 + d5)


def _at(m0, m1, m2, m3, m4, m5, two, four, eight):
    """A^T times (m0 .. m5)."""
    s, t = m1 + m2, m1 - m2
    u, w = m3 + m4, m3 - m4
    return m0 + s + u, t + two * w, s + four * u, t + eight * w + m5


def _a(g0, g1, g2, g3, two, four, eight):
    """A times (g0 .. g3)."""
    even, odd = g0 + g2, g1 + g3
    even4, odd4 = g0 + four * g2, two * g1 + eight * g3
    return g0, even + odd, even - odd, even4 + odd4, even4 - odd4, g3


def _b(v0, v1, v2, v3, v4, v5, two, four, five):
    """B times (v0 .. v5)."""
    return (four * v0, four * (v2 - v1 + v5) + two * (v4 - v3),
            -five * v0 - four * (v1 + v2) - v3 - v4, v1 - v2 + two * (v3 - v4) - five * v5,
            v0 + v1 + v2 + v3 + v4, v5)


def _input_tiles(image, v, s0, s1, c0, c1, ph, pw, th, tw, zero):
    t = v.dtype.type
    two, four, five = t(2), t(4), t(5)
    vt = v.transpose(1, 0, 2, 3)  # (36, C, N, P)
    rows = np.empty((6, 4 * tw + 2), dtype=v.dtype)
    for q in range((s1 - s0) * (c1 - c0)):
        s, c = s0 + q // (c1 - c0), c0 + q % (c1 - c0)
        out = vt[:, c, s]
        for ty in range(th):
            for i in range(6):
                _padded_row(image, s, c, 4 * ty + i - ph, pw, rows[i], zero)
            for tx in range(tw):
                _input_tile(rows, out, ty * tw + tx, 4 * tx, two, four, five)


def _input_tile(rows, out, p, x0, two, four, five):
    """out[:, p] = B^T d B of the tile over columns x0 .. x0 + 5 of the six rows."""
    r0, r1, r2, r3, r4, r5 = rows[0], rows[1], rows[2], rows[3], rows[4], rows[5]
    c0 = _bt(r0[x0], r1[x0], r2[x0], r3[x0], r4[x0], r5[x0], two, four, five)
    c1 = _bt(r0[x0 + 1], r1[x0 + 1], r2[x0 + 1], r3[x0 + 1], r4[x0 + 1], r5[x0 + 1],
             two, four, five)
    c2 = _bt(r0[x0 + 2], r1[x0 + 2], r2[x0 + 2], r3[x0 + 2], r4[x0 + 2], r5[x0 + 2],
             two, four, five)
    c3 = _bt(r0[x0 + 3], r1[x0 + 3], r2[x0 + 3], r3[x0 + 3], r4[x0 + 3], r5[x0 + 3],
             two, four, five)
    c4 = _bt(r0[x0 + 4], r1[x0 + 4], r2[x0 + 4], r3[x0 + 4], r4[x0 + 4], r5[x0 + 4],
             two, four, five)
    c5 = _bt(r0[x0 + 5], r1[x0 + 5], r2[x0 + 5], r3[x0 + 5], r4[x0 + 5], r5[x0 + 5],
             two, four, five)
    _put6(out, 0, p, _bt(c0[0], c1[0], c2[0], c3[0], c4[0], c5[0], two, four, five))
    _put6(out, 6, p, _bt(c0[1], c1[1], c2[1], c3[1], c4[1], c5[1], two, four, five))
    _put6(out, 12, p, _bt(c0[2], c1[2], c2[2], c3[2], c4[2], c5[2], two, four, five))
    _put6(out, 18, p, _bt(c0[3], c1[3], c2[3], c3[3], c4[3], c5[3], two, four, five))
    _put6(out, 24, p, _bt(c0[4], c1[4], c2[4], c3[4], c4[4], c5[4], two, four, five))
    _put6(out, 30, p, _bt(c0[5], c1[5], c2[5], c3[5], c4[5], c5[5], two, four, five))


def _put6(out, k, p, values):
    """out[k .. k + 5, p] = values."""
    out[k, p], out[k + 1, p], out[k + 2, p] = values[0], values[1], values[2]
    out[k + 3, p], out[k + 4, p], out[k + 5, p] = values[3], values[4], values[5]


def _output_tiles(m, top, bias, has_bias, s0, s1, o0, o1, tw):
    t = top.dtype.type
    two, four, eight = t(2), t(4), t(8)
    ho, wo = top.shape[2], top.shape[3]
    for q in range((s1 - s0) * (o1 - o0)):
        s, o = s0 + q // (o1 - o0), o0 + q % (o1 - o0)
        b = bias[o] if has_bias else t(0)
        tiles, plane = m[:, o, s], top[s, o]
        for p in range(m.shape[3]):
            y, x = 4 * (p // tw), 4 * (p % tw)
            c0, c1, c2, c3, c4, c5 = _output_columns(tiles, p, two, four, eight)
            r0 = _at(c0[0], c1[0], c2[0], c3[0], c4[0], c5[0], two, four, eight)
            r1 = _at(c0[1], c1[1], c2[1], c3[1], c4[1], c5[1], two, four, eight)
            r2 = _at(c0[2], c1[2], c2[2], c3[2], c4[2], c5[2], two, four, eight)
            r3 = _at(c0[3], c1[3], c2[3], c3[3], c4[3], c5[3], two, four, eight)
            if has_bias:
                r0, r1 = _plus(r0, b), _plus(r1, b)
                r2, r3 = _plus(r2, b), _plus(r3, b)
            if y + 4 <= ho and x + 4 <= wo:  # a whole tile: no crop
                _put4(plane, y, x, r0)
                _put4(plane, y + 1, x, r1)
                _put4(plane, y + 2, x, r2)
                _put4(plane, y + 3, x, r3)
                continue
            rows = (r0, r1, r2, r3)
            for i in range(min(4, ho - y)):
                row = rows[i]
                for j in range(min(4, wo - x)):
                    plane[y + i, x + j] = row[j]


def _plus(row, b):
    """row + b, each of four."""
    return row[0] + b, row[1] + b, row[2] + b, row[3] + b


def _put4(plane, y, x, row):
    """plane[y, x .. x + 3] = row."""
    plane[y, x], plane[y, x + 1], plane[y, x + 2], plane[y, x + 3] = row[0], row[1], row[2], \
        row[3]


def _output_columns(tiles, p, two, four, eight):
    """A^T down each of the six columns of tile p of `tiles` (36, P)."""
    return (_at(tiles[0, p], tiles[6, p], tiles[12, p], tiles[18, p], tiles[24, p],
                tiles[30, p], two, four, eight),
            _at(tiles[1, p], tiles[7, p], tiles[13, p], tiles[19, p], tiles[25, p],
                tiles[31, p], two, four, eight),
            _at(tiles[2, p], tiles[8, p], tiles[14, p], tiles[20, p], tiles[26, p],
                tiles[32, p], two, four, eight),
            _at(tiles[3, p], tiles[9, p], tiles[15, p], tiles[21, p], tiles[27, p],
                tiles[33, p], two, four, eight),
            _at(tiles[4, p], tiles[10, p], tiles[16, p], tiles[22, p], tiles[28, p],
                tiles[34, p], two, four, eight),
            _at(tiles[5, p], tiles[11, p], tiles[17, p], tiles[23, p], tiles[29, p],
                tiles[35, p], two, four, eight))


def _output_grad_tiles(dy, dm, s0, s1, o0, o1, tw, zero):
    t = dm.dtype.type
    two, four, eight = t(2), t(4), t(8)
    th = dm.shape[3] // tw
    rows = np.empty((4, 4 * tw), dtype=dm.dtype)
    for q in range((s1 - s0) * (o1 - o0)):
        s, o = s0 + q // (o1 - o0), o0 + q % (o1 - o0)
        out = dm[:, o, s]
        for ty in range(th):
            for i in range(4):
                _padded_row(dy, s, o, 4 * ty + i, 0, rows[i], zero)
            for tx in range(tw):
                _output_grad_tile(rows, out, ty * tw + tx, 4 * tx, two, four, eight)


def _output_grad_tile(rows, out, p, x0, two, four, eight):
    """out[:, p] = A dY A^T of the 4x4 tile over columns x0 .. x0 + 3 of the four rows."""
    r0, r1, r2, r3 = rows[0], rows[1], rows[2], rows[3]
    c0 = _a(r0[x0], r1[x0], r2[x0], r3[x0], two, four, eight)
    c1 = _a(r0[x0 + 1], r1[x0 + 1], r2[x0 + 1], r3[x0 + 1], two, four, eight)
    c2 = _a(r0[x0 + 2], r1[x0 + 2], r2[x0 + 2], r3[x0 + 2], two, four, eight)
    c3 = _a(r0[x0 + 3], r1[x0 + 3], r2[x0 + 3], r3[x0 + 3], two, four, eight)
    _put6(out, 0, p, _a(c0[0], c1[0], c2[0], c3[0], two, four, eight))
    _put6(out, 6, p, _a(c0[1], c1[1], c2[1], c3[1], two, four, eight))
    _put6(out, 12, p, _a(c0[2], c1[2], c2[2], c3[2], two, four, eight))
    _put6(out, 18, p, _a(c0[3], c1[3], c2[3], c3[3], two, four, eight))
    _put6(out, 24, p, _a(c0[4], c1[4], c2[4], c3[4], two, four, eight))
    _put6(out, 30, p, _a(c0[5], c1[5], c2[5], c3[5], two, four, eight))


def _input_grad_tiles(dv, out, s0, s1, c0, c1, ph, pw, th, tw, zero):
    t = out.dtype.type
    two, four, five = t(2), t(4), t(5)
    height, width = out.shape[2], out.shape[3]
    for q in range((s1 - s0) * (c1 - c0)):
        s, c = s0 + q // (c1 - c0), c0 + q % (c1 - c0)
        plane = out[s, c]
        for y in range(height):
            for x in range(width):
                plane[y, x] = zero
        tiles = dv[:, c, s]
        # Tiles in row-major order, each added cell by cell: a fixed order per plane.
        for ty in range(th):
            y0 = 4 * ty - ph
            for tx in range(tw):
                x0 = 4 * tx - pw
                k0, k1, k2, k3, k4, k5 = _input_grad_columns(tiles, ty * tw + tx, two, four,
                                                             five)
                r0 = _b(k0[0], k1[0], k2[0], k3[0], k4[0], k5[0], two, four, five)
                r1 = _b(k0[1], k1[1], k2[1], k3[1], k4[1], k5[1], two, four, five)
                r2 = _b(k0[2], k1[2], k2[2], k3[2], k4[2], k5[2], two, four, five)
                r3 = _b(k0[3], k1[3], k2[3], k3[3], k4[3], k5[3], two, four, five)
                r4 = _b(k0[4], k1[4], k2[4], k3[4], k4[4], k5[4], two, four, five)
                r5 = _b(k0[5], k1[5], k2[5], k3[5], k4[5], k5[5], two, four, five)
                if y0 >= 0 and x0 >= 0 and y0 + 6 <= height and x0 + 6 <= width:
                    _add6(plane, y0, x0, r0)
                    _add6(plane, y0 + 1, x0, r1)
                    _add6(plane, y0 + 2, x0, r2)
                    _add6(plane, y0 + 3, x0, r3)
                    _add6(plane, y0 + 4, x0, r4)
                    _add6(plane, y0 + 5, x0, r5)
                    continue
                rows = (r0, r1, r2, r3, r4, r5)
                for i in range(6):
                    y = y0 + i
                    if y < 0 or y >= height:
                        continue
                    row = rows[i]
                    for j in range(6):
                        x = x0 + j
                        if 0 <= x < width:
                            plane[y, x] += row[j]


def _add6(plane, y, x, row):
    """plane[y, x .. x + 5] += row."""
    plane[y, x] += row[0]
    plane[y, x + 1] += row[1]
    plane[y, x + 2] += row[2]
    plane[y, x + 3] += row[3]
    plane[y, x + 4] += row[4]
    plane[y, x + 5] += row[5]


def _input_grad_columns(tiles, p, two, four, five):
    """B down each of the six columns of tile p of `tiles` (36, P)."""
    return (_b(tiles[0, p], tiles[6, p], tiles[12, p], tiles[18, p], tiles[24, p],
               tiles[30, p], two, four, five),
            _b(tiles[1, p], tiles[7, p], tiles[13, p], tiles[19, p], tiles[25, p],
               tiles[31, p], two, four, five),
            _b(tiles[2, p], tiles[8, p], tiles[14, p], tiles[20, p], tiles[26, p],
               tiles[32, p], two, four, five),
            _b(tiles[3, p], tiles[9, p], tiles[15, p], tiles[21, p], tiles[27, p],
               tiles[33, p], two, four, five),
            _b(tiles[4, p], tiles[10, p], tiles[16, p], tiles[22, p], tiles[28, p],
               tiles[34, p], two, four, five),
            _b(tiles[5, p], tiles[11, p], tiles[17, p], tiles[23, p], tiles[29, p],
               tiles[35, p], two, four, five))


def _compile(numba) -> types.SimpleNamespace:
    """The functions compiled lazily per argument types (float32 / float64 blobs)."""
    jit = functools.partial(compiled.jit, numba)
    global _bt, _at, _a, _b, _padded_row, _input_tile, _put6, _output_columns, \
        _output_grad_tile, _input_grad_columns, _plus, _put4, _add6
    # The helpers called from compiled code are compiled themselves (looked up as globals;
    # the padded row from its Python function, whether or not winograd_loops compiled it).
    _bt, _at, _a, _b = jit(_bt), jit(_at), jit(_a), jit(_b)
    _padded_row = jit(getattr(_padded_row, "py_func", _padded_row))
    _put6 = jit(_put6)
    _input_tile, _output_columns = jit(_input_tile), jit(_output_columns)
    _output_grad_tile, _input_grad_columns = jit(_output_grad_tile), jit(_input_grad_columns)
    _plus, _put4, _add6 = jit(_plus), jit(_put4), jit(_add6)
    return types.SimpleNamespace(
        input_tiles=jit(_input_tiles), output_tiles=jit(_output_tiles),
        output_grad_tiles=jit(_output_grad_tiles),
        input_grad_tiles=jit(_input_grad_tiles))


load = compiled.loader(
    _compile, "The compiled transforms, or None when numba cannot be imported.")
