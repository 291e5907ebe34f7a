"""Pooling (Caffe's): MAX (with its optional argmax mask top), AVE, STOCHASTIC, global pooling.

Output size, as Caffe computes it: ceil((in + 2*pad - kernel) / stride) + 1 (round_mode CEIL,
the default) or floor (FLOOR); then, when there is padding and the last window would start
inside it ((out - 1)*stride >= in + pad), one fewer.

MAX never picks a padded cell and keeps the first maximum in scan order (a later cell must be
strictly greater); a window that reads no input cell gives -FLT_MAX and mask -1, as in Caffe.
The mask top holds the flat index h*W + w of the winner within its channel plane, as a float.
AVE divides by the window clipped to the padded input (padded cells count, overhang past the
padded border does not).

The loops run over the kh*kw kernel offsets; each reads one contiguous 1-D slice of the
padded input split into its stride phases (`kernels.windows.ShiftedWindows`), so a few long
ufunc calls cover the whole minibatch. A window spanning the whole plane (global pooling)
is a plain reduction. STOCHASTIC runs in pooling_stochastic.py.

On the CPU two cases take other paths (switches on the class): MAX backward scatters each
top diff to its winner's flat bottom index (`_backward_max_by_index`), and AVE over small
planes is one GEMM with the matrix of window weights (`ave_gemm_below`). The offset passes
remain the device path and are tested on the CPU too.
"""

from __future__ import annotations

import math
import os

import numpy as np

from ..cpu.parallel import for_each_chunk, runner_or_default
from ..kernels import pool_loops
from ..kernels.windows import ShiftedWindows
from ..proto import caffe_pb2
from . import pooling_stochastic
from .base import Layer
from .registry import register_layer

_P = caffe_pb2.PoolingParameter
#: Caffe starts every MAX window at -FLT_MAX, for float and double blobs alike.
_LOWEST = float(np.finfo(np.float32).min)


def _tag_type(kernel):
    """The smallest integer type holding MAX's winner tags 0..kh*kw (1 + the kernel offset;
    0: no winner), for the numpy and the compiled paths alike."""
    count = kernel[0] * kernel[1] + 1
    return np.int8 if count <= 127 else (np.int16 if count <= 32767 else np.int32)


def pooled_size(size: int, kernel: int, pad: int, stride: int, ceil_mode: bool) -> int:
    """Caffe's pooled length before the clip of a last window starting in the padding."""
    span = (size + 2 * pad - kernel) / stride
    return int(math.ceil(span) if ceil_mode else math.floor(span)) + 1


