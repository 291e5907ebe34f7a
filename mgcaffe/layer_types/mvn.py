"""MVN: mean-variance normalisation per sample (across_channels) or per sample and channel.

top = (x - mean) / (std + eps) with normalize_variance (default), else x - mean; mean and
std (the biased one, sqrt(E[(x - mean)^2])) over the axes after 0 (across_channels) or after 1.
The gradient is Caffe's: with y the top and s = std + eps,
    dx = (dy - mean(dy) - y * mean(y * dy)) / s,
exact when eps is 0 (Caffe's default eps is 1e-9).
"""

from __future__ import annotations

from .base import Layer
from .registry import register_layer


@register_layer
class MVN(Layer):
    """Subtract the mean and, by default, divide by the standard deviation."""

    type = "MVN"
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.mvn_param
        self.normalize_variance = bool(p.normalize_variance)
        self.across_channels = bool(p.across_channels)
        self.eps = float(p.eps)

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if not shape:
            raise self.error("needs at least 1 axis (num)")
        # Caffe's legacy (num, channels, ...) view: a 1-axis blob has 1 channel.
        channels = shape[1] if len(shape) > 1 else 1
        self._rows = shape[0] * (1 if self.across_channels else channels)
        top[0].reshape(shape)

    def _matrix(self, array):
        return array.reshape(self._rows, -1)

    def forward(self, bottom, top):
        x = self._matrix(bottom[0].data)
        y = self._matrix(top[0].data)
        centred = x - x.mean(axis=1, keepdims=True)
        if self.normalize_variance:
            self._scale = self.xp.sqrt((centred * centred).mean(axis=1, keepdims=True))
            self._scale += self.eps
            centred /= self._scale
        y[...] = centred

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = self._matrix(top[0].diff)
        dx = self._matrix(bottom[0].diff)
        if self.normalize_variance:
            y = self._matrix(top[0].data)
            g = dy - dy.mean(axis=1, keepdims=True) - y * (y * dy).mean(axis=1, keepdims=True)
            dx[...] = g / self._scale
        else:
            dx[...] = dy - dy.mean(axis=1, keepdims=True)
