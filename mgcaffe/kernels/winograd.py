"""Winograd F(2x2, 3x3) convolution for 3x3, stride-1, dilation-1 kernels (any pad, groups).

The output is cut into 2x2 tiles; each needs a 4x4 input tile (tiles overlap by 2 rows and
columns, zero padding past the edges; an odd output size leaves a partial last tile whose
extra row or column is computed and dropped). With B^T, G, A^T the F(2x2, 3x3) matrices:

    U = G g G^T            the weight, 4x4 per (output, input) channel pair
    V = B^T d B            each input tile, 4x4 per channel
    M[k] = U[k] @ V[k]     for each of the 16 tile positions k: (O x C) @ (C x tiles)
    Y = A^T M A            each 2x2 output tile

so the multiplications are 16 GEMMs with 16*O*C*tiles = 4*O*C*N*H*W multiply-adds against
im2col's 9*O*C*N*H*W (2.25x fewer). Backward uses the adjoints: dM = A dY A^T per tile,
dU[k] = dM[k] @ V[k]^T (summed over all tiles) then dg = G^T dU G, and dV[k] = U[k]^T @ dM[k]
then dd = B dV B^T added back onto the overlapping tiles and cropped by the pad.

Layouts (the tiles ordered sample, tile row, tile column; T = N * tiles_h * tiles_w):
the transformed input V (16, C, T), the transformed output M (16, O, T), the transformed
weight U (16, O, C/group). The transforms are a few adds over strided views, run over
blocks of channels on the chunk runner; the 16*group GEMMs are handed to the runner's
threads with one BLAS thread each (kernels.sample_gemm), so the results do not depend on the
thread count. Rounding: the transforms add and subtract up to 9 (input), 4 (output) and 9
(weight, with halves) values, so float32 results differ from a direct convolution's by a few
units in the last place of the largest terms, more than im2col's (same products, other
order) but of the same order as the GEMM's own rounding over C*9 terms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .parallel import for_each_chunk
from .sample_gemm import for_each_gemm

#: G (4x3): the weight transform U = G g G^T.
G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])

#: A chunk of a transform holds about this fraction of the runner's chunk size per item:
#: the transforms make a handful of passes over their block, and fewer, larger chunks save
#: numpy's per-call overhead (tens of calls per chunk).
CHUNK_SCALE = 8


@dataclass(frozen=True)
class WinogradGeometry:
    """Shapes of one Winograd layer: image (N, C, H, W), pad (ph, pw), O outputs, groups."""

    image: tuple
    pad: tuple
    num_output: int
    group: int

    @property
    def out_hw(self):
        _, _, h, w = self.image
        return h + 2 * self.pad[0] - 2, w + 2 * self.pad[1] - 2

    @property
    def tiles(self):
        """(tiles_h, tiles_w): 2x2 output tiles per sample, the last ones partial for odd
        sizes."""
        ho, wo = self.out_hw
        return -(-ho // 2), -(-wo // 2)

    @property
    def padded(self):
        """(Hp, Wp) of the zero-padded input the tiles read (at least H + 2*pad)."""
        th, tw = self.tiles
        return 2 * th + 2, 2 * tw + 2

    @property
    def count(self):
        """T: tiles in the whole batch."""
        th, tw = self.tiles
        return self.image[0] * th * tw

    def input_shape(self):
        """The transformed input V: (16, C, T)."""
        return (16, self.image[1], self.count)

    def output_shape(self):
        """The transformed output M (and its gradient): (16, O, T)."""
        return (16, self.num_output, self.count)

    def weight_shape(self):
        """The transformed weight U: (16, O, C/group)."""
        return (16, self.num_output, self.image[1] // self.group)


def applies(kernel, stride, dilation) -> bool:
    """Whether a 2-D convolution's geometry is one this module computes."""
    return tuple(kernel) == (3, 3) and tuple(stride) == (1, 1) and tuple(dilation) == (1, 1)


def _tiled(array, geometry):
    """(16, X, T) as (4, 4, X, N, tiles_h, tiles_w)."""
    th, tw = geometry.tiles
    return array.reshape((4, 4, array.shape[1], geometry.image[0], th, tw))


