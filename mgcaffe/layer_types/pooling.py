"""Pooling (Caffe's): MAX (with its optional argmax mask top), AVE, STOCHASTIC, global pooling.

Output size, as Caffe computes it: ceil((in + 2*pad - kernel) / stride) + 1 (round_mode CEIL,
the default) or floor (FLOOR); then, when there is padding and the last window would start
inside it ((out - 1)*stride >= in + pad), one fewer.

MAX never picks a padded cell and keeps the first maximum in scan order (a later cell must be
strictly greater); a window that reads no input cell gives -FLT_MAX and mask -1, as in Caffe.
The mask top holds the flat index h*W + w of the winner within its channel plane, as a float.
AVE divides by the window clipped to the padded input (padded cells count, overhang past the
padded border does not).

How a layer pools is its path: `reshape` asks `choice.pooling` (a pure function of the
geometry, the target and `ctx.rules.pooling`) and keeps the answer as `layer.choice`; the
path objects (pooling_paths.py) run forward and backward. The offset passes are the device
path and are tested on the CPU too.
"""

from __future__ import annotations

import math

from ..proto import caffe_pb2
from . import pooling_paths
from .base import Layer
from .choice.pooling import PoolingGeometry, choose_pooling
from .registry import register_layer

_P = caffe_pb2.PoolingParameter
_METHODS = {_P.MAX: "MAX", _P.AVE: "AVE", _P.STOCHASTIC: "STOCHASTIC"}


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
        self.rules = self.ctx.rules.pooling
        self._shape = None

    def _pair(self, p, name):
        has_h, has_w = p.HasField(f"{name}_h"), p.HasField(f"{name}_w")
        if has_h or has_w:
            if p.HasField(name) or not (has_h and has_w):
                raise self.error(f"{name} is {name} OR {name}_h and {name}_w (both)")
            return int(getattr(p, f"{name}_h")), int(getattr(p, f"{name}_w"))
        return (int(getattr(p, name)),) * 2

    # -- shapes, the path ---------------------------------------------------------------
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
        if self._shape == (shape, kernel):
            return
        self._shape = (shape, kernel)
        self.out_hw = tuple(out)
        self.kernel_now = kernel  # the kernel in effect (the whole plane for global pooling)
        geometry = PoolingGeometry(_METHODS[self.method], (h, w), self.out_hw, kernel, self.pad,
                                   self.dtype.name)
        self.choice = choose_pooling(geometry, self.choice_target(), self.rules)
        self.path = pooling_paths.PATHS[self.choice.path](self, self.choice, shape, len(top))

    @property
    def _winner(self):
        """MAX's winner tag per output (N, C, Ph, Pw): 1 + the kernel offset that won, 0 for
        none (what a device twin reproduces); the offset and compiled paths keep them."""
        return self.path.winner

    def window_starts(self, axis):
        """Each output's window start along `axis` (in unpadded coordinates)."""
        return self.xp.arange(self.out_hw[axis]) * self.stride[axis] - self.pad[axis]

    def inverse_window_area(self, in_hw, kernel):
        """1 / (window area clipped to the padded input), per output position (Caffe's AVE)."""
        extents = []
        for a in (0, 1):
            start = self.window_starts(a)
            end = self.xp.minimum(start + kernel[a], in_hw[a] + self.pad[a])
            extents.append(end - start)
        area = (extents[0][:, None] * extents[1][None, :]).astype(self.dtype)
        # Caffe would divide by zero for a window that starts exactly at the padded border
        # (only possible with stride > kernel); such an output is empty, so we give it 0.
        return self.xp.where(area > 0, 1 / self.xp.where(area > 0, area, 1), 0).astype(
            self.dtype)

    def forward(self, bottom, top):
        self.path.forward(bottom, top)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        self.path.backward(top, propagate_down, bottom)
