"""Stride-1 2-D convolution as a few large shifted GEMMs, without a column matrix.

Why: im2col writes (and a layer keeps, for backward) a column matrix kh*kw times the input;
for CIFAR-10 quick's conv2 at batch 100 that is 82 MB written and read for a 1.3 GFLOP GEMM.
With stride 1 the input one kernel offset (i, j) needs is the padded input itself, shifted.

Layout: the padded input of the whole batch, channel-major, one row per channel:
X (C, N*Hp*Wp). Output position (n, y, x) sits at p = n*Hp*Wp + y*Wp + x of a
"full" output Y (Cout, N*Hp*Wp), and the input it reads through offset (i, j) sits at
p + i*dh*Wp + j*dw. So for every offset, Y += W[:, :, i, j] @ X[:, shift : shift + L], one
GEMM on a strided view of X (BLAS beta = 1). The positions of Y with y >= Ho or x >= Wo read
across a row or sample border: garbage by construction, dropped when Y is cropped.

`stack` copies of X, the j-th shifted left by j*dw (zero filled), are stacked on the rows:
Xs (C*stack, Ls). With stack = kw the j offsets become one GEMM's reduction (K = C*kw, kh
GEMMs: fewer passes over Y, kw times the input kept); with stack = 1, Xs is X (K = C,
kh*kw GEMMs). Backward uses the same views: dW[i, j] = dY @ Xs[:, shift...]^T (reduction
over N*Hp*Wp, dY zero at the garbage positions) and dXs[:, shift...] += W[i, j]^T @ dY,
offset by offset in one fixed order, then folded back onto the input and cropped.

Threads: the GEMMs are cut into independent tasks (fixed column blocks of the full output;
per offset, group and fixed reduction part for the weight gradient), handed to the chunk
runner's threads with one BLAS thread each (kernels.sample_gemm): OpenBLAS's own 2 threads
waited at every split for a core another process held (res2a_branch2b backward 128 ms
against 23 ms). Every GEMM's summation order is fixed by the shapes alone (no split that
depends on the thread count), and the copies are exact, so results repeat bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..cpu.parallel import for_each_chunk
from .gemm import gemm_accumulate
from .sample_gemm import for_each_gemm


class ShiftGeometry:
    """Sizes of the shifted layout for one input shape, kernel, pad, dilation and group."""

    def __init__(self, image_shape, kernel, pad, dilation, group: int, stack: int):
        self.n, self.c, self.h, self.w = (int(v) for v in image_shape)
        self.kh, self.kw = kernel
        self.ph, self.pw = pad
        self.dh, self.dw = dilation
        self.group = int(group)
        if stack not in (1, self.kw):
            raise ValueError(f"stack must be 1 or the kernel width {self.kw}, got {stack}")
        self.stack = int(stack)
        self.hp, self.wp = self.h + 2 * self.ph, self.w + 2 * self.pw
        self.ho = self.hp - self.dh * (self.kh - 1)
        self.wo = self.wp - self.dw * (self.kw - 1)
        self.plane = self.hp * self.wp
        #: Full-output length: every padded position of every sample.
        self.length = self.n * self.plane
        #: Offsets, in the fixed order every pass runs them: (i, column block, shift).
        self.offsets = [(i, b, i * self.dh * self.wp + b * self.stack * self.dw)
                        for i in range(self.kh) for b in range(self.kw // self.stack)]
        #: Row length of Xs: the full output plus the largest shift.
        self.row = self.length + self.offsets[-1][2]
        self.rows = self.c * self.stack

    def waste(self) -> float:
        """Full-output positions computed per output position kept (>= 1)."""
        return self.plane / (self.ho * self.wo)


def _shift_copy(target5, source4, x_first: int, x_stop: int, source_first: int) -> None:
    """target5[..., x_first:x_stop] = source4[..., source_first:...] (same width)."""
    target5[..., x_first:x_stop] = source4[..., source_first:source_first + x_stop - x_first]


def fill_stacked_input(image, xs, g: ShiftGeometry, runner=None) -> None:
    """xs (C*stack, row) = the stacked, shifted, zero-padded channel-major copy of image
    (N, C, H, W); chunks of channels on the runner's threads."""
    body = xs.reshape(g.c, g.stack, g.row)

    def channels(start, stop):
        part = body[start:stop]
        part[...] = 0
        full = part[:, :, :g.length].reshape(stop - start, g.stack, g.n, g.hp, g.wp)
        source = image[:, start:stop].transpose(1, 0, 2, 3)
        for j in range(g.stack):
            shift = j * g.dw  # Xs[.., j, x] = Xpad[.., x + shift]
            first = max(0, g.pw - shift)
            skip = first - (g.pw - shift)  # input columns that fell off the left edge
            if skip >= g.w:
                continue
            full[:, j, :, g.ph:g.ph + g.h, first:first + g.w - skip] = source[..., skip:]

    for_each_chunk(np, g.c, channels, item_elements=g.stack * g.row, cache_sized=False,
                   runner=runner)