@register_layer
class Pooling(Layer):
    """MAX / AVE / STOCHASTIC pooling with Caffe's output sizes."""

    type = "Pooling"
    exact_num_bottom = 1
    min_top = 1
    max_top = 2

    #: On the CPU, MAX backward scatters each top diff to its winner's flat bottom index
    #: (np.add.at, in output order as Caffe adds) instead of gathering offset by offset
    #: through the phase grids (benchmarks/bench_small_layers.py, CIFAR-10 pool1, 3x3/2 over
    #: 100x32x32x32: 9.1 -> 7.6 ms with a cold cache, 9.7 -> 6.4 ms warm).
    max_backward_by_index = True
    #: On the CPU, AVE over planes of at most this many cells (input times output cells per
    #: plane) is one GEMM with the (H*W, Ph*Pw) matrix of window weights, forward and
    #: backward: BLAS beats the offset-by-offset passes on small planes (CIFAR-10's 16x16
    #: and 8x8 AVE pools); 0 turns it off.
    ave_gemm_below = 1 << 16
    #: On the CPU, MAX (and AVE not taken by the GEMM above) run as compiled loops
    #: (kernels/pool_loops.py, numba) when numba can be imported; False: the numpy passes.
    #: MGCAFFE_POOLING_LOOPS=0 in the environment (read at import) makes False the default:
    #: for short-lived processes, where importing numba and loading the cached loops (about
    #: 0.3 + 0.3-0.9 s of CPU per process) costs more than they save.
    compiled = os.environ.get("MGCAFFE_POOLING_LOOPS", "1") != "0"
    #: The compiled MAX forward with stride 1 down the rows (GoogleNet's inception pools)
    #: takes the row maxima first, then the maxima of kh rows (same winners, fewer passes).
    separable_max = True

    def layer_setup(self, bottom, top):
        p = self.param.pooling_param
        self.method = p.pool
        if len(top) == 2 and self.method != _P.MAX:
            raise self.error("only MAX pooling has a second (mask) top")
        self.global_pooling = p.global_pooling
        has_size = p.HasField("kernel_size")
        has_hw = p.HasField("kernel_h") or p.HasField("kernel_w")
        if self.global_pooling:
            if has_size or has_hw:
                raise self.error("with global_pooling the kernel size may not be given")
            self.kernel = None  # the bottom's spatial size, set in reshape
        elif has_size and has_hw:
            raise self.error("kernel size is kernel_size OR kernel_h and kernel_w, not both")
        elif has_size:
            self.kernel = (int(p.kernel_size), int(p.kernel_size))
        elif p.HasField("kernel_h") and p.HasField("kernel_w"):
            self.kernel = (int(p.kernel_h), int(p.kernel_w))
        else:
            raise self.error("kernel_size (or both kernel_h and kernel_w) is required")
        self.pad = self._pair(p, "pad")
        self.stride = self._pair(p, "stride")
        if self.global_pooling and (self.pad != (0, 0) or self.stride != (1, 1)):
            raise self.error(f"with global_pooling only pad 0 and stride 1 are allowed, got "
                             f"pad {self.pad}, stride {self.stride}")
        if min(self.stride) <= 0:
            raise self.error(f"stride must be positive, got {self.stride}")
        self.ceil_mode = p.round_mode == _P.CEIL
        self._shape = None

    def _pair(self, p, name):
        has_h, has_w = p.HasField(f"{name}_h"), p.HasField(f"{name}_w")
        if has_h or has_w:
            if p.HasField(name) or not (has_h and has_w):
                raise self.error(f"{name} is {name} OR {name}_h and {name}_w (both)")
            return int(getattr(p, f"{name}_h")), int(getattr(p, f"{name}_w"))
        return (int(getattr(p, name)),) * 2

    # -- shapes and buffers ----------------------------------------------------------------
    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if len(shape) != 4:
            raise self.error(f"input must have 4 axes (num, channels, height, width), got "
                             f"shape {shape}")
        n, c, h, w = shape
        kernel = (h, w) if self.global_pooling else self.kernel
        if min(kernel) <= 0:
            raise self.error(f"kernel dimensions must be positive, got {kernel}")
        if self.pad[0] >= kernel[0] or self.pad[1] >= kernel[1]:
            raise self.error(f"pad {self.pad} must be smaller than the kernel {kernel}")
        out = [pooled_size(s, k, p, st, self.ceil_mode)
               for s, k, p, st in zip((h, w), kernel, self.pad, self.stride)]
        if self.pad != (0, 0):
            # Caffe: the last window must start strictly inside the (unpadded) input.
            for a, size in enumerate((h, w)):
                if (out[a] - 1) * self.stride[a] >= size + self.pad[a]:
                    out[a] -= 1
        if min(out) <= 0:
            raise self.error(f"input {h}x{w} gives an empty output {out[0]}x{out[1]} with "
                             f"kernel {kernel}, pad {self.pad}, stride {self.stride}")
        for t in top:
            t.reshape(n, c, out[0], out[1])
        if self.method == _P.STOCHASTIC:
            self.out_hw, self.kernel_now = tuple(out), kernel
            return
        if self._shape == (shape, kernel):
            return
        self._shape = (shape, kernel)
        self.out_hw = tuple(out)
        self.kernel_now = kernel  # the kernel in effect (the whole plane for global pooling)
        self.whole_plane = tuple(out) == (1, 1) and kernel == (h, w) and self.pad == (0, 0)
        self._ave_matrix = self._loops = None
        loops = pool_loops.load() if self.compiled and self.xp is np else None
        if self.whole_plane and self.method == _P.MAX and loops is not None:
            # The loops treat NaN and -inf as Caffe does; the argmax of the plain reduction
            # would let a NaN win and give -inf for a plane of -inf (not -FLT_MAX, mask -1).
            self.whole_plane = False
        if self.whole_plane:
            return
        if (self.method == _P.AVE and self.xp is np
                and h * w * out[0] * out[1] <= self.ave_gemm_below):
            self._ave_matrix = self._ave_weights((h, w), kernel)
            return
        self._loops = loops
        if self._loops is not None:
            self._setup_compiled(shape, kernel)
            return
        fill = -np.inf if self.method == _P.MAX else 0
        self._windows = windows = ShiftedWindows(self.xp, self.dtype, shape, kernel,
                                                 self.stride, self.pad, self.out_hw, fill)
        length, margin = windows.length, windows.margin
        # Kept from forward to backward (the per-call temporaries come from `scratch`).
        # The gathering backward reads the winner tags and the grid diff (made on its first
        # use), so they carry `margin` leading cells; those and the junk cells stay 0.
        self._grid_diff_stored = None
        if self.method == _P.MAX:
            # Per grid cell, 1 + the kernel offset that won (0: none); offsets are scanned in
            # increasing order, so "the latest strictly greater one" is a running maximum of
            # greater * (offset + 1): small-int arithmetic instead of slow masked copies.
            self._winner_stored = self.xp.zeros(margin + length, dtype=_tag_type(kernel))
            self._winner_grid = self._winner_stored[margin:]
            # The tags of the real outputs, (N, C, Ph, Pw): what a device twin reproduces.
            self._winner = windows.valid(self._winner_grid)
            self._mask_delta = self._mask_offsets((h, w), kernel) if len(top) > 1 else None
            if self.xp is np:
                self._index_table, self._index_base = self._winner_indices(shape, kernel)
        else:
            self._inv_area = self._inverse_window_area((h, w), kernel)

    def _setup_compiled(self, shape, kernel):
        """Buffers of the compiled loops: MAX's winner tags (the numpy path's tag type), AVE's
        1/area table."""
        n, c, h, w = shape
        if self.method == _P.MAX:
            self._winner = np.zeros((n, c) + self.out_hw, dtype=_tag_type(kernel))
            return
        self._inv_area = self._inverse_window_area((h, w), kernel)

    def _window_starts(self, axis):
        return self.xp.arange(self.out_hw[axis]) * self.stride[axis] - self.pad[axis]

    def _mask_offsets(self, in_hw, kernel):
        """(window start index h0*W + w0 per output, table of i*W + j per offset + 1).

        The mask value of an output is start + table[winner]; table[0] (no winner) is unused.
        """
        start = (self._window_starts(0)[:, None] * in_hw[1] + self._window_starts(1)[None, :])
        i, j = self.xp.divmod(self.xp.arange(kernel[0] * kernel[1]), kernel[1])
        table = self.xp.concatenate([self.xp.zeros(1, dtype=i.dtype), i * in_hw[1] + j])
        return start.astype(self.dtype), table.astype(self.dtype)

    def _winner_indices(self, shape, kernel):
        """(flat offset i*W + j of each winner tag, flat bottom index of each output's window
        start, (N, C, Ph, Pw)): a winner's index in the whole bottom is their sum."""
        n, c, h, w = shape
        i, j = np.divmod(np.arange(kernel[0] * kernel[1]), kernel[1])
        table = np.concatenate([np.zeros(1, dtype=np.intp), i * w + j]).astype(np.intp)
        start = (self._window_starts(0)[:, None] * w + self._window_starts(1)[None, :])
        planes = np.arange(n * c, dtype=np.intp).reshape(n, c, 1, 1) * (h * w)
        return table, planes + start.astype(np.intp)

    def _ave_weights(self, in_hw, kernel):
        """The (H*W, Ph*Pw) matrix of AVE: cell (h, w) weighs 1/area in each window it is in."""
        weights = []
        for a in (0, 1):
            start = self._window_starts(a)
            cells = np.arange(in_hw[a])[:, None]
            weights.append((cells >= start) & (cells < start + kernel[a]))
        inside = (weights[0][:, None, :, None] & weights[1][None, :, None, :])
        matrix = inside * self._inverse_window_area(in_hw, kernel)[None, None]
        matrix = matrix.reshape(in_hw[0] * in_hw[1], -1).astype(self.dtype)
        return matrix, np.ascontiguousarray(matrix.T)

    def _inverse_window_area(self, in_hw, kernel):
        """1 / (window area clipped to the padded input), per output position (Caffe's AVE)."""
        extents = []
        for a in (0, 1):
            start = self._window_starts(a)
            end = self.xp.minimum(start + kernel[a], in_hw[a] + self.pad[a])
            extents.append(end - start)
        area = (extents[0][:, None] * extents[1][None, :]).astype(self.dtype)
        # Caffe would divide by zero for a window that starts exactly at the padded border
        # (only possible with stride > kernel); such an output is empty, so we give it 0.
        return self.xp.where(area > 0, 1 / self.xp.where(area > 0, area, 1), 0).astype(
            self.dtype)

    # -- forward ---------------------------------------------------------------------------
    def _runner(self):
        return runner_or_default(self.ctx.chunk_runner)

    def _for_each_chunk(self, body):
        """body(start, stop) over chunks of samples, threaded on the CPU (kernels.parallel)."""
        windows = self._windows
        for_each_chunk(self.xp, windows.grid_shape[0], body,
                       item_elements=windows.sample_length, runner=self._runner())

    def forward(self, bottom, top):
        if self.method == _P.STOCHASTIC:
            return pooling_stochastic.forward(self, bottom, top)
        x = bottom[0].data
        if self.whole_plane:
            self._forward_whole_plane(x, top)
            return
        if self._ave_matrix is not None:
            n, c = x.shape[:2]
            np.matmul(x.reshape(n * c, -1), self._ave_matrix[0],
                      out=top[0].data.reshape(n * c, -1))
            return
        if self._loops is not None:
            self._forward_compiled(x, top)
            return
        windows = self._windows
        # Per-call temporaries: the padded input in phases, the running result, and for MAX
        # the comparison flags and the candidate tags.
        scratch = [self.scratch(0, windows.phases_shape), self.scratch(1, (windows.length,))]
        if self.method == _P.MAX:
            scratch += [self.scratch(2, (windows.length,), bool),
                        self.scratch(3, (windows.length,), self._winner_grid.dtype)]
        self._for_each_chunk(
            lambda start, stop: self._forward_samples(x, top, scratch, start, stop))

    def _forward_samples(self, x, top, scratch, start, stop):
        """Forward of samples [start, stop): load them, reduce block by block (each block's
        operands stay in the cache across the kernel offsets), write their tops."""
        xp, windows = self.xp, self._windows
        phases, best = scratch[:2]
        windows.load(x, phases, start, stop)
        for lo, hi in windows.blocks(start, stop, self._runner().chunk_elements):
            if self.method == _P.MAX:
                self._max_block(scratch, lo, hi)
            else:
                total = best[lo:hi]
                total[...] = 0
                for _, index, shift in windows.offsets:
                    total += windows.window(phases, index, shift, lo, hi)
        pooled = windows.valid(best)[start:stop]
        if self.method != _P.MAX:
            xp.multiply(pooled, self._inv_area, out=top[0].data[start:stop])
            return
        top[0].data[start:stop] = pooled
        if len(top) > 1:
            self._write_mask(top[1].data[start:stop], windows.valid(self._winner_grid)[start:stop])

    def _forward_compiled(self, x, top):
        loops, (kh, kw), (sh, sw), (ph, pw) = self._loops, self.kernel_now, self.stride, self.pad
        n, c, h, w = x.shape
        planes = x.reshape(n * c, h, w)
        out = top[0].data.reshape((n * c,) + self.out_hw)
        if self.method == _P.MAX:
            winner = self._winner.reshape(out.shape)
            mask = top[1].data.reshape(out.shape) if len(top) > 1 else out
            lowest = x.dtype.type(_LOWEST)

            def body(start, stop):
                loops.max_forward(planes, out, winner, mask, start * c, stop * c,
                                  kh, kw, sh, sw, ph, pw, lowest, len(top) > 1,
                                  self.separable_max)
        else:
            def body(start, stop):
                loops.ave_forward(planes, out, self._inv_area, start * c, stop * c,
                                  kh, kw, sh, sw, ph, pw)
        self._for_each_sample(n, x[0].size, body)

    def _for_each_sample(self, n, sample_elements, body):
        # One chunk per thread: a compiled call makes one pass, with no temporaries to keep
        # in the cache.
        for_each_chunk(np, n, body, item_elements=sample_elements, cache_sized=False,
                       runner=self._runner())

    def _forward_whole_plane(self, x, top):
        n, c = x.shape[:2]
        flat = x.reshape(n, c, -1)
        out = top[0].data.reshape(n, c)
        if self.method == _P.MAX:
            # argmax returns the first maximum: Caffe's strictly-greater scan order.
            winner = self._whole_plane_winner = self.xp.argmax(flat, axis=2)
            out[...] = self.xp.take_along_axis(flat, winner[:, :, None], axis=2)[:, :, 0]
            if len(top) > 1:
                top[1].data.reshape(n, c)[...] = winner
        else:
            self.xp.mean(flat, axis=2, out=out)

    def _max_block(self, scratch, lo, hi):
        """Running maximum and winner tags of grid cells [lo, hi) over the kernel offsets."""
        # Padding holds -inf and the running maximum starts at -FLT_MAX, so a padded cell never
        # wins; fmax keeps the old value on NaN, as Caffe's "x > max" does; ties keep the
        # earlier offset (a later one must be strictly greater).
        xp, windows = self.xp, self._windows
        phases, best, greater, candidate = scratch
        best, greater, candidate = best[lo:hi], greater[lo:hi], candidate[lo:hi]
        winner = self._winner_grid[lo:hi]
        index_type = winner.dtype.type
        # With int8 tags the flags are used as 0/1 int8 (a same-type multiply: measured 3x
        # faster than bool * int8, which casts).
        flags = greater.view(winner.dtype) if winner.dtype.itemsize == 1 else greater
        best[...] = _LOWEST
        winner[...] = 0
        for tag, index, shift in windows.offsets:
            values = windows.window(phases, index, shift, lo, hi)
            xp.greater(values, best, out=greater)
            xp.fmax(best, values, out=best)
            xp.multiply(flags, index_type(tag + 1), out=candidate)
            xp.maximum(winner, candidate, out=winner)

    def _write_mask(self, mask, won):
        """Flat index h*W + w of each winner in its plane; -1 where no cell was read."""
        xp = self.xp
        start, table = self._mask_delta
        xp.take(table, won, out=mask)
        mask += start + 1
        mask *= won > 0
        mask -= 1

    # -- backward --------------------------------------------------------------------------
    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if self.method == _P.STOCHASTIC:
            return pooling_stochastic.backward(self, top, propagate_down, bottom)
        top_diff, bottom_diff = top[0].diff, bottom[0].diff
        if self.whole_plane:
            self._backward_whole_plane(top_diff, bottom_diff)
            return
        if self._ave_matrix is not None:
            n, c = top_diff.shape[:2]
            np.matmul(top_diff.reshape(n * c, -1), self._ave_matrix[1],
                      out=bottom_diff.reshape(n * c, -1))
            return
        if self._loops is not None:
            self._backward_compiled(top_diff, bottom_diff)
            return
        if self.method == _P.MAX and self.xp is np and self.max_backward_by_index:
            self._backward_max_by_index(top_diff, bottom_diff)
            return
        if self._grid_diff_stored is None:
            windows = self._windows
            self._grid_diff_stored = self.xp.zeros(windows.margin + windows.length,
                                                   dtype=self.dtype)
            self._grid_diff = self._grid_diff_stored[windows.margin:]
        # Per-call temporaries: the gradient per phase cell, and for MAX the won flags.
        scratch = (self.scratch(0, self._windows.phases_shape),
                   self.scratch(1, (self._windows.length,)))
        self._for_each_chunk(lambda start, stop: self._backward_samples(
            top_diff, bottom_diff, scratch, start, stop))

    def _backward_samples(self, top_diff, bottom_diff, scratch, start, stop):
        """Backward of samples [start, stop): each input cell gathers, offset by offset, the
        gradient of the outputs that read it (MAX: of those it won)."""
        xp, windows = self.xp, self._windows
        outputs = windows.valid(self._grid_diff)[start:stop]
        if self.method == _P.MAX:
            outputs[...] = top_diff[start:stop]
        else:
            xp.multiply(top_diff[start:stop], self._inv_area, out=outputs)
        phase_diff, won_flags = scratch
        for lo, hi in windows.blocks(start, stop, self._runner().chunk_elements):
            written = set()
            for tag, index, shift in windows.offsets:
                target = windows.window(phase_diff, index, 0, lo, hi)
                sent = windows.margin_slice(self._grid_diff_stored, shift, lo, hi)
                if self.method == _P.MAX:
                    won = won_flags[lo:hi]
                    tags = windows.margin_slice(self._winner_stored, shift, lo, hi)
                    # bool -> float on output, then a float multiply: measured faster than
                    # multiplying by the bool flags (a casting loop).
                    xp.equal(tags, tags.dtype.type(tag + 1), out=won)
                    sent = xp.multiply(sent, won, out=won)
                if index in written:
                    target += sent
                else:  # the first offset into a phase overwrites: no zeroing pass
                    target[...] = sent
                    written.add(index)
        windows.unload(phase_diff, bottom_diff, start, stop)

    def _backward_compiled(self, top_diff, bottom_diff):
        loops, (kh, kw), (sh, sw), (ph, pw) = (self._loops, self.kernel_now, self.stride,
                                               self.pad)
        n, c, h, w = bottom_diff.shape
        planes = bottom_diff.reshape(n * c, h, w)
        grad = top_diff.reshape((n * c,) + self.out_hw)
        if self.method == _P.MAX:
            winner = self._winner.reshape(grad.shape)

            def body(start, stop):
                loops.max_backward(grad, winner, planes, start * c, stop * c, kh, kw, sh, sw,
                                   ph, pw)
        else:
            def body(start, stop):
                loops.ave_backward(grad, self._inv_area, planes, start * c, stop * c,
                                   kh, kw, sh, sw, ph, pw)
        self._for_each_sample(n, bottom_diff[0].size, body)

    def _backward_max_by_index(self, top_diff, bottom_diff):
        """MAX backward on the CPU: bottom diff = 0, then each top diff added at its winner's
        flat bottom index, outputs in order (Caffe's loop). Windows that read no cell
        (winner tag 0) send nothing."""
        won = self._winner
        # A net's workspace slot is bytes, shared with the forward's phases (slot 0); a layer
        # without one keeps an array per slot, which a change of shape or dtype reallocates.
        index = self.scratch(0 if self.ctx.workspace is not None else 4, won.shape, np.intp)
        flat_diff = bottom_diff.reshape(-1)

        def body(start, stop):
            tags = won[start:stop]
            cells = index[start:stop]
            np.take(self._index_table, tags, out=cells, mode="clip")
            cells += self._index_base[start:stop]
            bottom_diff[start:stop] = 0
            sent = top_diff[start:stop]
            if not tags.all():
                # A window with no winner (it read no cell, or only -inf/NaN) sends 0, to a
                # cell of this chunk (its start may lie outside the bottom).
                empty = tags == 0
                sent = sent * ~empty
                np.putmask(cells, empty, start * flat_diff.size // won.shape[0])
            np.add.at(flat_diff, cells.reshape(-1), sent.reshape(-1))

        for_each_chunk(self.xp, won.shape[0], body, item_elements=won[0].size * 4,
                       cache_sized=False, runner=self._runner())

    def _backward_whole_plane(self, top_diff, bottom_diff):
        n, c = top_diff.shape[:2]
        flat = bottom_diff.reshape(n, c, -1)
        grad = top_diff.reshape(n, c, 1)
        if self.method == _P.MAX:
            cells = self.xp.arange(flat.shape[2])
            self.xp.multiply(cells == self._whole_plane_winner[:, :, None], grad, out=flat)
        else:
            flat[...] = grad / flat.shape[2]
