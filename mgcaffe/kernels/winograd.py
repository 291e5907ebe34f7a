"""Winograd F(2x2, 3x3) and F(4x4, 3x3) convolution for 3x3, stride-1, dilation-1 kernels (any
pad, groups).

The output is cut into 2x2 tiles; each needs a 4x4 input tile (tiles overlap by 2 rows and
columns, zero padding past the edges; an odd output size leaves a partial last tile whose
extra row or column is computed and dropped). With B^T, G, A^T the F(2x2, 3x3) matrices:

    U = G g G^T            the weight, 4x4 per (output, input) channel pair
    V = B^T d B            each input tile, 4x4 per channel
    M[k] = U[k] @ V[k]     for each of the 16 tile positions k: (O x C) @ (C x tiles)
    Y = A^T M A            each 2x2 output tile

so the multiplications are 16 GEMMs with 16*O*C*tiles = 4*O*C*N*H*W multiply-adds against
im2col's 9*O*C*N*H*W (2.25x fewer). Backward uses the adjoints: dM = A dY A^T per tile,
dU[k] = sum over tiles of dM[k] V[k]^T then dg = G^T dU G, and dV[k] = U[k]^T dM[k] then
dd = B dV B^T added back onto the overlapping tiles (col2im) and cropped by the pad.

Where numba is importable (COMPILED), the four tile transforms (V, Y, dM and B dV B^T onto
the image) run as compiled loops per (sample, channel) plane instead (kernels.winograd_loops:
one pass from the cache, no tile columns, padded copy or crop); otherwise, as follows.
Each transform is itself a small GEMM: the 4x4 input tiles come from im2col (kernel 4,
stride 2) on the padded image, V = kron(B^T, B^T) (16 x 16) times each channel's 16 tile
rows, Y = kron(A^T, A^T) (4 x 16) times M, U = kron(G, G) (16 x 9) times the weight; the
adjoints use the transposes and col2im. numpy's element-wise operations over the strided
tile views ran 3-5x slower than these BLAS calls on the same data (measured on GoogleNet's
conv2/3x3).

Layouts (P = tiles_h * tiles_w tiles per sample, ordered tile row then column): V kept
for backward (C, 16, N, P) (4x the input for even sizes; im2col's columns are 9x); the
per-call temporaries M and dM (16, O, N, P), Y and the gathered dY tiles (4, O, N, P), the
tile columns (N, C*16, P), the padded image (N, C, Hp, Wp). The transforms read or write
a tile's 16 positions together, 16 streams, so the slabs along a tile-position axis (the
rows of V, and M, dM, dV) start a few cache lines off a multiple of the page
(`slab_stride`): slabs a whole number of pages apart (as O*N*P float32 is whenever O*P is a
multiple of 128) put the 16 streams in the same cache sets, and on conv2/3x3 the output
gradient's transform ran 2.2x as long. The input
transform runs sample by sample, the output transforms over blocks of output channels, the
16 * group GEMMs of a pass one per task (the weight gradient's each a single GEMM over all
the batch's tiles), all handed to the runner's threads with one BLAS thread each
(kernels.sample_gemm), so the results do not depend on the thread count. Forward on large
planes runs whole samples instead (PER_SAMPLE_FROM), each sample's M used while it is in
the cache.

Rounding: the transforms add and subtract up to 16 (input), 9 (output) and 9 (weight, in
halves and quarters) terms, so float32 results differ from a direct convolution's by a few
units in the last place of the largest terms (tests bound it).

F(4x4, 3x3) (`Geometry.tile` 4; the compiled transforms only, kernels.winograd4_loops): the
same passes with 6x6 input tiles at a stride of 4, 4x4 output tiles and 36 tile positions
where F(2x2) has 16 (every "16" above), U = kron(G4, G4) (36 x 9) times the weight. The
GEMMs have 36*O*C*N*H*W/16 = 2.25*O*C*N*H*W multiply-adds (against F(2x2)'s 4 and a direct
convolution's 9) and V, M, dM and dV are 36/16 of the input or output instead of 4x. Its
transforms have six terms with coefficients up to 8 and its weight transform divides by 24,
so its float32 error is about 20x F(2x2)'s (9e-6 of the output's scale on
inception_3a/3x3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .gemm import GemmStack, gemm_accumulate
from .im2col import col2im, im2col, padded_copy
from .loops import winograd as winograd_loops
from .loops import winograd4 as winograd4_loops
from .sample_gemm import for_each_gemm

#: The F(2x2, 3x3) matrices: input B^T (4x4), weight G (4x3), output A^T (2x4).
BT = np.array([[1.0, 0.0, -1.0, 0.0], [0.0, 1.0, 1.0, 0.0], [0.0, -1.0, 1.0, 0.0],
               [0.0, 1.0, 0.0, -1.0]])
G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])
AT = np.array([[1.0, 1.0, 1.0, 0.0], [0.0, 1.0, -1.0, -1.0]])
#: The same as matrices on flattened tiles: tile[4i + j] (row-major), e.g.
#: U[4i + j] = sum over (r, s) of G[i, r] G[j, s] g[3r + s].
KRON_IN = np.kron(BT, BT)      # 16 x 16
KRON_WEIGHT = np.kron(G, G)    # 16 x 9
KRON_OUT = np.kron(AT, AT)     # 4 x 16
#: F(4x4, 3x3)'s weight matrix G (6x3) (its B^T and A^T: kernels.winograd4_loops), and
#: kron(G4, G4) (36 x 9): U for 6x6 tiles.
G4 = np.array([[1 / 4, 0.0, 0.0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
               [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0.0, 0.0, 1.0]])
KRON_WEIGHT4 = np.kron(G4, G4)


def applies(kernel, stride, dilation) -> bool:
    """Whether a 2-D convolution's geometry is one this module computes."""
    return tuple(kernel) == (3, 3) and tuple(stride) == (1, 1) and tuple(dilation) == (1, 1)


