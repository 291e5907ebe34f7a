"""SPP: spatial pyramid pooling (Caffe's SPPLayer), built from Pooling layers.

Level l (0 .. pyramid_height-1) pools the (N, C, H, W) bottom into 2^l x 2^l bins with
kernel ceil(H / 2^l), stride = kernel and pad (kernel * 2^l - H + 1) // 2 (likewise for W),
by spp_param.pool (MAX, AVE or STOCHASTIC). With pyramid_height 1 the top is that one
pooling's (N, C, 1, 1); otherwise the levels are flattened per item and concatenated:
(N, C * sum_l 4^l). The geometry is recomputed when the bottom's shape changes.
"""

from __future__ import annotations

import math

from ..blob import Blob
from ..proto import caffe_pb2
from .base import Layer
from .registry import create_layer, register_layer


def level_geometry(level: int, size: int) -> tuple[int, int]:
    """(kernel = stride, pad) of pyramid level `level` along an axis of length `size`."""
    bins = 2 ** level
    kernel = math.ceil(size / bins)
    return kernel, (kernel * bins - size + 1) // 2


@register_layer
class SPP(Layer):
    """Pool at several grid sizes and concatenate; see the module docstring."""

    type = "SPP"
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.spp_param
        self.levels = int(p.pyramid_height)
        if self.levels < 1:
            raise self.error("spp_param.pyramid_height must be at least 1")
        self.pool = p.pool
        self._geometry_for = None

    def _build(self, shape):
        _, _, h, w = shape
        if h <= 0 or w <= 0:
            raise self.error("input dimensions cannot be zero")
        self._pools, self._outs = [], []
        for level in range(self.levels):
            (kh, ph), (kw, pw) = level_geometry(level, h), level_geometry(level, w)
            param = caffe_pb2.LayerParameter(name=f"{self.name}_pool{level}", type="Pooling")
            pp = param.pooling_param
            pp.pool = self.pool  # SPP's MAX, AVE, STOCHASTIC share Pooling's numbers
            pp.kernel_h, pp.kernel_w, pp.stride_h, pp.stride_w = kh, kw, kh, kw
            pp.pad_h, pp.pad_w = ph, pw
            layer = create_layer(param, self.ctx)
            out = Blob((), xp=self.xp, dtype=self.dtype, name=param.name)
            try:
                layer.setup([self._input], [out])
            except Exception as exc:  # noqa: BLE001 - re-raised naming this layer
                raise self.error(f"pyramid level {level} on a {h}x{w} input: {exc}") from None
            self._pools.append(layer)
            self._outs.append(out)
        self._geometry_for = shape

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if len(shape) != 4:
            raise self.error(f"input must have 4 axes (num, channels, height, width), got "
                             f"shape {shape}")
        self._input = bottom[0]
        if self._geometry_for != shape:
            self._build(shape)
        else:
            for layer, out in zip(self._pools, self._outs):
                layer.reshape([bottom[0]], [out])
        if self.levels == 1:
            top[0].reshape(self._outs[0].shape)
        else:
            top[0].reshape((shape[0], sum(o.count // shape[0] for o in self._outs)))

    def forward(self, bottom, top):
        n = bottom[0].shape[0]
        start = 0
        out2 = top[0].data.reshape(n, -1)
        for layer, out in zip(self._pools, self._outs):
            layer.forward(bottom, [out])
            width = out.count // n
            out2[:, start:start + width] = out.data.reshape(n, width)
            start += width

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        n = bottom[0].shape[0]
        diff2 = top[0].diff.reshape(n, -1)
        total = self.xp.zeros_like(bottom[0].diff)
        start = 0
        for layer, out in zip(self._pools, self._outs):
            width = out.count // n
            out.diff[...] = diff2[:, start:start + width].reshape(out.shape)
            start += width
            layer.backward([out], [True], bottom)
            total += bottom[0].diff
        bottom[0].diff[...] = total
