"""Pooling's paths: one object per path (choice.pooling names them), made in `reshape`.

Each takes the layer (its kernel in effect, stride, pad, pooled size, dtype), its choice, the
bottom's shape and the number of tops, sizes what it keeps, and runs forward and backward
(the layer returns before backward when the bottom wants no diff).

The offset passes run over the kh*kw kernel offsets; each reads one contiguous 1-D slice of
the padded input split into its stride phases (`kernels.windows.ShiftedWindows`), so a few
long ufunc calls cover the whole minibatch.
"""

from __future__ import annotations

import numpy as np

from ..cpu.parallel import for_each_chunk, runner_or_default
from ..kernels.cuda import im2col_pool as cuda_kernels
from ..kernels.loops import pool as pool_loops
from ..kernels.windows import ShiftedWindows
from ..proto import caffe_pb2
from . import pooling_stochastic

_P = caffe_pb2.PoolingParameter
#: Caffe starts every MAX window at -FLT_MAX, for float and double blobs alike.
_LOWEST = float(np.finfo(np.float32).min)


def tag_type(kernel):
    """The smallest integer type holding MAX's winner tags 0..kh*kw (1 + the kernel offset;
    0: no winner), for the numpy and the compiled paths alike."""
    count = kernel[0] * kernel[1] + 1
    return np.int8 if count <= 127 else (np.int16 if count <= 32767 else np.int32)


class PoolingPath:
    """One way to run a Pooling layer (see the module docstring)."""

    #: MAX's winner tags per output (N, C, Ph, Pw) where the path keeps them, else None.
    winner = None

    def __init__(self, layer, choice, shape, tops: int):
        self.layer = layer
        self.choice = choice
        self.max = layer.method == _P.MAX

    def runner(self):
        return runner_or_default(self.layer.ctx.chunk_runner)

    def forward(self, bottom, top) -> None:
        raise NotImplementedError

    def backward(self, top, propagate_down, bottom) -> None:
        raise NotImplementedError


class StochasticPath(PoolingPath):
    """STOCHASTIC pooling (pooling_stochastic.py)."""

    def forward(self, bottom, top):
        pooling_stochastic.forward(self.layer, bottom, top)

    def backward(self, top, propagate_down, bottom):
        pooling_stochastic.backward(self.layer, top, propagate_down, bottom)


class WholePlanePath(PoolingPath):
    """A window spanning the whole plane: a reduction over it."""

    def forward(self, bottom, top):
        xp = self.layer.xp
        x = bottom[0].data
        n, c = x.shape[:2]
        flat = x.reshape(n, c, -1)
        out = top[0].data.reshape(n, c)
        if self.max:
            # argmax returns the first maximum: Caffe's strictly-greater scan order.
            winner = self.plane_winner = xp.argmax(flat, axis=2)
            out[...] = xp.take_along_axis(flat, winner[:, :, None], axis=2)[:, :, 0]
            if len(top) > 1:
                top[1].data.reshape(n, c)[...] = winner
        else:
            xp.mean(flat, axis=2, out=out)

    def backward(self, top, propagate_down, bottom):
        xp = self.layer.xp
        top_diff, bottom_diff = top[0].diff, bottom[0].diff
        n, c = top_diff.shape[:2]
        flat = bottom_diff.reshape(n, c, -1)
        grad = top_diff.reshape(n, c, 1)
        if self.max:
            cells = xp.arange(flat.shape[2])
            xp.multiply(cells == self.plane_winner[:, :, None], grad, out=flat)
        else:
            flat[...] = grad / flat.shape[2]


class WindowGemmPath(PoolingPath):
    """AVE over a small plane as one GEMM with the (H*W, Ph*Pw) matrix of window weights."""

    def __init__(self, layer, choice, shape, tops):
        super().__init__(layer, choice, shape, tops)
        self.matrix, self.matrix_t = self._weights(shape[2:], layer.kernel_now)

    def _weights(self, in_hw, kernel):
        """The matrix of AVE: cell (h, w) weighs 1/area in each window it is in; and its
        transpose."""
        layer = self.layer
        weights = []
        for a in (0, 1):
            start = layer.window_starts(a)
            cells = np.arange(in_hw[a])[:, None]
            weights.append((cells >= start) & (cells < start + kernel[a]))
        inside = (weights[0][:, None, :, None] & weights[1][None, :, None, :])
        matrix = inside * layer.inverse_window_area(in_hw, kernel)[None, None]
        matrix = matrix.reshape(in_hw[0] * in_hw[1], -1).astype(layer.dtype)
        return matrix, np.ascontiguousarray(matrix.T)

    def forward(self, bottom, top):
        x = bottom[0].data
        n, c = x.shape[:2]
        np.matmul(x.reshape(n * c, -1), self.matrix, out=top[0].data.reshape(n * c, -1))

    def backward(self, top, propagate_down, bottom):
        top_diff = top[0].diff
        n, c = top_diff.shape[:2]
        np.matmul(top_diff.reshape(n * c, -1), self.matrix_t,
                  out=bottom[0].diff.reshape(n * c, -1))


