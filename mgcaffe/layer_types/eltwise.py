"""Eltwise: element-wise SUM (with coefficients), PROD or MAX of several same-shaped bottoms."""

from __future__ import annotations

from ..proto import caffe_pb2
from .base import Layer
from .registry import register_layer

_Op = caffe_pb2.EltwiseParameter


@register_layer
class EltwiseLayer(Layer):
    """SUM: y = sum_i coeff_i * x_i. PROD: y = prod_i x_i. MAX: y = max_i x_i.

    MAX sends the gradient to the winning input. Ties follow Caffe: between the first two
    inputs the second wins; a later input takes over only when strictly greater.
    PROD's gradient is the product of the other inputs (stable_prod_grad, the default) or
    y / x_i.
    """

    type = "Eltwise"
    min_bottom = 2
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.eltwise_param
        self.op = p.operation
        if self.op not in (_Op.SUM, _Op.PROD, _Op.MAX):
            raise self.error(f"unknown operation {self.op}; expected SUM, PROD or MAX")
        if p.coeff and len(p.coeff) != len(bottom):
            raise self.error(f"takes one coeff per bottom: {len(p.coeff)} coeff for "
                             f"{len(bottom)} bottoms")
        if p.coeff and self.op != _Op.SUM:
            raise self.error("coeff is only allowed with operation SUM")
        self.coeffs = [float(c) for c in p.coeff] or [1.0] * len(bottom)
        self.stable_prod_grad = bool(p.stable_prod_grad)
        self._winner = None

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        for i, b in enumerate(bottom[1:], start=1):
            if b.shape != shape:
                raise self.error(f"all bottoms need the same shape: bottom[0] is {shape}, "
                                 f"bottom[{i}] is {b.shape}")
        top[0].reshape(shape)
        if self.op == _Op.MAX and (self._winner is None or self._winner.shape != shape):
            self._winner = self.xp.zeros(shape, dtype=self.xp.int32)

    def forward(self, bottom, top):
        xp, y = self.xp, top[0].data
        if self.op == _Op.SUM:
            rest = 1
            if self.coeffs[0] == 1 and self.coeffs[1] == 1:  # one pass for the first two
                xp.add(bottom[0].data, bottom[1].data, out=y)
                rest = 2
            else:
                xp.multiply(bottom[0].data, self.coeffs[0], out=y)
            for b, c in zip(bottom[rest:], self.coeffs[rest:]):
                if c == 1:
                    y += b.data
                else:
                    y += b.data * self.dtype.type(c)
        elif self.op == _Op.PROD:
            xp.multiply(bottom[0].data, bottom[1].data, out=y)
            for b in bottom[2:]:
                y *= b.data
        else:
            self._forward_max(bottom, y)

    def _forward_max(self, bottom, y):
        xp, winner = self.xp, self._winner
        a, b = bottom[0].data, bottom[1].data
        first_wins = a > b
        xp.copyto(y, b)
        xp.copyto(y, a, where=first_wins)
        xp.copyto(winner, 1)
        xp.copyto(winner, 0, where=first_wins)
        for i, blob in enumerate(bottom[2:], start=2):
            takes_over = blob.data > y
            xp.copyto(y, blob.data, where=takes_over)
            xp.copyto(winner, i, where=takes_over)

    def backward(self, top, propagate_down, bottom):
        xp, dy = self.xp, top[0].diff
        # A bottom computed in place (its diff is the top diff) goes last: its scaled or
        # masked diff would overwrite dy before the other bottoms read it.
        order = sorted(range(len(bottom)), key=lambda i: bottom[i].diff is dy)
        for i in order:
            blob = bottom[i]
            if not propagate_down[i]:
                continue
            dx = blob.diff
            if self.op == _Op.SUM:
                if self.coeffs[i] == 1:
                    xp.copyto(dx, dy)
                else:
                    xp.multiply(dy, self.coeffs[i], out=dx)
            elif self.op == _Op.MAX:
                xp.multiply(dy, self._winner == i, out=dx)
            else:
                self._prod_grad(bottom, top, i, dx)
                dx *= dy

    def _prod_grad(self, bottom, top, i, out):
        """d(prod)/d(x_i) into `out`."""
        xp = self.xp
        if not self.stable_prod_grad:
            xp.divide(top[0].data, bottom[i].data, out=out)
            return
        others = [b.data for j, b in enumerate(bottom) if j != i]
        xp.copyto(out, others[0])
        for other in others[1:]:
            out *= other