def pack_weight(weight, g: ShiftGeometry, out) -> None:
    """out (kh, kw/stack, Cout, C/group*stack) = weight (Cout, C/group, kh, kw) regrouped:
    out[i, b][o, c*stack + jj] = weight[o, c, i, b*stack + jj]."""
    cout, cg = weight.shape[:2]
    view = weight.reshape(cout, cg, g.kh, g.kw // g.stack, g.stack)
    out.reshape(g.kh, g.kw // g.stack, cout, cg, g.stack)[...] = view.transpose(2, 3, 0, 1, 4)


def grad_shape(g: ShiftGeometry, cout: int) -> tuple[int, ...]:
    """The shape of weight_grad_full's partial, transposed, packed gradients."""
    return (reduction_parts(g), g.kh, g.kw // g.stack, g.group, g.rows // g.group,
            cout // g.group)


def unpack_weight_grad(grad_t, g: ShiftGeometry, diff, overwrite: bool) -> None:
    """diff (Cout, C/group, kh, kw) = (or +=) weight_grad_full's partials summed in order,
    unpacked: diff[k*Cout/group + o, c, i, b*stack + jj] = sum_r grad_t[r, i, b, k,
    c*stack + jj, o]."""
    cout, cg = diff.shape[:2]
    total = grad_t[0]
    if grad_t.shape[0] > 1:
        total = grad_t[0].copy()
        for part in grad_t[1:]:
            total += part
    view = total.reshape(g.kh, g.kw // g.stack, g.group, cg, g.stack, cout // g.group)
    view = view.transpose(2, 5, 3, 0, 1, 4)
    target = diff.reshape(g.group, cout // g.group, cg, g.kh, g.kw // g.stack, g.stack)
    if overwrite:
        target[...] = view
    else:
        target += view


def _group_rows(count: int, groups: int, k: int) -> slice:
    per = count // groups
    return slice(k * per, (k + 1) * per)


def _blocks(length: int) -> list[slice]:
    """Fixed column blocks of a full output (independent of the thread count, so the
    results are too): about 16, each at least `BLOCK_MIN` columns."""
    block = max(BLOCK_MIN, -(-length // BLOCKS))
    return [slice(first, min(length, first + block)) for first in range(0, length, block)]


#: Narrowest column block of a split GEMM (OpenBLAS packs each block's operands anew).
BLOCK_MIN = 256
#: About how many column blocks a full output is cut into.
BLOCKS = 16


def forward_full(packed, xs, y_full, g: ShiftGeometry, runner=None,
                 gemm: Callable = gemm_accumulate) -> None:
    """y_full (Cout, L) = sum over offsets of packed[i, b] @ xs[:, shift : shift + L], per
    group, column block by column block (the first offset overwrites: BLAS beta = 0)."""
    cout = y_full.shape[0]

    def block(cut):
        for first, (i, b, shift) in enumerate(g.offsets):
            moved = slice(cut.start + shift, cut.stop + shift)
            for k in range(g.group):
                out_rows = _group_rows(cout, g.group, k)
                in_rows = _group_rows(g.rows, g.group, k)
                gemm(packed[i, b, out_rows], xs[in_rows, moved], y_full[out_rows, cut],
                     overwrite=first == 0)

    cuts = _blocks(g.length)

    def blocks(start, stop):  # a body of its own: adaptive runners time it apart
        for cut in cuts[start:stop]:
            block(cut)

    for_each_gemm(np, len(cuts), blocks, runner)


def reduction_parts(g: ShiftGeometry) -> int:
    """In how many fixed parts weight_grad_full cuts each GEMM's reduction (over the full
    output): enough for about 8 tasks, so that 2-4 threads share them evenly (kh = 3
    offsets on 2 threads would leave one idle a third of the time), each part at least 4096
    long. A function of the shapes only: the sum's order never depends on the threads."""
    tasks = len(g.offsets) * g.group
    return max(1, min(-(-8 // tasks), g.length // 4096))


def weight_grad_full(dy_full, xs, g: ShiftGeometry, grad_t, runner=None,
                     gemm: Callable = gemm_accumulate) -> None:
    """grad_t[r, i, b, k] = xs[group k rows, shift + part r] @ dy_full[group k rows,
    part r]^T, r over reduction_parts(g) fixed parts of the full output (overwritten;
    grad_t: grad_shape(g, Cout); the caller sums over r). Transposed, the orientation
    OpenBLAS runs faster when Cout is the short side (92 vs 58 GFLOP/s measured for
    32 x 160 x 40000); whole GEMMs per offset and group, as cutting the gradient's columns
    into blocks cost 20-50% per GEMM."""
    cout = dy_full.shape[0]
    parts = grad_t.shape[0]
    bounds = [g.length * r // parts for r in range(parts + 1)]
    tasks = []
    for i, b, shift in g.offsets:
        for k in range(g.group):
            out_rows = _group_rows(cout, g.group, k)
            in_rows = _group_rows(g.rows, g.group, k)
            for r in range(parts):
                lo, hi = bounds[r], bounds[r + 1]
                tasks.append(lambda i=i, b=b, k=k, r=r, lo=lo, hi=hi, shift=shift,
                             out_rows=out_rows, in_rows=in_rows:
                             gemm(xs[in_rows, shift + lo:shift + hi],
                                  dy_full[out_rows, lo:hi].transpose(),
                                  grad_t[r, i, b, k], overwrite=True))

    def gemms(start, stop):  # a body of its own: adaptive runners time it apart
        for task in tasks[start:stop]:
            task()

    for_each_gemm(np, len(tasks), gemms, runner)


def input_grad_full(packed, dy_ext, dxs, g: ShiftGeometry, runner=None,
                    gemm: Callable = gemm_accumulate) -> None:
    """dxs (C*stack, L) = sum over offsets of packed[i, b]^T @ dy shifted back by the
    offset's shift: dy_ext (Cout, P + L) holds dy after P = the largest shift zeros, so
    every offset reads one view and the column blocks are independent."""
    cout = dy_ext.shape[0]
    lead = dy_ext.shape[1] - g.length

    def block(cut):
        for first, (i, b, shift) in enumerate(g.offsets):
            moved = slice(lead - shift + cut.start, lead - shift + cut.stop)
            for k in range(g.group):
                out_rows = _group_rows(cout, g.group, k)
                in_rows = _group_rows(g.rows, g.group, k)
                gemm(packed[i, b, out_rows].transpose(), dy_ext[out_rows, moved],
                     dxs[in_rows, cut], overwrite=first == 0)

    cuts = _blocks(g.length)

    def blocks(start, stop):  # a body of its own: adaptive runners time it apart
        for cut in cuts[start:stop]:
            block(cut)

    for_each_gemm(np, len(cuts), blocks, runner)


def fold_input_grad(dxs, g: ShiftGeometry, image_diff, runner=None) -> None:
    """image_diff (N, C, H, W) = the sum over the stacked copies of dxs, cropped to the
    input (the inverse placement of fill_stacked_input)."""
    body = dxs.reshape(g.c, g.stack, g.length)

    def channels(start, stop):
        full = body[start:stop].reshape(stop - start, g.stack, g.n, g.hp, g.wp)
        target = image_diff[:, start:stop].transpose(1, 0, 2, 3)
        for j in range(g.stack):
            shift = j * g.dw
            first = max(0, g.pw - shift)
            skip = first - (g.pw - shift)
            rows = full[:, j, :, g.ph:g.ph + g.h]
            if j == 0:  # shift 0 covers every input column
                target[...] = rows[..., g.pw:g.pw + g.w]
            elif skip < g.w:
                target[..., skip:] += rows[..., first:first + g.w - skip]

    for_each_chunk(np, g.c, channels, item_elements=g.stack * g.row, cache_sized=False,
                   runner=runner)


def crop_output(y_full, g: ShiftGeometry, top, bias=None, runner=None) -> None:
    """top (N, Cout, Ho, Wo) = y_full's kept positions (+ bias (Cout,)), by samples."""
    cout = y_full.shape[0]
    grid = y_full.reshape(cout, g.n, g.hp, g.wp)[:, :, :g.ho, :g.wo].transpose(1, 0, 2, 3)
    b4 = None if bias is None else bias[None, :, None, None]

    def samples(start, stop):
        if b4 is None:
            np.copyto(top[start:stop], grid[start:stop])
        else:
            np.add(grid[start:stop], b4, out=top[start:stop])

    for_each_chunk(np, g.n, samples, item_elements=top[0].size, cache_sized=False,
                   runner=runner)


def spread_output_grad(top_diff, g: ShiftGeometry, dy_ext, runner=None) -> None:
    """dy_ext (Cout, P + L) = P zeros, then top_diff (N, Cout, Ho, Wo) at the kept positions
    of the full output and 0 elsewhere (P = the largest shift, for input_grad_full)."""
    cout = dy_ext.shape[0]
    lead = dy_ext.shape[1] - g.length
    dy_ext[:, :lead] = 0
    grid = dy_ext[:, lead:].reshape(cout, g.n, g.hp, g.wp)

    def samples(start, stop):
        part = grid[:, start:stop]
        part[:, :, g.ho:] = 0
        part[:, :, :g.ho, g.wo:] = 0
        part[:, :, :g.ho, :g.wo] = top_diff[start:stop].transpose(1, 0, 2, 3)

    for_each_chunk(np, g.n, samples, item_elements=top_diff[0].size, cache_sized=False,
                   runner=runner)
