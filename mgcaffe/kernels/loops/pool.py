"""MAX and AVE pooling as compiled loops (numba), one output at a time, for the CPU.

Why: the numpy formulations of pooling (`kernels.windows`: one ufunc pass per kernel offset,
winner tags by small-int arithmetic, backward by np.add.at) make 4-5 passes over the whole
input per offset. A loop per output reads each input cell a few times from the L1 cache,
keeps the running maximum in a register and scatters the backward in output order with no
index arrays.

Semantics are Caffe's, bit for bit the same as the layer's numpy path (tests compare them):
- MAX scans the window clipped to the input in row-major order and keeps a cell only when it
  is strictly greater than the best so far (so the first maximum wins and NaN never does),
  starting from `lowest` (-FLT_MAX); the winner tag is 1 + the kernel offset i*kw + j of the
  winner (0: the window read no cell, or only -inf/NaN), the mask the flat index h*W + w of
  the winner in its plane as a float (-1 for none).
- MAX backward overwrites the bottom diff: zero, then each top diff added at its winner, the
  outputs in order (Caffe's order, so ties and overlaps sum the same).
- AVE sums the window clipped to the input in row-major order, from 0 in the blob's type,
  and multiplies by the layer's 1/area table; backward gathers, per input cell, the outputs
  whose window holds it in increasing kernel-offset order (the numpy path's order), each
  top diff times its 1/area.

Every function works on planes [p0, p1) of (planes, H, W) arrays, so the layer's chunk
runner calls it from several threads on disjoint planes (`nogil`: they run in parallel).

`load()` imports numba on first use and returns the compiled functions, or None when numba
cannot be imported (the layer then keeps its numpy path). The on-disk cache (`cache=True`)
saves the compilation in later processes; where no cache directory is writable, the
functions compile in memory in each process instead.
"""

from __future__ import annotations

import functools
import types

import numpy as np

from ...cpu import compiled

#: Grid cells per block of planes: a block's phases and running results stay in the L2 cache
#: across the kernel offsets.
BLOCK_CELLS = 1 << 13
#: Cells per run of the offset passes inside a block: the running results stay in L1.
RUN_CELLS = 1 << 11


