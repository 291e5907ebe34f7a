"""Reduction: reduce all axes from `axis` on by SUM, ASUM, SUMSQ or MEAN, times coeff."""

from __future__ import annotations

from ..proto import caffe_pb2
from .base import Layer
from .layer_util import canonical_axis, count
from .registry import register_layer

_Op = caffe_pb2.ReductionParameter


@register_layer
class ReductionLayer(Layer):
    """top (shape bottom.shape[:axis]) = coeff * op over the trailing axes (default axis 0:
    a scalar). ASUM is the sum of |x|, SUMSQ the sum of x^2, MEAN the sum over their count."""

    type = "Reduction"
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.reduction_param
        self.op = p.operation
        if self.op not in (_Op.SUM, _Op.ASUM, _Op.SUMSQ, _Op.MEAN):
            raise self.error(f"unknown operation {self.op}; expected SUM, ASUM, SUMSQ or MEAN")
        self.coeff = float(p.coeff)

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        axis = canonical_axis(self, int(self.param.reduction_param.axis), max(len(shape), 1))
        self._num = count(shape, 0, axis)
        self._dim = count(shape, axis)
        top[0].reshape(shape[:axis])

    def forward(self, bottom, top):
        x = bottom[0].data.reshape(self._num, self._dim)
        if self.op == _Op.ASUM:
            x = self.xp.abs(x)
        elif self.op == _Op.SUMSQ:
            x = x * x
        scale = self.coeff / self._dim if self.op == _Op.MEAN else self.coeff
        total = x.sum(axis=1)
        total *= self.dtype.type(scale)
        top[0].data[...] = total.reshape(top[0].shape)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = self.xp
        x = bottom[0].data.reshape(self._num, self._dim)
        dx = bottom[0].diff.reshape(self._num, self._dim)
        scale = self.coeff / self._dim if self.op == _Op.MEAN else self.coeff
        dy = top[0].diff.reshape(self._num, 1) * self.dtype.type(scale)
        if self.op == _Op.ASUM:
            xp.multiply(xp.sign(x), dy, out=dx)
        elif self.op == _Op.SUMSQ:
            xp.multiply(x, dy, out=dx)
            dx *= 2
        else:
            dx[...] = dy