class CompiledLoopsPath(PoolingPath):
    """MAX and AVE as compiled loops (kernels.pool_loops), one chunk of samples per thread."""

    def __init__(self, layer, choice, shape, tops):
        super().__init__(layer, choice, shape, tops)
        self.loops = pool_loops.load()
        n, c, h, w = shape
        if self.max:
            self.winner = np.zeros((n, c) + layer.out_hw, dtype=tag_type(layer.kernel_now))
        else:
            self.inv_area = layer.inverse_window_area((h, w), layer.kernel_now)

    def _for_each_sample(self, n, sample_elements, body):
        # One chunk per thread: a compiled call makes one pass, with no temporaries to keep
        # in the cache.
        for_each_chunk(np, n, body, item_elements=sample_elements, cache_sized=False,
                       runner=self.runner())

    def forward(self, bottom, top):
        layer = self.layer
        loops, (kh, kw), (sh, sw), (ph, pw) = (self.loops, layer.kernel_now, layer.stride,
                                               layer.pad)
        x = bottom[0].data
        n, c, h, w = x.shape
        planes = x.reshape(n * c, h, w)
        out = top[0].data.reshape((n * c,) + layer.out_hw)
        if self.max:
            winner = self.winner.reshape(out.shape)
            mask = top[1].data.reshape(out.shape) if len(top) > 1 else out
            lowest = x.dtype.type(_LOWEST)
            separable = self.choice.option("separable_max")

            def body(start, stop):
                loops.max_forward(planes, out, winner, mask, start * c, stop * c,
                                  kh, kw, sh, sw, ph, pw, lowest, len(top) > 1, separable)
        else:
            def body(start, stop):
                loops.ave_forward(planes, out, self.inv_area, start * c, stop * c,
                                  kh, kw, sh, sw, ph, pw)
        self._for_each_sample(n, x[0].size, body)

    def backward(self, top, propagate_down, bottom):
        layer = self.layer
        loops, (kh, kw), (sh, sw), (ph, pw) = (self.loops, layer.kernel_now, layer.stride,
                                               layer.pad)
        top_diff, bottom_diff = top[0].diff, bottom[0].diff
        n, c, h, w = bottom_diff.shape
        planes = bottom_diff.reshape(n * c, h, w)
        grad = top_diff.reshape((n * c,) + layer.out_hw)
        if self.max:
            winner = self.winner.reshape(grad.shape)

            def body(start, stop):
                loops.max_backward(grad, winner, planes, start * c, stop * c, kh, kw, sh, sw,
                                   ph, pw)
        else:
            def body(start, stop):
                loops.ave_backward(grad, self.inv_area, planes, start * c, stop * c,
                                   kh, kw, sh, sw, ph, pw)
        self._for_each_sample(n, bottom_diff[0].size, body)