def _chunks(xp, count, body, item_elements, runner):
    for_each_chunk(xp, count, body, item_elements=max(1, item_elements // CHUNK_SCALE),
                   runner=runner)


# -- weight ------------------------------------------------------------------------------
def transform_weight(weight, out):
    """out (16, O, C/group) = G g G^T for each (o, c) of weight (O, C/group, 3, 3)."""
    xp = _xp(weight)
    g = xp.asarray(G, dtype=weight.dtype)
    o, c = weight.shape[:2]
    # G g: (4, O, C, 3), then (G g) G^T: (4, 4, O, C)
    left = xp.matmul(g, weight)                      # (O, C, 4, 3)
    full = xp.matmul(left, g.T)                      # (O, C, 4, 4)
    out.reshape(4, 4, o, c)[...] = full.transpose(2, 3, 0, 1)
    return out


def weight_grad(du, out, overwrite: bool):
    """out (O, C/group, 3, 3) (+)= G^T dU G, dU (16, O, C/group): the adjoint of
    transform_weight; `overwrite` for a lazily cleared diff, else accumulated."""
    xp = _xp(du)
    g = xp.asarray(G, dtype=du.dtype)
    o, c = du.shape[1:]
    full = du.reshape(4, 4, o, c).transpose(2, 3, 0, 1)   # (O, C, 4, 4)
    grad = xp.matmul(xp.matmul(g.T, full), g)             # (O, C, 3, 3)
    if overwrite:
        out[...] = grad
    else:
        out += grad


# -- input transform -----------------------------------------------------------------------
def transform_input(image, geometry, out, runner=None):
    """out (16, C, T) = B^T d B for every 4x4 input tile of image (N, C, H, W), zero padded."""
    xp = _xp(image)
    n, c, h, w = image.shape
    ph, pw = geometry.pad
    hp, wp = geometry.padded
    th, tw = geometry.tiles
    v = _tiled(out, geometry)

    def channels(start, stop):
        d = xp.zeros((n, stop - start, hp, wp), dtype=image.dtype)
        d[:, :, ph:ph + h, pw:pw + w] = image[:, start:stop]
        rows = [d[:, :, k:k + 2 * th:2] for k in range(4)]   # (n, cc, th, Wp) each
        r = xp.empty((4,) + rows[0].shape, dtype=image.dtype)
        xp.subtract(rows[0], rows[2], out=r[0])
        xp.add(rows[1], rows[2], out=r[1])
        xp.subtract(rows[2], rows[1], out=r[2])
        xp.subtract(rows[1], rows[3], out=r[3])
        for i in range(4):
            cols = [r[i][..., k:k + 2 * tw:2] for k in range(4)]
            target = [v[i, j, start:stop].transpose(1, 0, 2, 3) for j in range(4)]
            xp.subtract(cols[0], cols[2], out=target[0])
            xp.add(cols[1], cols[2], out=target[1])
            xp.subtract(cols[2], cols[1], out=target[2])
            xp.subtract(cols[1], cols[3], out=target[3])

    _chunks(xp, c, channels, n * hp * wp * 6, runner)
    return out


def input_grad(dv, geometry, out, runner=None):
    """out (N, C, H, W) = the adjoint of transform_input applied to dV (16, C, T): B dV B^T
    per tile, added onto the overlapping tiles of the padded image, cropped (overwrites)."""
    xp = _xp(dv)
    n, c, h, w = geometry.image
    ph, pw = geometry.pad
    hp, wp = geometry.padded
    th, tw = geometry.tiles
    v = _tiled(dv, geometry)

    def channels(start, stop):
        cc = stop - start
        # Columns first: per tile row i, S_i (cc, n, th, Wp), d_j = sum_k B^T[k, j] dV[i, k].
        s = xp.zeros((4, cc, n, th, wp), dtype=dv.dtype)
        for i in range(4):
            t0, t1, t2, t3 = (v[i, j, start:stop] for j in range(4))
            even, odd = s[i][..., 0::2], s[i][..., 1::2]     # tw + 1 columns each
            even[..., :tw] = t0
            even[..., 1:] += t1
            even[..., 1:] += t2
            even[..., 1:] -= t0
            odd[..., :tw] = t1
            odd[..., :tw] -= t2
            odd[..., :tw] += t3
            odd[..., 1:] -= t3
        # Rows: the same adjoint over the tile rows, into the padded image.
        p = xp.zeros((cc, n, hp, wp), dtype=dv.dtype)
        even, odd = p[:, :, 0::2], p[:, :, 1::2]            # th + 1 rows each
        even[:, :, :th] = s[0]
        even[:, :, 1:] += s[1]
        even[:, :, 1:] += s[2]
        even[:, :, 1:] -= s[0]
        odd[:, :, :th] = s[1]
        odd[:, :, :th] -= s[2]
        odd[:, :, :th] += s[3]
        odd[:, :, 1:] -= s[3]
        out[:, start:stop] = p[:, :, ph:ph + h, pw:pw + w].transpose(1, 0, 2, 3)

    _chunks(xp, c, channels, n * hp * wp * 8, runner)
    return out


# -- output transform ----------------------------------------------------------------------
def transform_output(m, geometry, out, bias=None, runner=None):
    """out (N, O, Ho, Wo) = A^T M A per tile (+ bias (O,)), the partial tiles cropped."""
    xp = _xp(m)
    ho, wo = geometry.out_hw
    n = geometry.image[0]
    th, tw = geometry.tiles
    mt = _tiled(m, geometry)
    o = m.shape[1]

    def outputs(start, stop):
        # Rows: t[a, j] = sum_i A^T[a, i] M[i, j], (oc, n, th, tw) each.
        t = xp.empty((2, 4, stop - start, n, th, tw), dtype=m.dtype)
        for j in range(4):
            m0, m1, m2, m3 = (mt[i, j, start:stop] for i in range(4))
            xp.add(m1, m2, out=t[0, j])
            t[0, j] += m0
            xp.subtract(m1, m2, out=t[1, j])
            t[1, j] -= m3
        y = xp.empty((stop - start, n, th, tw), dtype=m.dtype)
        for a in range(2):
            xp.add(t[a, 1], t[a, 2], out=y)
            y += t[a, 0]
            _put(out, y, a, 0, start, stop, ho, wo, bias)
            xp.subtract(t[a, 1], t[a, 2], out=y)
            y -= t[a, 3]
            _put(out, y, a, 1, start, stop, ho, wo, bias)

    _chunks(xp, o, outputs, n * th * tw * 16, runner)
    return out


def _put(out, y, a, b, start, stop, ho, wo, bias):
    """out[:, start:stop, a::2, b::2] = y (oc, n, th, tw) cropped (+ bias)."""
    rows, cols = (ho - a + 1) // 2, (wo - b + 1) // 2
    target = out[:, start:stop, a::2, b::2]
    source = y[:, :, :rows, :cols].transpose(1, 0, 2, 3)
    if bias is None:
        target[...] = source
    else:
        _xp(out).add(source, bias[start:stop, None, None], out=target)


def output_grad(dy, geometry, out, runner=None):
    """out (16, O, T) = A dY A^T per 2x2 tile of dy (N, O, Ho, Wo): the adjoint of
    transform_output (the positions past the output's edge count as zero)."""
    xp = _xp(dy)
    ho, wo = geometry.out_hw
    n = geometry.image[0]
    th, tw = geometry.tiles
    dm = _tiled(out, geometry)
    o = dy.shape[1]

    def outputs(start, stop):
        z = xp.zeros((stop - start, n, 2 * th, 2 * tw), dtype=dy.dtype)
        z[:, :, :ho, :wo] = dy[:, start:stop].transpose(1, 0, 2, 3)
        # Rows: q[i, b] = sum_a A[i, a] z[a, b], (oc, n, th, tw) each.
        q = xp.empty((4, 2, stop - start, n, th, tw), dtype=dy.dtype)
        for b in range(2):
            y0, y1 = z[:, :, 0::2, b::2], z[:, :, 1::2, b::2]
            q[0, b] = y0
            xp.add(y0, y1, out=q[1, b])
            xp.subtract(y0, y1, out=q[2, b])
            xp.negative(y1, out=q[3, b])
        for i in range(4):
            target = [dm[i, j, start:stop] for j in range(4)]
            target[0][...] = q[i, 0]
            xp.add(q[i, 0], q[i, 1], out=target[1])
            xp.subtract(q[i, 0], q[i, 1], out=target[2])
            xp.negative(q[i, 1], out=target[3])

    _chunks(xp, o, outputs, n * th * tw * 16, runner)
    return out


# -- the 16 GEMMs --------------------------------------------------------------------------
def _grouped(array, group):
    """(16, X, Y) as (16 * group, X / group, Y)."""
    k, x, y = array.shape
    return array.reshape(k * group, x // group, y)


def multiply(u, v, group, out, runner=None):
    """out[k] = U[k] @ V[k] per tile position k and group: (16, O, T)."""
    xp = _xp(u)
    ug = u.reshape(16 * group, u.shape[1] // group, u.shape[2])
    vg, mg = _grouped(v, group), _grouped(out, group)

    def gemms(start, stop):
        xp.matmul(ug[start:stop], vg[start:stop], out=mg[start:stop])

    for_each_gemm(xp, 16 * group, gemms, runner)
    return out


def multiply_weight_grad(dm, v, group, out, runner=None):
    """out[k] = dM[k] @ V[k]^T per tile position and group: dU (16, O, C/group)."""
    xp = _xp(dm)
    dmg, vg = _grouped(dm, group), _grouped(v, group)
    og = out.reshape(16 * group, out.shape[1] // group, out.shape[2])

    def gemms(start, stop):
        xp.matmul(dmg[start:stop], vg[start:stop].transpose(0, 2, 1), out=og[start:stop])

    for_each_gemm(xp, 16 * group, gemms, runner)
    return out


def multiply_input_grad(u, dm, group, out, runner=None):
    """out[k] = U[k]^T @ dM[k] per tile position and group: dV (16, C, T)."""
    xp = _xp(u)
    ug = u.reshape(16 * group, u.shape[1] // group, u.shape[2])
    dmg, dvg = _grouped(dm, group), _grouped(out, group)

    def gemms(start, stop):
        xp.matmul(ug[start:stop].transpose(0, 2, 1), dmg[start:stop], out=dvg[start:stop])

    for_each_gemm(xp, 16 * group, gemms, runner)
    return out


def _xp(array):
    """numpy, or the array's own module (CuPy) where it is not a numpy array."""
    if isinstance(array, np.ndarray):
        return np
    import importlib  # noqa: PLC0415 - only for non-numpy arrays

    return importlib.import_module(type(array).__module__.split(".")[0])
