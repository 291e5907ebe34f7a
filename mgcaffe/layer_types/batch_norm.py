"""BatchNorm, as Caffe has it: normalisation only (a Scale layer adds the affine part).

Three blobs hold running statistics, not learned weights: blobs[0] the mean sum, blobs[1] the
variance sum (each channel), blobs[2] the scale factor (shape (1,)) both are divided by.
"""

from __future__ import annotations

import numpy as np

from ..cpu.parallel import for_each_chunk, runner_or_default
from ..kernels.cuda import norm as cuda_norm
from ..kernels.loops import batch_norm as batch_norm_loops
from ..kernels.loops import scale as scale_loops
from ..proto import caffe_pb2
from .base import TEST, Layer
from .choice.normalization import choose_batch_norm
from .layer_util import count, ensure_param_blob
from .registry import register_layer

_ZERO = caffe_pb2.FillerParameter(type="constant", value=0.0)


@register_layer
class BatchNormLayer(Layer):
    """y = (x - mean) / sqrt(var + eps) per channel (axis 1).

    TRAIN (use_global_stats false): batch statistics, and the running sums are updated as
    factor = maf*factor + 1, mean_sum = batch_mean + maf*mean_sum,
    var_sum = batch_var * m/(m-1) + maf*var_sum (m = values per channel).
    Global stats (the default in TEST): mean = mean_sum/factor, var = var_sum/factor
    (factor 0 gives 0 for both). use_global_stats defaults to (phase == TEST).
    """

    type = "BatchNorm"
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.batch_norm_param
        self.moving_average_fraction = float(p.moving_average_fraction)
        self.eps = float(p.eps)
        self.use_global_stats = (bool(p.use_global_stats) if p.HasField("use_global_stats")
                                 else self.phase == TEST)
        channels = self._channels(bottom[0])
        ensure_param_blob(self, 0, (channels,), _ZERO, "mean")
        ensure_param_blob(self, 1, (channels,), _ZERO, "variance")
        ensure_param_blob(self, 2, (1,), _ZERO, "scale_factor")
        self._pin_param_specs()
        # The statistics receive no gradient.
        self.param_propagate_down = [False, False, False]
        self._x_norm = None
        self._scratch = None
        self._std = None
        self._channel_values = None
        # The path (choice.normalization.choose_batch_norm): on the CPU, float32/float64,
        # numba importable, compiled row loops whose statistics and gradient sums are float64.
        self.choice = choose_batch_norm(np.dtype(self.dtype).name, self.choice_target(),
                                        self.ctx.rules.batch_norm)

    def _pin_param_specs(self):
        """Caffe forces the statistics out of optimisation: lr_mult 0 for all three blobs."""
        specs = self.param.param
        for i in range(len(self.blobs)):
            if i == len(specs):
                specs.add(lr_mult=0.0, decay_mult=0.0)
            elif specs[i].lr_mult != 0:
                raise self.error(f"param[{i}] has lr_mult {specs[i].lr_mult}; the BatchNorm "
                                 f"statistics cannot be learned parameters (use lr_mult: 0 or "
                                 f"omit the param block)")

    @staticmethod
    def _channels(blob):
        return 1 if blob.num_axes == 1 else blob.shape[1]

    def _view(self, array):
        """(N, C, spatial) view of an input-shaped array."""
        shape = array.shape
        channels = 1 if len(shape) == 1 else shape[1]
        return array.reshape(shape[0], channels, count(shape, 2))

    def reshape(self, bottom, top):
        if bottom[0].num_axes < 1:
            raise self.error("needs an input with at least 1 axis, got a scalar")
        channels = self._channels(bottom[0])
        if channels != self.blobs[0].count:
            raise self.error(f"input has {channels} channels but the statistics blobs have "
                             f"{self.blobs[0].count}")
        if top[0] is not bottom[0]:
            top[0].reshape(bottom[0].shape)
        # Batch statistics need the normalised input and a work buffer for backward; global
        # statistics need neither (their backward is dy / std).
        shape = bottom[0].shape
        if self.choice.path == "gpu-cuda-kernels" and (
                self._channel_values is None or self._channel_values.shape[1] != channels):
            # the kernels' per-channel mean, std and backward sums
            self._channel_values = self.xp.zeros((4, channels), dtype=self.dtype)
        if self.use_global_stats:
            self._x_norm = self._scratch = None
        elif self._x_norm is None or self._x_norm.shape != shape:
            self._x_norm = self.xp.zeros(shape, dtype=self.dtype)
            self._scratch = None  # numpy's passes allocate it (`_work`); the row loops never

    def _work(self):
        """numpy's input-sized work buffer (allocated on first use)."""
        if self._scratch is None or self._scratch.shape != self._x_norm.shape:
            self._scratch = self.xp.zeros(self._x_norm.shape, dtype=self.dtype)
        return self._scratch

    def loops(self):
        """The compiled row loops where they apply, else None (numpy's passes)."""
        return batch_norm_loops.load() if self.choice.path == "compiled-rows" else None

    def for_each_row(self, rows, body):
        """body(start, stop) over chunks of the (sample, channel) rows on the chunk threads."""
        for_each_chunk(np, rows[0], body, item_elements=max(1, rows[1]),
                       runner=runner_or_default(self.ctx.chunk_runner))

    def _global_stats(self):
        xp = self.xp
        factor = self.blobs[2].data
        # 1/factor, or 0 where the factor is 0 (a layer never run in TRAIN), as Caffe does.
        inverse = (factor != 0) / xp.where(factor == 0, 1, factor)
        return self.blobs[0].data * inverse, self.blobs[1].data * inverse

    def forward(self, bottom, top):
        if self.choice.path == "gpu-cuda-kernels":
            self._forward_kernels(bottom, top)
            return
        loops = self.loops()
        if loops is not None:
            self._forward_rows(loops, bottom, top)
            return
        xp = self.xp
        x, y = self._view(bottom[0].data), self._view(top[0].data)
        if self.use_global_stats:
            mean, var = self._global_stats()
        else:
            mean = x.mean(axis=(0, 2))
        xp.subtract(x, mean.reshape(1, -1, 1), out=y)
        if not self.use_global_stats:
            squares = self._view(self._work())
            xp.multiply(y, y, out=squares)
            var = squares.mean(axis=(0, 2))
            self._update_running_stats(mean, var, x.shape[0] * x.shape[2])
        std = var + self.dtype.type(self.eps)
        xp.sqrt(std, out=std)
        self._std = std.reshape(1, -1, 1)
        y /= self._std
        if not self.use_global_stats:
            # Kept for backward: a later in-place layer may overwrite the top.
            xp.copyto(self._view(self._x_norm), y)

    def _forward_kernels(self, bottom, top):
        """forward() as CUDA kernels (kernels.cuda_norm): the statistics and the running sums
        in one launch, the normalisation (and the kept copy) in another."""
        dims = self._view(bottom[0].data).shape
        mean, std = self._channel_values[0], self._channel_values[1]
        eps = self.dtype.type(self.eps)
        if self.use_global_stats:
            cuda_norm.bn_global_stats(*(b.data for b in self.blobs), mean, std, eps)
            cuda_norm.bn_forward(bottom[0].data, top[0].data, None, mean, std, dims, eps)
        else:
            m = dims[0] * dims[2]
            running = (*(b.data for b in self.blobs), self.moving_average_fraction,
                       m / (m - 1) if m > 1 else 1.0)
            cuda_norm.bn_forward(bottom[0].data, top[0].data, self._x_norm, mean, std, dims,
                                 eps, running)
        self._std = std.reshape(1, -1, 1)

    def _forward_rows(self, loops, bottom, top):
        """forward() as row loops: the statistics (`statistics_rows`), then y, and the kept
        copy, in one sweep."""
        rows, mean, std = self.statistics_rows(loops, bottom[0].data)
        n = bottom[0].shape[0]
        x, y = bottom[0].data.reshape(rows), top[0].data.reshape(rows)
        keep = None if self.use_global_stats else self._x_norm.reshape(rows)
        mean_rows, std_rows = np.tile(mean, n), np.tile(std, n)
        self.for_each_row(rows, lambda start, stop: loops.normalize(
            x, y, y if keep is None else keep, mean_rows, std_rows, keep is not None,
            start, stop))

    def statistics_rows(self, loops, data):
        """The (sample, channel) rows' shape of `data`, and the mean and std per channel: over
        the batch (each row's mean and squared deviations in float64, combined per channel;
        the running sums updated) or the global statistics. Sets the std backward uses."""
        n, c, inner = self._view(data).shape
        rows = (n * c, inner)
        if self.use_global_stats:
            mean, var = self._global_stats()
        else:
            x = data.reshape(rows)
            means, deviations = np.empty(rows[0]), np.empty(rows[0])
            self.for_each_row(rows, lambda start, stop: loops.row_moments(
                x, means, deviations, start, stop))
            means, deviations = means.reshape(n, c), deviations.reshape(n, c)
            # A channel's rows, each `inner` values: the pairwise update of the moments.
            mean64 = means.mean(axis=0)
            spread = deviations.sum(axis=0) + inner * ((means - mean64) ** 2).sum(axis=0)
            mean = mean64.astype(self.dtype)
            var = (spread / (n * inner)).astype(self.dtype)
            self._update_running_stats(mean, var, n * inner)
        std = var + self.dtype.type(self.eps)
        np.sqrt(std, out=std)
        self._std = std.reshape(1, -1, 1)
        return rows, mean, std

    def _update_running_stats(self, mean, var, m):
        maf = self.dtype.type(self.moving_average_fraction)
        mean_sum, var_sum, factor = (b.data for b in self.blobs)
        factor *= maf
        factor += 1
        mean_sum *= maf
        mean_sum += mean
        # Unbiased variance for the running estimate (m / (m - 1)), as Caffe does.
        correction = m / (m - 1) if m > 1 else 1.0
        var_sum *= maf
        var_sum += var * self.dtype.type(correction)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = self.xp
        dy, dx = self._view(top[0].diff), self._view(bottom[0].diff)
        if self.use_global_stats:
            xp.divide(dy, self._std, out=dx)
            return
        if self.choice.path == "gpu-cuda-kernels":
            cuda_norm.bn_backward(top[0].diff, self._x_norm, self._std, bottom[0].diff,
                                  dy.shape, (self._channel_values[2], self._channel_values[3]))
            return
        loops = self.loops()
        if loops is not None:
            self._backward_rows(loops, dy, dx)
            return
        # dx = (dy - mean(dy) - mean(dy * y) * y) / std, means over N and spatial.
        y = self._view(self._x_norm)
        work = self._view(self._work())
        m = dy.shape[0] * dy.shape[2]
        xp.multiply(dy, y, out=work)
        sum_dy_y = work.sum(axis=(0, 2)).reshape(1, -1, 1)
        sum_dy = dy.sum(axis=(0, 2)).reshape(1, -1, 1)
        xp.multiply(y, sum_dy_y, out=work)
        work += sum_dy
        work *= self.dtype.type(-1.0 / m)
        work += dy
        # In place dx aliases dy, which `work` has fully consumed by now.
        xp.divide(work, self._std, out=dx)

    def _backward_rows(self, loops, dy, dx):
        """backward() as row loops: the sums of dy and dy * y per row (float64), summed per
        channel; then dx in one sweep (it may overwrite dy: each row is read first)."""
        n, c, inner = dy.shape
        rows = (n * c, inner)
        dy, dx, y = dy.reshape(rows), dx.reshape(rows), self._x_norm.reshape(rows)
        sum_dy, sum_dy_y = np.empty(rows[0]), np.empty(rows[0])
        # scale_loops' dx and s are not asked for: stand-ins of their types, never read.
        stand_in = np.empty(1, dtype=dy.dtype)
        self.for_each_row(rows, lambda start, stop: scale_loops.load().backward(
            dy, y, dy, stand_in, sum_dy, sum_dy_y, True, True, False, start, stop))
        per_channel = [np.tile(sums.reshape(n, c).sum(axis=0).astype(self.dtype), n)
                       for sums in (sum_dy, sum_dy_y)]
        std_rows = np.tile(self._std.reshape(-1), n)
        scale = self.dtype.type(-1.0 / (n * inner))
        ones = np.ones(rows[0], dtype=self.dtype)  # no Scale after it: g = 1, d2 = dy
        self.for_each_row(rows, lambda start, stop: loops.scaled_input_grad(
            dy, y, y, dx, ones, *per_channel, std_rows, scale, False, False, start, stop))