def _layout(out_h, out_w, kh, kw, sh, sw, planes):
    """Per plane a (hq, wq) grid of each stride phase (as `kernels.windows`): phase (a, b),
    cell (u, v) holds padded cell (u*sh + a, v*sw + b), and output (oy, ox) at kernel offset
    (i, j) reads phase (i % sh, j % sw) at grid cell (oy + i // sh, ox + j // sw): its own
    flat grid index plus a shift, so that each offset is one contiguous pass over the grids
    of a block of planes (vectorised loads; cells past (out_h, out_w) are junk outputs).
    Returns (hq, wq, planes per block, cells per block, largest shift)."""
    hq, wq = out_h + (kh - 1) // sh, out_w + (kw - 1) // sw
    block = max(1, min(planes, BLOCK_CELLS // (hq * wq)))
    return hq, wq, block, block * hq * wq, ((kh - 1) // sh) * wq + (kw - 1) // sw


def _columns(sw, pw, phase, cols):
    """(first input column, its grid column, how many) of column phase `phase`."""
    first = (phase - pw) % sw
    return first, (first + pw) // sw, max(0, (cols - first + sw - 1) // sw)


def _load(phases, x, p, count, hq, wq, sh, sw, ph, pw):
    """Planes [p, p + count) into the phases of a block; cells outside the input keep the
    value they were given (padding) and those the windows never reach are not copied."""
    # Inner loops index with the bare loop counter (of a view made per row): with any other
    # index the compiler keeps a negative-index check per element and does not vectorise.
    rows, cols = min(x.shape[1], hq * sh - ph), min(x.shape[2], wq * sw - pw)
    for k in range(count):
        for y in range(rows):
            a, u = (y + ph) % sh, (y + ph) // sh
            at = (k * hq + u) * wq
            if sw == 1:
                dst, src = phases[a, at + pw:at + pw + cols], x[p + k, y, :cols]
                for m in range(cols):
                    dst[m] = src[m]
                continue
            if sw == 2:
                # Both phases in one loop: the even and odd columns are one interleaved
                # load group, which the compiler vectorises (a strided loop alone is not).
                even, odd = a * 2 + pw % 2, a * 2 + (pw + 1) % 2
                at_even, at_odd = at + pw // 2, at + (pw + 1) // 2
                for m in range(cols // 2):
                    phases[even, at_even + m] = x[p + k, y, 2 * m]
                    phases[odd, at_odd + m] = x[p + k, y, 2 * m + 1]
                if cols % 2:
                    phases[even, at_even + cols // 2] = x[p + k, y, cols - 1]
                continue
            for b in range(sw):
                first, start, n = _columns(sw, pw, b, cols)
                for m in range(n):
                    phases[a * sw + b, at + start + m] = x[p + k, y, first + m * sw]


def _unload(phases, out, p, count, hq, wq, sh, sw, ph, pw):
    """The reverse of `_load`; input cells the windows never reach get 0."""
    height, width = out.shape[1], out.shape[2]
    rows, cols = min(height, hq * sh - ph), min(width, wq * sw - pw)
    for k in range(count):
        for y in range(height):
            if y >= rows:
                for xx in range(width):
                    out[p + k, y, xx] = 0
                continue
            a, u = (y + ph) % sh, (y + ph) // sh
            at = (k * hq + u) * wq
            if sw == 1:
                dst, src = out[p + k, y, :cols], phases[a, at + pw:at + pw + cols]
                for m in range(cols):
                    dst[m] = src[m]
            elif sw == 2:
                even, odd = a * 2 + pw % 2, a * 2 + (pw + 1) % 2
                at_even, at_odd = at + pw // 2, at + (pw + 1) // 2
                for m in range(cols // 2):
                    out[p + k, y, 2 * m] = phases[even, at_even + m]
                    out[p + k, y, 2 * m + 1] = phases[odd, at_odd + m]
                if cols % 2:
                    out[p + k, y, cols - 1] = phases[even, at_even + cols // 2]
            else:
                for b in range(sw):
                    first, start, n = _columns(sw, pw, b, cols)
                    for m in range(n):
                        out[p + k, y, first + m * sw] = phases[a * sw + b, at + start + m]
            for xx in range(cols, width):
                out[p + k, y, xx] = 0


def _max_offsets(phases, best, tags, cells, kh, kw, sh, sw, wq, lowest):
    """Running maxima and tags of grid cells [0, cells) over the kernel offsets."""
    best[:cells] = lowest
    tags[:cells] = 0
    # Offsets in row-major order: a later one wins only when strictly greater, so the
    # first maximum stays (and NaN, never greater, never wins). Over L1-sized runs of
    # cells, so the running maxima and tags stay in the L1 cache across the offsets.
    # (Slices, not 2-D indexing: with an index that might be negative the loop is not
    # vectorised; each view costs atomic reference counts, so they are made per run.)
    for lo in range(0, cells, RUN_CELLS):
        hi = min(lo + RUN_CELLS, cells)
        run_best, run_tags = best[lo:hi], tags[lo:hi]
        for i in range(kh):
            for j in range(kw):
                tag = i * kw + j + 1
                at = lo + (i // sh) * wq + j // sw
                src = phases[(i % sh) * sw + j % sw, at:at + hi - lo]
                for q in range(hi - lo):
                    v = src[q]
                    b = run_best[q]
                    greater = v > b
                    run_best[q] = v if greater else b
                    run_tags[q] = tag if greater else run_tags[q]


def _max_rows_then_columns(phases, best, tags, row_best, row_col, cells, kh, kw, sw, wq,
                           lowest):
    """`_max_offsets` for stride 1 down the rows, separably: per grid cell the first
    strictly greater maximum over the kw columns of its row, then per output the first of
    its kh rows strictly greater. That is the first maximum in row-major window order (the
    first row holding the maximum, the first column in it), which the offsets find; each
    row's maxima serve kh outputs (kw + kh passes instead of kh * kw)."""
    rows = cells + (kh - 1) * wq  # the rows of the last plane's lowest outputs too
    for lo in range(0, rows, RUN_CELLS):
        hi = min(lo + RUN_CELLS, rows)
        run_best, run_col = row_best[lo:hi], row_col[lo:hi]
        run_best[:] = lowest
        run_col[:] = -1
        for j in range(kw):
            src = phases[j % sw, lo + j // sw:lo + j // sw + hi - lo]
            for q in range(hi - lo):
                v = src[q]
                b = run_best[q]
                greater = v > b
                run_best[q] = v if greater else b
                run_col[q] = j if greater else run_col[q]
    for lo in range(0, cells, RUN_CELLS):
        hi = min(lo + RUN_CELLS, cells)
        run_best, run_tags = best[lo:hi], tags[lo:hi]
        run_best[:] = lowest
        run_tags[:] = 0
        for i in range(kh):
            src = row_best[lo + i * wq:lo + i * wq + hi - lo]
            col = row_col[lo + i * wq:lo + i * wq + hi - lo]
            for q in range(hi - lo):
                v = src[q]
                b = run_best[q]
                greater = v > b
                run_best[q] = v if greater else b
                run_tags[q] = i * kw + col[q] + 1 if greater else run_tags[q]


def _max_forward(x, top, winner, mask, p0, p1, kh, kw, sh, sw, ph, pw, lowest, want_mask,
                 separable):
    width = x.shape[2]
    out_h, out_w = top.shape[1], top.shape[2]
    hq, wq, block, cells, shift_max = _layout(out_h, out_w, kh, kw, sh, sw, p1 - p0)
    # Padding holds -inf: never strictly greater than the running maximum (from -FLT_MAX).
    phases = np.full((sh * sw, cells + shift_max), -np.inf, dtype=x.dtype)
    best = np.empty(cells, dtype=x.dtype)
    tags = np.empty(cells, dtype=np.int32)
    separable = separable and sh == 1 and kh > 1
    if separable:  # row maxima and their columns, for every grid row the windows read
        row_best = np.empty(cells + (kh - 1) * wq, dtype=x.dtype)
        row_col = np.empty(cells + (kh - 1) * wq, dtype=np.int32)
    for p in range(p0, p1, block):
        count = min(block, p1 - p)
        _load(phases, x, p, count, hq, wq, sh, sw, ph, pw)
        if separable:
            _max_rows_then_columns(phases, best, tags, row_best, row_col, count * hq * wq,
                                   kh, kw, sw, wq, lowest)
        else:
            _max_offsets(phases, best, tags, count * hq * wq, kh, kw, sh, sw, wq, lowest)
        for k in range(count):
            for oy in range(out_h):
                at = (k * hq + oy) * wq
                got, got_tags = best[at:at + out_w], tags[at:at + out_w]
                out, won = top[p + k, oy], winner[p + k, oy]
                for ox in range(out_w):
                    out[ox] = got[ox]
                    won[ox] = got_tags[ox]
                if want_mask:
                    for ox in range(out_w):
                        tag = got_tags[ox] - 1
                        mask[p + k, oy, ox] = -1 if tag < 0 else (
                            (oy * sh - ph + tag // kw) * width + ox * sw - pw + tag % kw)


def _max_backward(top_diff, winner, bottom_diff, p0, p1, kh, kw, sh, sw, ph, pw):
    out_h, out_w = top_diff.shape[1], top_diff.shape[2]
    height, width = bottom_diff.shape[1], bottom_diff.shape[2]
    # The winner's row and column in its window, per tag (no divisions per output).
    row_of = np.zeros(kh * kw + 1, dtype=np.int64)
    col_of = np.zeros(kh * kw + 1, dtype=np.int64)
    for tag in range(kh * kw):
        row_of[tag + 1], col_of[tag + 1] = tag // kw, tag % kw
    for p in range(p0, p1):
        for y in range(height):
            row = bottom_diff[p, y]
            for xx in range(width):
                row[xx] = 0
        for oy in range(out_h):
            hs = oy * sh - ph
            won, sent = winner[p, oy], top_diff[p, oy]
            for ox in range(out_w):
                tag = won[ox]
                if tag > 0:
                    bottom_diff[p, hs + row_of[tag], ox * sw - pw + col_of[tag]] += sent[ox]


def _ave_forward(x, top, inv_area, p0, p1, kh, kw, sh, sw, ph, pw):
    out_h, out_w = top.shape[1], top.shape[2]
    hq, wq, block, cells, shift_max = _layout(out_h, out_w, kh, kw, sh, sw, p1 - p0)
    # Padding holds 0 (Caffe sums the window clipped to the input; adding 0 changes nothing).
    phases = np.zeros((sh * sw, cells + shift_max), dtype=x.dtype)
    total = np.empty(cells, dtype=x.dtype)
    for p in range(p0, p1, block):
        count = min(block, p1 - p)
        _load(phases, x, p, count, hq, wq, sh, sw, ph, pw)
        total[:] = 0
        for lo in range(0, count * hq * wq, RUN_CELLS):
            hi = min(lo + RUN_CELLS, count * hq * wq)
            run = total[lo:hi]
            for i in range(kh):  # row-major window order, as the numpy path adds
                for j in range(kw):
                    at = lo + (i // sh) * wq + j // sw
                    src = phases[(i % sh) * sw + j % sw, at:at + hi - lo]
                    for q in range(hi - lo):
                        run[q] += src[q]
        for k in range(count):
            for oy in range(out_h):
                at = (k * hq + oy) * wq
                row, out, scale = total[at:at + out_w], top[p + k, oy], inv_area[oy]
                for ox in range(out_w):
                    out[ox] = row[ox] * scale[ox]


def _ave_backward(top_diff, inv_area, bottom_diff, p0, p1, kh, kw, sh, sw, ph, pw):
    out_h, out_w = top_diff.shape[1], top_diff.shape[2]
    hq, wq, block, cells, shift_max = _layout(out_h, out_w, kh, kw, sh, sw, p1 - p0)
    phases = np.empty((sh * sw, cells + shift_max), dtype=bottom_diff.dtype)
    grad = np.zeros(cells, dtype=top_diff.dtype)  # junk outputs stay 0
    for p in range(p0, p1, block):
        count = min(block, p1 - p)
        for k in range(count):
            for oy in range(out_h):
                at = (k * hq + oy) * wq
                row, sent, scale = grad[at:at + out_w], top_diff[p + k, oy], inv_area[oy]
                for ox in range(out_w):
                    row[ox] = sent[ox] * scale[ox]
        phases[:, :] = 0
        # Each input cell adds the shares of the outputs that read it in increasing kernel
        # offset order, as the numpy path gathers them.
        for i in range(kh):
            for j in range(kw):
                at = (i // sh) * wq + j // sw
                dst = phases[(i % sh) * sw + j % sw, at:at + count * hq * wq]
                for q in range(count * hq * wq):
                    dst[q] += grad[q]
        _unload(phases, bottom_diff, p, count, hq, wq, sh, sw, ph, pw)


def _compile(numba):
    """The functions compiled lazily per argument types (float32 / float64 blobs)."""
    jit = functools.partial(compiled.jit, numba)
    global _layout, _columns, _load, _unload, _max_offsets, _max_rows_then_columns
    # The helpers called from compiled code are compiled themselves (looked up as globals).
    _layout, _columns, _load, _unload = jit(_layout), jit(_columns), jit(_load), jit(_unload)
    _max_offsets, _max_rows_then_columns = jit(_max_offsets), jit(_max_rows_then_columns)
    return types.SimpleNamespace(
        max_forward=jit(_max_forward),
        max_backward=jit(_max_backward), ave_forward=jit(_ave_forward),
        ave_backward=jit(_ave_backward))


load = compiled.loader(
    _compile, "The compiled pooling functions, or None when numba cannot be imported.")