def slab_stride(elements: int) -> int:
    """Elements from one slab's start to the next for slabs of `elements`: whole float32
    cache lines (16 elements), as few more as make 16 slabs' starts fall in 16 different
    sets of the caches (lines apart, a multiple of at most 4 of the 64 sets of a 4 KB
    way)."""
    lines = -(-elements // 16)
    while math.gcd(lines, 64) > 4:
        lines += 1
    return 16 * lines


def _slabs(memory, shape):
    """A view of 1-D `memory` as `shape`, its leading axis's steps `slab_stride` apart."""
    count, rest = shape[0], int(np.prod(shape[1:]))
    stride = slab_stride(rest)
    return memory[:count * stride].reshape(count, stride)[:, :rest].reshape(shape)


@dataclass(frozen=True)
class Geometry:
    """One Winograd layer: image (N, C, H, W), pad (ph, pw), O outputs, groups."""

    image: tuple
    pad: tuple
    num_output: int
    group: int
    #: The output tile's side: 2 for F(2x2, 3x3), 4 for F(4x4, 3x3) (compiled loops only).
    tile: int = 2

    @property
    def positions(self):
        """Tile positions: (tile + 2)^2 values per input tile (16, or 36)."""
        return (self.tile + 2) ** 2

    @property
    def out_hw(self):
        _, _, h, w = self.image
        return h + 2 * self.pad[0] - 2, w + 2 * self.pad[1] - 2

    @property
    def tiles(self):
        """(tiles_h, tiles_w): output tiles per sample, the last partial where the output
        size is not a multiple of the tile."""
        ho, wo = self.out_hw
        return -(-ho // self.tile), -(-wo // self.tile)

    @property
    def per_sample(self):
        """P: tiles per sample."""
        th, tw = self.tiles
        return th * tw

    @property
    def padded(self):
        """(N, C, Hp, Wp): the zero-padded image the tiles read (H + 2*pad, plus one row or
        column where the output size is odd)."""
        th, tw = self.tiles
        return self.image[:2] + (self.tile * th + 2, self.tile * tw + 2)

    def input_shape(self):
        """V, kept from forward to backward: (C, 16, N, P) (36 for F(4x4))."""
        return (self.image[1], self.positions, self.image[0], self.per_sample)

    def input_elements(self):
        """The length of the 1-D memory that holds V and then, in backward, dV (16, C, N, P),
        each in slabs (`input_view`, `tile_grad_view`)."""
        n, c, p, k = self.image[0], self.image[1], self.per_sample, self.positions
        return max(c * k * slab_stride(n * p), k * slab_stride(c * n * p))

    def input_view(self, memory):
        """V (C, 16, N, P), its (channel, tile position) rows in slabs, in `memory`
        (input_elements long)."""
        n, c, p = self.image[0], self.image[1], self.per_sample
        return _slabs(memory, (c * self.positions, n, p)).reshape(self.input_shape())

    def tile_grad_view(self, memory):
        """dV (16, C, N, P), in slabs, in V's `memory`."""
        n, c = self.image[:2]
        return _slabs(memory, (self.positions, c, n, self.per_sample))

    def columns_shape(self):
        """The tile columns (and dV): (N, C*16, P)."""
        return (self.image[0], self.image[1] * self.positions, self.per_sample)

    def product_shape(self):
        """M and dM: (16, O, N, P)."""
        return (self.positions, self.num_output, self.image[0], self.per_sample)

    def product_elements(self):
        """The length of the 1-D memory for M or dM: in slabs (16, O, N, P)
        (`product_view`) or, for the forward by samples, (N, 16, O, P) (`sample_product_view`)."""
        n, o, p, k = self.image[0], self.num_output, self.per_sample, self.positions
        return max(k * slab_stride(o * n * p), n * k * slab_stride(o * p))

    def product_view(self, memory):
        """M or dM (16, O, N, P), in slabs, in `memory` (product_elements long)."""
        return _slabs(memory, self.product_shape())

    def sample_product_view(self, memory):
        """M (N, 16, O, P), each sample's 16 in slabs, in `memory`."""
        n, o, p, k = self.image[0], self.num_output, self.per_sample, self.positions
        return _slabs(memory, (n * k, o, p)).reshape(n, k, o, p)

    def output_tiles_shape(self):
        """Y and the gathered dY tiles: (4, O, N, P)."""
        return (4, self.num_output, self.image[0], self.per_sample)

    def weight_shape(self):
        """U and dU: (16, O, C/group)."""
        return (self.positions, self.num_output, self.image[1] // self.group)


#: The tile transforms as compiled loops (kernels.winograd_loops, winograd4_loops) where
#: numba is importable (True), else, or with False, as the GEMMs over im2col/col2im tile
#: columns below (F(2x2) only).
COMPILED = True


def _loops(tile: int = 2):
    """The compiled transforms for F(tile x tile, 3x3), or None."""
    if not COMPILED:
        return None
    return (winograd_loops if tile == 2 else winograd4_loops).load()


def compiled(tile: int = 2) -> bool:
    """Whether the passes run their transforms as compiled loops (for F(tile x tile))."""
    return _loops(tile) is not None


def _constant(matrix, dtype):
    return np.asarray(matrix, dtype=dtype)


# -- weight ------------------------------------------------------------------------------
def _kron_weight(positions):
    return KRON_WEIGHT if positions == 16 else KRON_WEIGHT4


def transform_weight(weight, out):
    """out (16, O, C/group) = G g G^T for each (o, c) of weight (O, C/group, 3, 3)."""
    o, c = weight.shape[:2]
    np.matmul(_constant(_kron_weight(out.shape[0]), weight.dtype), weight.reshape(o * c, 9).T,
              out=out.reshape(out.shape[0], o * c))
    return out


def weight_grad(du, out, overwrite: bool):
    """out (O, C/group, 3, 3) (+)= G^T dU G for dU (16, O, C/group): transform_weight's
    adjoint; `overwrite` for a lazily cleared diff, else accumulated (as Caffe does)."""
    o, c = du.shape[1:]
    grad = out.reshape(o * c, 9)
    gemm_accumulate(du.reshape(du.shape[0], o * c).T, _constant(_kron_weight(du.shape[0]),
                                                                du.dtype), grad, None,
                    overwrite)


# -- per-sample stages ---------------------------------------------------------------------
def _fallback_buffers(geometry, buffers):
    """The temporaries only the GEMM transforms use: the padded image and the tile columns
    (None, None when the compiled loops run). Asked for by the caller's thread, before the
    runner's threads start."""
    if _loops(geometry.tile) is not None:
        return None, None
    return buffers("padded", geometry.padded), buffers("columns", geometry.columns_shape())


def _input_sample(image, geometry, padded, columns, v, s):
    """V[:, :, s] (C, 16, P) = B^T d B for sample s's tiles (the fallback: im2col's 4x4/2
    tiles of the padded image, times kron(B^T, B^T))."""
    c = geometry.image[1]
    loops = _loops(geometry.tile)
    if loops is not None:
        loops.input_tiles(image, v, s, s + 1, 0, c, *geometry.pad, *geometry.tiles,
                          image.dtype.type(0))
        return
    padded_copy(image, geometry.pad, padded, s, s + 1)
    im2col(padded[s:s + 1], (4, 4), (0, 0), (2, 2), (1, 1), out=columns[s])
    np.matmul(_constant(KRON_IN, v.dtype), columns[s].reshape(c, 16, -1), out=v[:, :, s])


def _put_output(y, geometry, top, bias):
    """top (N, O', Ho, Wo) = the 2x2 tiles y (4, O', N, P), cropped (+ bias (O', 1, 1))."""
    ho, wo = geometry.out_hw
    th, tw = geometry.tiles
    o, n = y.shape[1:3]
    for a in range(2):
        for b in range(2):
            rows, cols = (ho - a + 1) // 2, (wo - b + 1) // 2
            source = y[2 * a + b].reshape(o, n, th, tw)[:, :, :rows, :cols]
            source = source.transpose(1, 0, 2, 3)
            target = top[:, :, a::2, b::2]
            if bias is None:
                target[...] = source
            else:
                np.add(source, bias, out=target)


def _gather_output_grad(dy, geometry, tiles):
    """tiles (4, O', N, P) = dy (N, O', Ho, Wo) as 2x2 tiles, zero past the output's edge."""
    ho, wo = geometry.out_hw
    th, tw = geometry.tiles
    o, n = tiles.shape[1:3]
    for a in range(2):
        for b in range(2):
            rows, cols = (ho - a + 1) // 2, (wo - b + 1) // 2
            target = tiles[2 * a + b].reshape(o, n, th, tw)
            target[:, :, :rows, :cols] = dy[:, :, a::2, b::2].transpose(1, 0, 2, 3)
            target[:, :, rows:] = 0
            target[:, :, :rows, cols:] = 0


# -- the passes ----------------------------------------------------------------------------
def _groups(array, axis: int, group: int):
    """A 3-D view with `axis` (0 or 1) cut into `group` equal parts as a new axis before it:
    (A, B, X) -> (group, A/group, B, X) or (A, group, B/group, X); a view, no copy."""
    shape = array.shape
    cut = shape[:axis] + (group, shape[axis] // group) + shape[axis + 1:]
    strides = array.strides
    cut_strides = (strides[:axis] + (strides[axis] * (shape[axis] // group), strides[axis])
                   + strides[axis + 1:])
    return np.lib.stride_tricks.as_strided(array, cut, cut_strides)


def _gemm_tasks(geometry):
    """(k, group) for each of the positions * group GEMMs of a pass."""
    return [divmod(task, geometry.group) for task in range(geometry.positions * geometry.group)]


#: The 16 * group GEMMs of a whole-batch pass: split over the runner's threads, one BLAS
#: thread each (True), or one after another on the BLAS's own threads (False). Measured
#: (2 cores, fwd+bwd of one layer, split / BLAS threads): 0.9-1.25 while the machine was
#: quiet, but with other processes running the BLAS's threads stalled (inception_3a/3x3
#: 322 ms against 83 split; 14x14 layers 140-150 ms against 25-40).
SPLIT_GEMMS = True


def _sixteen_gemms(geometry, body, runner):
    count = geometry.positions * geometry.group
    if SPLIT_GEMMS:
        for_each_gemm(np, count, body, runner)
    else:
        body(0, count)


def _by_output(count, body, runner):
    """body(start, stop) over output-channel chunks on the runner (one BLAS thread each)."""
    for_each_gemm(np, count, body, runner, grain=max(1, -(-count // 8)))


#: Forward runs sample by sample from this many output positions per sample (56x56
#: planes: 3136), else as whole-batch GEMMs: F(2x2)'s GEMMs of 49 columns (14x14) ran
#: slower than of 392 (batch 8).
PER_SAMPLE_FROM = 1024


def forward(image, u, geometry, v, buffers, top, bias=None, runner=None):
    """top (N, O, Ho, Wo) = the convolution of image (N, C, H, W) by the transformed weight
    u (16, O, C/group) (+ bias (O,)); fills V for backward into `v` (1-D, of
    geometry.input_elements). `buffers(name, shape)` gives the temporaries ("padded",
    "columns", "product", "tiles")."""
    if geometry.per_sample * geometry.tile ** 2 >= PER_SAMPLE_FROM:
        _forward_per_sample(image, u, geometry, v, buffers, top, bias, runner)
        return
    fill_input(image, geometry, v, buffers, runner)
    v = geometry.input_view(v)
    m = geometry.product_view(buffers("product", (geometry.product_elements(),)))
    k16 = geometry.positions
    vk = v.reshape(v.shape[0], k16, -1)                     # (C, 16, N*P)
    mk = m.reshape(k16, geometry.num_output, -1)           # (16, O, N*P)

    g = geometry.group
    # mk[k, group j] = u[k, group j] @ vk[group j, k]: one stack of slices, checked once.
    stack = GemmStack(_groups(u, 1, g), _groups(vk, 0, g).transpose(2, 0, 1, 3),
                      _groups(mk, 1, g))

    def gemms(start, stop):
        for k, j in _gemm_tasks(geometry)[start:stop]:
            stack((k, j), (k, j), (k, j), True)

    _sixteen_gemms(geometry, gemms, runner)
    loops = _loops(geometry.tile)
    y = None if loops else buffers("tiles", geometry.output_tiles_shape())
    kron_out = _constant(KRON_OUT, image.dtype)

    def outputs(start, stop):
        if loops is not None:
            loops.output_tiles(m, top, bias if bias is not None else m[0, 0, 0],
                               bias is not None, 0, geometry.image[0], start, stop,
                               geometry.tiles[1])
            return
        np.matmul(kron_out, mk[:, start:stop].reshape(16, -1),
                  out=y[:, start:stop].reshape(4, -1))
        _put_output(y[:, start:stop], geometry, top[:, start:stop],
                    None if bias is None else bias[start:stop, None, None])

    _by_output(geometry.num_output, outputs, runner)


def _forward_per_sample(image, u, geometry, v, buffers, top, bias, runner):
    """forward sample by sample (each on one runner thread): V, the 16 GEMMs, the output
    transform and the crop, so that each sample's M is still in the cache when it is
    transformed (on conv2/3x3 whole-batch GEMMs and then one output transform over all of M
    took 1.35x as long)."""
    padded, columns = _fallback_buffers(geometry, buffers)
    n, o, p = geometry.image[0], geometry.num_output, geometry.per_sample
    g = geometry.group
    v = geometry.input_view(v)
    m = geometry.sample_product_view(buffers("product", (geometry.product_elements(),)))
    loops = _loops(geometry.tile)
    y = None if loops else buffers("tiles", geometry.output_tiles_shape()).reshape(n, 4, o, p)
    k16 = geometry.positions
    ug = u.reshape(k16, g, o // g, u.shape[2])
    kron_out = _constant(KRON_OUT, image.dtype)
    bias3 = None if bias is None else bias[:, None, None]
    m4 = m.transpose(1, 2, 0, 3)                                    # (16, O, N, P) view

    def samples(start, stop):
        for s in range(start, stop):
            _input_sample(image, geometry, padded, columns, v, s)
            vs = v[:, :, s].transpose(1, 0, 2)                     # (16, C, P)
            np.matmul(ug, vs.reshape(k16, g, -1, p), out=m[s].reshape(k16, g, -1, p))
            if loops is not None:
                loops.output_tiles(m4, top, bias if bias is not None else m4[0, 0, 0],
                                   bias is not None, s, s + 1, 0, o, geometry.tiles[1])
                continue
            np.matmul(kron_out, m[s].reshape(16, -1), out=y[s].reshape(4, -1))
            _put_output(y[s][:, :, None], geometry, top[s:s + 1], bias3)

    for_each_gemm(np, n, samples, runner)


def fill_input(image, geometry, v, buffers, runner=None):
    """V (C, 16, N, P) = B^T d B for every tile of image, into `v` (1-D, of
    geometry.input_elements; kept for backward)."""
    padded, columns = _fallback_buffers(geometry, buffers)
    v = geometry.input_view(v)

    def samples(start, stop):
        for s in range(start, stop):
            _input_sample(image, geometry, padded, columns, v, s)

    for_each_gemm(np, geometry.image[0], samples, runner)


def output_grad(dy, geometry, buffers, runner=None):
    """dM (16, O, N, P) = A dY A^T per output tile of dy (N, O, Ho, Wo) (buffer
    "product")."""
    loops = _loops(geometry.tile)
    tiles = None if loops else buffers("tiles", geometry.output_tiles_shape())
    dm = geometry.product_view(buffers("product", (geometry.product_elements(),)))
    kron_out_t = _constant(KRON_OUT, dy.dtype).T
    mk = dm.reshape(geometry.positions, geometry.num_output, -1)

    def outputs(start, stop):
        if loops is not None:
            loops.output_grad_tiles(dy, dm, 0, geometry.image[0], start, stop,
                                    geometry.tiles[1], dy.dtype.type(0))
            return
        _gather_output_grad(dy[:, start:stop], geometry, tiles[:, start:stop])
        np.matmul(kron_out_t, tiles[:, start:stop].reshape(4, -1),
                  out=mk[:, start:stop].reshape(16, -1))

    _by_output(geometry.num_output, outputs, runner)
    return dm


def transformed_weight_grad(dm, v, geometry, du, runner=None):
    """du (16, O, C/group) = dM[k] @ V[:, k]^T over all the tiles of the batch, per tile
    position k and group: one GEMM per (k, group), each on one BLAS thread. `v` is V's 1-D
    memory."""
    v = geometry.input_view(v)
    vk = v.reshape(v.shape[0], geometry.positions, -1)
    mk = dm.reshape(geometry.positions, geometry.num_output, -1)

    g = geometry.group
    # du[k, group j] = mk[k, group j] @ vk[group j, k]^T
    stack = GemmStack(_groups(mk, 1, g), _groups(vk, 0, g).transpose(2, 0, 3, 1),
                      _groups(du, 1, g))

    def gemms(start, stop):
        for k, j in _gemm_tasks(geometry)[start:stop]:
            stack((k, j), (k, j), (k, j), True)

    _sixteen_gemms(geometry, gemms, runner)
    return du


def input_grad(dm, u, geometry, v, buffers, out, runner=None):
    """out (N, C, H, W) = the input gradient from dM and u (overwritten); V's 1-D memory `v`
    takes dV (16, C, N, P) on the way (its V is lost)."""
    c = geometry.image[1]
    mk = dm.reshape(geometry.positions, geometry.num_output, -1)
    dv4 = geometry.tile_grad_view(v)
    dv = dv4.reshape(geometry.positions, c, -1)

    g = geometry.group
    # dv[k, group j] = u[k, group j]^T @ mk[k, group j]
    stack = GemmStack(_groups(u, 1, g).transpose(0, 1, 3, 2), _groups(mk, 1, g),
                      _groups(dv, 1, g))

    def gemms(start, stop):
        for k, j in _gemm_tasks(geometry)[start:stop]:
            stack((k, j), (k, j), (k, j), True)

    _sixteen_gemms(geometry, gemms, runner)
    padded, columns = _fallback_buffers(geometry, buffers)
    _, _, h, w = geometry.image
    ph, pw = geometry.pad
    kron_in_t = _constant(KRON_IN, dm.dtype).T
    loops = _loops(geometry.tile)

    def samples(start, stop):
        if loops is not None:
            loops.input_grad_tiles(dv4, out, start, stop, 0, c, ph, pw, *geometry.tiles,
                                   out.dtype.type(0))
            return
        for s in range(start, stop):
            # Per channel the 16 tile rows d = B dV B^T, in im2col's layout, then col2im.
            np.matmul(kron_in_t, dv4[:, :, s].transpose(1, 0, 2),
                      out=columns[s].reshape(c, 16, -1))
            col2im(columns[s], (1,) + geometry.padded[1:], (4, 4), (0, 0), (2, 2), (1, 1),
                   out=padded[s:s + 1])
            out[s] = padded[s, :, ph:ph + h, pw:pw + w]

    for_each_gemm(np, geometry.image[0], samples, runner)
    return out
