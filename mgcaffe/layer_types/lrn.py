"""LRN (local response normalisation), Caffe's two regions, with the exact backward.

ACROSS_CHANNELS: scale = k + alpha/n * (sum of x^2 over the n channels centred on c),
top = x * scale^-beta.
WITHIN_CHANNEL: Caffe composes it from split, square, AVE pooling (kernel n, stride 1, pad
(n-1)/2, padded cells counted) and power (shift 1, scale alpha): scale = 1 + alpha/n^2 *
(sum of x^2 over the n x n cells centred on (h, w)); `k` is ignored, as in Caffe.

Backward for both: dx = dtop * scale^-beta - 2*alpha*beta/area * x * window_sum(dtop * top /
scale), area n or n^2; the window is symmetric since n must be odd (Caffe requires it).

How the layer runs is its path, chosen in `layer_setup` by `choice.normalization.choose_lrn`
from the region, the target and `ctx.rules.lrn`: on the CPU, ACROSS_CHANNELS runs as compiled
loops (`kernels/lrn_loops.py`, numba) where numba can be imported; WITHIN_CHANNEL and
`LRNRules(compiled=False)` keep the numpy passes. On a GPU, ACROSS_CHANNELS runs as one
CUDA kernel each way (`kernels/cuda_lrn.py`) where its type has one and the layer is not in
place.
"""

from __future__ import annotations

from math import prod

import numpy as np

from ..cpu.parallel import for_each_chunk
from ..kernels.cuda import lrn as cuda_lrn
from ..kernels.loops import lrn as lrn_loops
from ..proto import caffe_pb2
from .base import Layer
from .choice.normalization import choose_lrn
from .registry import register_layer

_R = caffe_pb2.LRNParameter


def window_sum(xp, src, out, axis: int, half: int):
    """out = sum of src over [i - half, i + half] along `axis`, zero outside (out != src)."""
    out[...] = src
    size = src.shape[axis]

    def along(start, stop):
        index = [slice(None)] * src.ndim
        index[axis] = slice(start, stop)
        return tuple(index)

    for d in range(1, min(half, size - 1) + 1):
        out[along(0, size - d)] += src[along(d, size)]
        out[along(d, size)] += src[along(0, size - d)]
    return out


