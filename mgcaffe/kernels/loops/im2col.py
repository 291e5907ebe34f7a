"""im2col and col2im of one sample as compiled loops (numba), for the CPU.

Why: on small planes numpy's strided copy runs one inner loop per output row (16 elements
on a 16x16 plane), so building one sample's columns costs more in loop overhead than in
memory traffic. Compiled, each output row is one loop with the padding test inside, which
numba vectorises as a masked copy (32 us for a CIFAR-10 conv2 sample, 800 x 256).

Layout and sums are `kernels.im2col`'s for a batch of one: the columns of x (C, H, W) are
(C*kh*kw, H_out*W_out), rows ordered c, i, j; col2im overwrites its (C, H, W) output and
sums each cell over the kernel offsets in increasing order, as `im2col.col2im` does, so
the results are bit for bit the same.

`load()` imports numba on first use and returns the compiled functions, or None when numba
cannot be imported. They release the GIL, so the chunk runner's threads run them on
different samples at once.
"""

from __future__ import annotations

import types

from ...cpu import compiled


def _im2col_sample(x, out, kh, kw, ph, pw, sh, sw, dh, dw, out_h, out_w):
    # One loop over each output row with the bounds test inside: numba vectorises it as a
    # masked copy. Loops split at the padding's edges (three short loops a row) measured
    # 4-5x slower on 16-wide rows.
    channels, height, width = x.shape
    row = 0
    for c in range(channels):
        for i in range(kh):
            for j in range(kw):
                target = out[row]
                for y in range(out_h):
                    iy = y * sh - ph + i * dh
                    base = y * out_w
                    if iy < 0 or iy >= height:
                        for k in range(out_w):
                            target[base + k] = 0
                        continue
                    for k in range(out_w):
                        ix = k * sw - pw + j * dw
                        target[base + k] = x[c, iy, ix] if 0 <= ix < width else 0
                row += 1


def _col2im_sample(col, out, kh, kw, ph, pw, sh, sw, dh, dw, out_h, out_w):
    channels, height, width = out.shape
    out[...] = 0
    row = 0
    for c in range(channels):
        for i in range(kh):
            for j in range(kw):
                source = col[row]
                for y in range(out_h):
                    iy = y * sh - ph + i * dh
                    if iy < 0 or iy >= height:
                        continue
                    base = y * out_w
                    for k in range(out_w):
                        ix = k * sw - pw + j * dw
                        if 0 <= ix < width:
                            out[c, iy, ix] += source[base + k]
                row += 1


def _compile(numba) -> types.SimpleNamespace:
    return types.SimpleNamespace(im2col_sample=compiled.jit(numba, _im2col_sample),
                                 col2im_sample=compiled.jit(numba, _col2im_sample))


load = compiled.loader(
    _compile, "The compiled loops (compiled on first call per dtype), or None without numba.")
