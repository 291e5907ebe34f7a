"""Convolution by im2col + GEMM one sample at a time, each sample's columns built, used and
dropped while they are in the cache (numpy, with the compiled per-sample im2col/col2im of
kernels.im2col_loops).

Why: a kxk kernel multiplies the input by kh*kw in the column matrix. On small planes at a
large batch the whole-batch matrix is far larger than the cache (CIFAR-10's conv2, 5x5 on
32x16x16 at batch 100: 82 MB), so im2col writes it to memory, the GEMM reads it back, and
backward does it twice more. One sample's columns (800 KB there) stay in the L2 cache from
im2col to GEMM, and backward rebuilds them per sample (cheaper than reading them back).

The samples are cut into `chunk_count` chunks (a number that depends on the batch size
only), each with its own column buffer and its own partial weight gradient, summed over its
samples in order; the partials are then added in chunk order. So the results are the same
bits on any thread count and under any load. The chunks run on the chunk runner's threads
with one BLAS thread per GEMM (kernels.sample_gemm); with more chunks than threads, a
thread on a core that other work holds takes fewer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .gemm import GemmStack
from .loops import im2col as im2col_loops
from .sample_gemm import for_each_gemm

#: Chunks of a batch (fewer for a smaller batch): their partial weight gradients and column
#: buffers cost CHUNKS times one sample's.
CHUNKS = 16


def available() -> bool:
    """Whether the compiled per-sample loops load (numba importable)."""
    return im2col_loops.load() is not None


@dataclass(frozen=True)
class Geometry:
    """One 2-D convolution's shapes: image (N, C, H, W), output (O, H_out, W_out), groups."""

    image: tuple[int, int, int, int]
    num_output: int
    group: int
    kernel: tuple[int, int]
    pad: tuple[int, int]
    stride: tuple[int, int]
    dilation: tuple[int, int]
    out_hw: tuple[int, int]

    @property
    def rows(self) -> int:
        """Column rows per sample, all groups: C*kh*kw."""
        return self.image[1] * self.kernel[0] * self.kernel[1]

    @property
    def positions(self) -> int:
        return self.out_hw[0] * self.out_hw[1]

    def loop_args(self) -> tuple[int, ...]:
        return (*self.kernel, *self.pad, *self.stride, *self.dilation, *self.out_hw)


def chunk_count(samples: int) -> int:
    """The number of chunks of a batch of `samples`."""
    return max(1, min(samples, CHUNKS))


def chunk_bounds(samples: int, chunks: int, b: int) -> tuple[int, int]:
    """Samples [lo, hi) of chunk b."""
    return b * samples // chunks, (b + 1) * samples // chunks


def columns_shape(geometry: Geometry, chunks: int) -> tuple[int, int, int]:
    """The column buffers: one (C*kh*kw, P) matrix per chunk."""
    return chunks, geometry.rows, geometry.positions


def forward(image, weight3, top, geometry: Geometry, columns, bias=None, runner=None):
    """top (N, O, P) = weight3 (g, O/g, K/g) @ im2col(sample) (+ bias (O,)), sample by
    sample, `columns` (chunks, K, P) as `columns_shape`."""
    loops = im2col_loops.load()
    n, g = geometry.image[0], geometry.group
    chunks, rows, p = columns.shape
    args = geometry.loop_args()
    bias2 = None if bias is None else bias[:, None]

    def body(start, stop):
        for b in range(start, stop):
            cols = columns[b]
            lo, hi = chunk_bounds(n, chunks, b)
            for s in range(lo, hi):
                loops.im2col_sample(image[s], cols, *args)
                out = top[s]
                np.matmul(weight3, cols.reshape(g, rows // g, p), out=out.reshape(g, -1, p))
                if bias2 is not None:
                    np.add(out, bias2, out=out)

    for_each_gemm(np, chunks, body, runner)


def backward(image, top_diff, weight3, geometry: Geometry, columns, partials=None,
             weight_diff=None, overwrite=False, bottom_diff=None, runner=None):
    """Weight gradient and input gradient, sample by sample.

    top_diff (N, O, P). With `weight_diff` (g, O/g, K/g): += (or = with `overwrite`) the sum
    over samples of top_diff[s] @ im2col(sample s)^T, through `partials` (chunks, g, K/g,
    O/g), each chunk's sum formed transposed, as Convolution.add_weight_diff forms its
    product (OpenBLAS's faster orientation for few output rows; CIFAR-10 conv1's weight
    gradient, 100 samples: 5.5 ms against 7.1 untransposed).
    With `bottom_diff` (N, C, H, W): overwritten with col2im(weight3^T @ top_diff[s])."""
    loops = im2col_loops.load()
    n, g = geometry.image[0], geometry.group
    chunks, rows, p = columns.shape
    rg, og = rows // g, weight3.shape[1]
    args = geometry.loop_args()
    weight_t = weight3.transpose(0, 2, 1)
    want_weight = weight_diff is not None
    if n == 0:  # an empty batch: no samples to sum (a lazily cleared diff reads 0)
        if want_weight and overwrite:
            weight_diff[...] = 0
        return

    # partials[b, k] (+)= columns[b, k] @ top_diff[s, k]^T: one stack, checked once.
    weight_gemm = GemmStack(columns.reshape(chunks, g, rg, p),
                            top_diff.reshape(n, g, og, p).transpose(0, 1, 3, 2),
                            partials) if want_weight else None

    def body(start, stop):
        for b in range(start, stop):
            cols = columns[b]
            cols3 = cols.reshape(g, rg, p)
            lo, hi = chunk_bounds(n, chunks, b)
            for s in range(lo, hi):
                dy = top_diff[s].reshape(g, og, p)
                if want_weight:
                    loops.im2col_sample(image[s], cols, *args)
                    for k in range(g):
                        weight_gemm((b, k), (s, k), (b, k), s == lo)
                if bottom_diff is not None:
                    np.matmul(weight_t, dy, out=cols3)
                    loops.col2im_sample(cols, bottom_diff[s], *args)

    for_each_gemm(np, chunks, body, runner)
    if want_weight:
        total = partials.sum(axis=0).transpose(0, 2, 1)
        if overwrite:
            weight_diff[...] = total
        else:
            weight_diff += total