@register_layer
class LRN(Layer):
    """Caffe's LRN: ACROSS_CHANNELS or WITHIN_CHANNEL normalisation of a 4-D bottom."""

    type = "LRN"
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.lrn_param
        self.size = int(p.local_size)
        if self.size % 2 != 1:
            raise self.error(f"LRN only supports odd values for local_size, got {self.size}")
        self.alpha, self.beta, self.k = float(p.alpha), float(p.beta), float(p.k)
        self.region = p.norm_region
        if self.region == _R.ACROSS_CHANNELS:
            self.area, self.axes = self.size, (1,)
        else:
            self.area, self.axes = self.size * self.size, (2, 3)
            self.k = 1.0  # Caffe's power layer uses shift 1 whatever k says
        self.half = (self.size - 1) // 2
        self.rules = self.ctx.rules.lrn
        self.choice = choose_lrn(self.region == _R.ACROSS_CHANNELS, self.dtype.name,
                                 self.choice_target(), self.rules)
        self._loops = lrn_loops.load() if self.choice.path == "compiled-loops" else None

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if len(shape) != 4:
            raise self.error(f"input must have 4 axes (num, channels, height, width), got "
                             f"shape {shape}")
        top[0].reshape(shape)
        if getattr(self, "_scale", None) is None or self._scale.shape != shape:
            empty = self.xp.empty
            self._scale = empty(shape, dtype=self.dtype)
            # scale^-beta, kept from forward for backward (pow is the costly elementwise op)
            self._scale_pow = empty(shape, dtype=self.dtype)

    def _local_sum(self, src, out, start, stop, rows):
        """The window sum of samples [start, stop) of src over this layer's region, into out
        (WITHIN_CHANNEL sums along rows first, into `rows`)."""
        src, out = src[start:stop], out[start:stop]
        if len(self.axes) == 1:
            return window_sum(self.xp, src, out, 1, self.half)
        window_sum(self.xp, src, rows[start:stop], 2, self.half)
        return window_sum(self.xp, rows[start:stop], out, 3, self.half)

    def _temporaries(self, shape):
        """This call's work array, and the row sums' array for WITHIN_CHANNEL (else None)."""
        rows = self.scratch(1, shape) if len(self.axes) == 2 else None
        return self.scratch(0, shape), rows

    def _by_sample(self, body, shape):
        """body(start, stop) over chunks of samples on the CPU cores (kernels.parallel): each
        sample's normalisation is independent, and every pass is a memory-bound loop."""
        for_each_chunk(self.xp, shape[0], body, item_elements=prod(shape[1:]),
                       runner=self.ctx.chunk_runner)

    def _flat(self, *arrays):
        """(N, C, H*W) views of 4-D arrays, for the compiled loops."""
        return [a.reshape(a.shape[0], a.shape[1], -1) for a in arrays]

    def _by_sample_compiled(self, body, shape):
        # One chunk per thread: a compiled call makes one pass over its samples.
        for_each_chunk(np, shape[0], body, item_elements=prod(shape[1:]), cache_sized=False,
                       runner=self.ctx.chunk_runner)

    def _forward_compiled(self, x, y):
        flat = self._flat(x, y, self._scale, self._scale_pow)
        t = x.dtype.type
        a, k = t(self.alpha / self.area), t(self.k)
        three_quarters = self.beta == 0.75

        def samples(start, stop):
            self._loops.across_forward(*flat, start, stop, self.half, a, k, three_quarters)
            if not three_quarters:  # numpy's power is vectorised, numba's is not
                chunk = slice(start, stop)
                np.power(self._scale[chunk], -self.beta, out=self._scale_pow[chunk])
                np.multiply(x[chunk], self._scale_pow[chunk], out=y[chunk])

        self._by_sample_compiled(samples, x.shape)

    def _backward_compiled(self, x, top_data, top_diff, diff):
        flat = self._flat(x, top_data, top_diff, self._scale, self._scale_pow, diff)
        coef = x.dtype.type(-2.0 * self.alpha * self.beta / self.area)

        def samples(start, stop):
            self._loops.across_backward(*flat, start, stop, self.half, coef)

        self._by_sample_compiled(samples, x.shape)

    def _use_loops(self, *arrays) -> bool:
        # The loops take (N, C, H*W) views: contiguous arrays only (blobs always are).
        return self._loops is not None and all(a.flags.c_contiguous for a in arrays)

    def _use_kernels(self, bottom, top) -> bool:
        # Not in place: a kernel thread reads the channels other threads write.
        return self.choice.path == "gpu-cuda-kernels" and bottom[0] is not top[0]

    def forward(self, bottom, top):
        x, y = bottom[0].data, top[0].data
        if self._use_kernels(bottom, top):
            cuda_lrn.lrn_across_forward(x, y, self._scale, self._scale_pow, self.half,
                                        self.alpha / self.area, self.k, self.beta)
            return
        if self._use_loops(x, y):
            self._forward_compiled(x, y)
            return
        work, rows = self._temporaries(x.shape)

        def samples(start, stop):
            xp, chunk = self.xp, slice(start, stop)
            xp.multiply(x[chunk], x[chunk], out=work[chunk])
            self._local_sum(work, self._scale, start, stop, rows)
            scale = self._scale[chunk]
            scale *= self.alpha / self.area
            scale += self.k
            xp.power(scale, -self.beta, out=self._scale_pow[chunk])
            xp.multiply(x[chunk], self._scale_pow[chunk], out=y[chunk])

        self._by_sample(samples, x.shape)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x, top_data, top_diff, diff = bottom[0].data, top[0].data, top[0].diff, bottom[0].diff
        if self._use_kernels(bottom, top):
            cuda_lrn.lrn_across_backward(x, top_data, top_diff, self._scale, self._scale_pow,
                                         diff, self.half,
                                         -2.0 * self.alpha * self.beta / self.area)
            return
        if self._use_loops(x, top_data, top_diff, diff):
            self._backward_compiled(x, top_data, top_diff, diff)
            return
        work, rows = self._temporaries(x.shape)

        def samples(start, stop):
            xp, chunk = self.xp, slice(start, stop)
            ratio = xp.multiply(top_diff[chunk], top_data[chunk], out=work[chunk])
            ratio /= self._scale[chunk]
            self._local_sum(work, diff, start, stop, rows)
            out = diff[chunk]
            out *= x[chunk]
            out *= -2.0 * self.alpha * self.beta / self.area
            out += xp.multiply(top_diff[chunk], self._scale_pow[chunk], out=ratio)

        self._by_sample(samples, x.shape)