class OffsetPassesPath(PoolingPath):
    """One pass per kernel offset over the padded input's stride phases (the device path);
    on the CPU, MAX backward may scatter by winner index instead (the choice's
    `max_backward`)."""

    def __init__(self, layer, choice, shape, tops):
        super().__init__(layer, choice, shape, tops)
        xp, kernel = layer.xp, layer.kernel_now
        n, c, h, w = shape
        fill = -np.inf if self.max else 0
        self.windows = windows = ShiftedWindows(xp, layer.dtype, shape, kernel, layer.stride,
                                                layer.pad, layer.out_hw, fill)
        length, margin = windows.length, windows.margin
        # Kept from forward to backward (the per-call temporaries come from `scratch`).
        # The gathering backward reads the winner tags and the grid diff (made on its first
        # use), so they carry `margin` leading cells; those and the junk cells stay 0.
        self.grid_diff_stored = None
        self.by_index = choice.option("max_backward") == "index-scatter"
        if self.max:
            # Per grid cell, 1 + the kernel offset that won (0: none); offsets are scanned in
            # increasing order, so "the latest strictly greater one" is a running maximum of
            # greater * (offset + 1): small-int arithmetic instead of slow masked copies.
            self.winner_stored = xp.zeros(margin + length, dtype=tag_type(kernel))
            self.winner_grid = self.winner_stored[margin:]
            # The tags of the real outputs, (N, C, Ph, Pw): what a device twin reproduces.
            self.winner = windows.valid(self.winner_grid)
            self.mask_delta = self._mask_offsets((h, w), kernel) if tops > 1 else None
            if xp is np:
                self.index_table, self.index_base = self._winner_indices(shape, kernel)
        else:
            self.inv_area = layer.inverse_window_area((h, w), kernel)

    def _mask_offsets(self, in_hw, kernel):
        """(window start index h0*W + w0 per output, table of i*W + j per offset + 1).

        The mask value of an output is start + table[winner]; table[0] (no winner) is unused.
        """
        layer, xp = self.layer, self.layer.xp
        start = (layer.window_starts(0)[:, None] * in_hw[1] + layer.window_starts(1)[None, :])
        i, j = xp.divmod(xp.arange(kernel[0] * kernel[1]), kernel[1])
        table = xp.concatenate([xp.zeros(1, dtype=i.dtype), i * in_hw[1] + j])
        return start.astype(layer.dtype), table.astype(layer.dtype)

    def _winner_indices(self, shape, kernel):
        """(flat offset i*W + j of each winner tag, flat bottom index of each output's window
        start, (N, C, Ph, Pw)): a winner's index in the whole bottom is their sum."""
        layer = self.layer
        n, c, h, w = shape
        i, j = np.divmod(np.arange(kernel[0] * kernel[1]), kernel[1])
        table = np.concatenate([np.zeros(1, dtype=np.intp), i * w + j]).astype(np.intp)
        start = (layer.window_starts(0)[:, None] * w + layer.window_starts(1)[None, :])
        planes = np.arange(n * c, dtype=np.intp).reshape(n, c, 1, 1) * (h * w)
        return table, planes + start.astype(np.intp)

    def _for_each_chunk(self, body):
        """body(start, stop) over chunks of samples, threaded on the CPU (kernels.parallel)."""
        windows = self.windows
        for_each_chunk(self.layer.xp, windows.grid_shape[0], body,
                       item_elements=windows.sample_length, runner=self.runner())

    # -- forward ---------------------------------------------------------------------------
    def forward(self, bottom, top):
        layer, windows = self.layer, self.windows
        x = bottom[0].data
        # Per-call temporaries: the padded input in phases, the running result, and for MAX
        # the comparison flags and the candidate tags.
        scratch = [layer.scratch(0, windows.phases_shape), layer.scratch(1, (windows.length,))]
        if self.max:
            scratch += [layer.scratch(2, (windows.length,), bool),
                        layer.scratch(3, (windows.length,), self.winner_grid.dtype)]
        self._for_each_chunk(
            lambda start, stop: self._forward_samples(x, top, scratch, start, stop))

    def _forward_samples(self, x, top, scratch, start, stop):
        """Forward of samples [start, stop): load them, reduce block by block (each block's
        operands stay in the cache across the kernel offsets), write their tops."""
        xp, windows = self.layer.xp, self.windows
        phases, best = scratch[:2]
        windows.load(x, phases, start, stop)
        for lo, hi in windows.blocks(start, stop, self.runner().chunk_elements):
            if self.max:
                self._max_block(scratch, lo, hi)
            else:
                total = best[lo:hi]
                total[...] = 0
                for _, index, shift in windows.offsets:
                    total += windows.window(phases, index, shift, lo, hi)
        pooled = windows.valid(best)[start:stop]
        if not self.max:
            xp.multiply(pooled, self.inv_area, out=top[0].data[start:stop])
            return
        top[0].data[start:stop] = pooled
        if len(top) > 1:
            self._write_mask(top[1].data[start:stop], windows.valid(self.winner_grid)[start:stop])

    def _max_block(self, scratch, lo, hi):
        """Running maximum and winner tags of grid cells [lo, hi) over the kernel offsets."""
        # Padding holds -inf and the running maximum starts at -FLT_MAX, so a padded cell never
        # wins; fmax keeps the old value on NaN, as Caffe's "x > max" does; ties keep the
        # earlier offset (a later one must be strictly greater).
        xp, windows = self.layer.xp, self.windows
        phases, best, greater, candidate = scratch
        best, greater, candidate = best[lo:hi], greater[lo:hi], candidate[lo:hi]
        winner = self.winner_grid[lo:hi]
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
        xp = self.layer.xp
        start, table = self.mask_delta
        xp.take(table, won, out=mask)
        mask += start + 1
        mask *= won > 0
        mask -= 1

    # -- backward --------------------------------------------------------------------------
    def backward(self, top, propagate_down, bottom):
        layer, windows = self.layer, self.windows
        top_diff, bottom_diff = top[0].diff, bottom[0].diff
        if self.max and self.by_index:
            self._backward_max_by_index(top_diff, bottom_diff)
            return
        if self.grid_diff_stored is None:
            self.grid_diff_stored = layer.xp.zeros(windows.margin + windows.length,
                                                   dtype=layer.dtype)
            self.grid_diff = self.grid_diff_stored[windows.margin:]
        # Per-call temporaries: the gradient per phase cell, and for MAX the won flags.
        scratch = (layer.scratch(0, windows.phases_shape),
                   layer.scratch(1, (windows.length,)))
        self._for_each_chunk(lambda start, stop: self._backward_samples(
            top_diff, bottom_diff, scratch, start, stop))

    def _backward_samples(self, top_diff, bottom_diff, scratch, start, stop):
        """Backward of samples [start, stop): each input cell gathers, offset by offset, the
        gradient of the outputs that read it (MAX: of those it won)."""
        xp, windows = self.layer.xp, self.windows
        outputs = windows.valid(self.grid_diff)[start:stop]
        if self.max:
            outputs[...] = top_diff[start:stop]
        else:
            xp.multiply(top_diff[start:stop], self.inv_area, out=outputs)
        phase_diff, won_flags = scratch
        for lo, hi in windows.blocks(start, stop, self.runner().chunk_elements):
            written = set()
            for tag, index, shift in windows.offsets:
                target = windows.window(phase_diff, index, 0, lo, hi)
                sent = windows.margin_slice(self.grid_diff_stored, shift, lo, hi)
                if self.max:
                    won = won_flags[lo:hi]
                    tags = windows.margin_slice(self.winner_stored, shift, lo, hi)
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

    def _backward_max_by_index(self, top_diff, bottom_diff):
        """MAX backward on the CPU: bottom diff = 0, then each top diff added at its winner's
        flat bottom index, outputs in order (Caffe's loop). Windows that read no cell
        (winner tag 0) send nothing."""
        layer, won = self.layer, self.winner
        # A net's workspace slot is bytes, shared with the forward's phases (slot 0); a layer
        # without one keeps an array per slot, which a change of shape or dtype reallocates.
        index = layer.scratch(0 if layer.ctx.workspace is not None else 4, won.shape, np.intp)
        flat_diff = bottom_diff.reshape(-1)

        def body(start, stop):
            tags = won[start:stop]
            cells = index[start:stop]
            np.take(self.index_table, tags, out=cells, mode="clip")
            cells += self.index_base[start:stop]
            bottom_diff[start:stop] = 0
            sent = top_diff[start:stop]
            if not tags.all():
                # A window with no winner (it read no cell, or only -inf/NaN) sends 0, to a
                # cell of this chunk (its start may lie outside the bottom).
                empty = tags == 0
                sent = sent * ~empty
                np.putmask(cells, empty, start * flat_diff.size // won.shape[0])
            np.add.at(flat_diff, cells.reshape(-1), sent.reshape(-1))

        for_each_chunk(layer.xp, won.shape[0], body, item_elements=won[0].size * 4,
                       cache_sized=False, runner=self.runner())


class CudaKernelsPath(PoolingPath):
    """MAX and AVE on a GPU, one CUDA kernel per pass (kernels.cuda_kernels): forward a
    thread per output cell, backward a thread per input cell gathering from the windows
    that read it (no atomics; the offset passes' order of accumulation)."""

    def __init__(self, layer, choice, shape, tops):
        super().__init__(layer, choice, shape, tops)
        n, c = shape[:2]
        if self.max:
            self.winner = layer.xp.zeros((n, c) + layer.out_hw,
                                         dtype=tag_type(layer.kernel_now))

    def geometry(self):
        layer = self.layer
        return layer.kernel_now, layer.pad, layer.stride

    def forward(self, bottom, top):
        x, out = bottom[0].data, top[0].data
        if self.max:
            cuda_kernels.max_pool_forward(x, *self.geometry(), self.layer.out_hw, out,
                                          self.winner, top[1].data if len(top) > 1 else None)
        else:
            cuda_kernels.ave_pool_forward(x, *self.geometry(), self.layer.out_hw, out)

    def backward(self, top, propagate_down, bottom):
        top_diff, bottom_diff = top[0].diff, bottom[0].diff
        if self.max:
            cuda_kernels.max_pool_backward(top_diff, self.winner, *self.geometry(),
                                           bottom_diff)
        else:
            cuda_kernels.ave_pool_backward(top_diff, *self.geometry(), bottom_diff)


def _both(paths: dict) -> dict:
    """Each device path under its CPU name and its `gpu-` name (the same array code)."""
    return {**paths, **{f"gpu-{name}": cls for name, cls in paths.items()}}


#: Pooling's paths by name.
PATHS = {**_both({"stochastic": StochasticPath, "whole-plane": WholePlanePath,
                  "offset-passes": OffsetPassesPath}),
         "window-gemm": WindowGemmPath, "compiled-loops": CompiledLoopsPath,
         "gpu-cuda-kernels": CudaKernelsPath}
