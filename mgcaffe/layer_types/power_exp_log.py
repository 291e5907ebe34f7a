"""The affine-then-function neuron layers: Power, Exp and Log (Caffe's parameterisation)."""

from __future__ import annotations

import math

from .neuron import NeuronLayer
from .registry import register_layer


@register_layer
class PowerLayer(NeuronLayer):
    """y = (shift + scale * x) ^ power."""

    type = "Power"

    def layer_setup(self, bottom, top):
        p = self.param.power_param
        self.power, self.scale, self.shift = float(p.power), float(p.scale), float(p.shift)
        self.diff_scale = self.power * self.scale
        # The gradient depends on x unless it is constant (power 1, or power*scale 0).
        self.needs_input = self.diff_scale != 0 and self.power != 1

    def forward(self, bottom, top):
        self.keep_input(bottom, top)
        xp, y = self.xp, top[0].data
        if self.diff_scale == 0:
            # Caffe's special case: y is the constant shift^power (1 when power is 0).
            y[...] = 1.0 if self.power == 0 else self.shift ** self.power
            return
        xp.multiply(bottom[0].data, self.scale, out=y)
        if self.shift != 0:
            y += self.shift
        if self.power != 1:
            xp.power(y, self.power, out=y)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp, dy, dx = self.xp, top[0].diff, bottom[0].diff
        if self.diff_scale == 0:
            dx[...] = 0
            return
        if self.power == 1:
            xp.multiply(dy, self.diff_scale, out=dx)
            return
        # dy/dx = power * scale * (shift + scale*x)^(power - 1).
        base = self.input_data(bottom, top) * self.dtype.type(self.scale)
        if self.shift != 0:
            base += self.shift
        if self.power != 2:
            xp.power(base, self.power - 1, out=base)
        base *= self.diff_scale
        xp.multiply(dy, base, out=dx)


@register_layer
class ExpLayer(NeuronLayer):
    """y = base ^ (shift + scale * x); base -1 (the default) means e."""

    type = "Exp"

    def layer_setup(self, bottom, top):
        p = self.param.exp_param
        base = float(p.base)
        if base != -1 and base <= 0:
            raise self.error(f"exp_param.base must be -1 (for e) or > 0, got {base}")
        log_base = 1.0 if base == -1 else math.log(base)
        self.inner_scale = log_base * float(p.scale)
        self.outer_scale = 1.0 if p.shift == 0 else math.exp(log_base * float(p.shift))

    def forward(self, bottom, top):
        xp, y = self.xp, top[0].data
        xp.multiply(bottom[0].data, self.inner_scale, out=y)
        xp.exp(y, out=y)
        if self.outer_scale != 1:
            y *= self.outer_scale

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        # dy/dx = inner_scale * y, so the top data suffices (also in place).
        slope = top[0].data * self.dtype.type(self.inner_scale)
        self.xp.multiply(top[0].diff, slope, out=bottom[0].diff)


@register_layer
class LogLayer(NeuronLayer):
    """y = log_base(shift + scale * x); base -1 (the default) means e."""

    type = "Log"
    needs_input = True

    def layer_setup(self, bottom, top):
        p = self.param.log_param
        base = float(p.base)
        if base != -1 and base <= 0:
            raise self.error(f"log_param.base must be -1 (for e) or > 0, got {base}")
        self.base_scale = 1.0 if base == -1 else 1.0 / math.log(base)
        self.scale, self.shift = float(p.scale), float(p.shift)

    def _affine(self, x, out):
        self.xp.multiply(x, self.scale, out=out)
        if self.shift != 0:
            out += self.shift
        return out

    def forward(self, bottom, top):
        self.keep_input(bottom, top)
        y = self._affine(bottom[0].data, top[0].data)
        self.xp.log(y, out=y)
        if self.base_scale != 1:
            y *= self.base_scale

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = self.xp
        x = self.input_data(bottom, top)
        inner = self._affine(x, xp.empty_like(x))
        # dy/dx = scale * base_scale / (shift + scale*x).
        xp.divide(self.scale * self.base_scale, inner, out=inner)
        xp.multiply(top[0].diff, inner, out=bottom[0].diff)
