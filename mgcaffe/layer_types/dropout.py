"""Dropout: in TRAIN, zero each value with probability p and scale the rest by 1/(1-p)."""

from __future__ import annotations

from .base import TRAIN
from .neuron import NeuronLayer
from .registry import register_layer


@register_layer
class DropoutLayer(NeuronLayer):
    """TRAIN: y = x * mask / (1 - p), mask ~ Bernoulli(1 - p), and the same scale on the
    gradient. TEST: the identity. Masks come from `self.rng`, so a seeded net repeats them.
    """

    type = "Dropout"

    def layer_setup(self, bottom, top):
        self.ratio = float(self.param.dropout_param.dropout_ratio)
        if not 0.0 <= self.ratio < 1.0:
            raise self.error(f"dropout_ratio must be in [0, 1), got {self.ratio}")
        self.scale = 1.0 / (1.0 - self.ratio)
        self._mask = None  # kept values hold `scale`, dropped ones 0

    def forward(self, bottom, top):
        xp, x, y = self.xp, bottom[0].data, top[0].data
        if self.phase != TRAIN:
            if y is not x:
                xp.copyto(y, x)
            return
        if self._mask is None or self._mask.shape != x.shape:
            self._mask = xp.empty(x.shape, dtype=self.dtype)
        mask = self._mask
        self.rng.random(dtype=self.dtype, out=mask)
        xp.greater_equal(mask, self.dtype.type(self.ratio), out=mask)
        mask *= self.dtype.type(self.scale)
        xp.multiply(x, mask, out=y)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy, dx = top[0].diff, bottom[0].diff
        if self.phase != TRAIN:
            if dx is not dy:
                self.xp.copyto(dx, dy)
            return
        self.xp.multiply(dy, self._mask, out=dx)
