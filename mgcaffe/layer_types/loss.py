"""Loss layers on real-valued targets: EuclideanLoss, SigmoidCrossEntropyLoss.

SoftmaxWithLoss lives with Softmax (softmax.py); the label-based extras in loss_extra.py.
"""

from __future__ import annotations

from ..proto import caffe_pb2
from .layer_util import count
from .loss_base import LossLayer, normalization_mode, normalizer
from .registry import register_layer


@register_layer
class EuclideanLossLayer(LossLayer):
    """loss = sum((x0 - x1)^2) / (2 N), N = bottom[0].shape[0]. Both bottoms may take a
    gradient: +-(x0 - x1) / N, times the top diff (the loss weight)."""

    type = "EuclideanLoss"

    def allow_force_backward(self, bottom_index):
        return True

    def layer_setup(self, bottom, top):
        self._difference = None

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        if bottom[0].count != bottom[1].count:
            raise self.error(f"inputs need the same number of values, got shapes "
                             f"{bottom[0].shape} and {bottom[1].shape}")
        if self._difference is None or self._difference.shape != bottom[0].shape:
            self._difference = self.xp.zeros(bottom[0].shape, dtype=self.dtype)

    def forward(self, bottom, top):
        xp, d = self.xp, self._difference
        xp.subtract(bottom[0].data, bottom[1].data.reshape(d.shape), out=d)
        num = bottom[0].shape[0]
        top[0].data[...] = (d * d).sum() / self.dtype.type(2 * num)

    def backward(self, top, propagate_down, bottom):
        num = bottom[0].shape[0]
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                alpha = top[0].diff * self.dtype.type(sign / num)
                dx = bottom[i].diff.reshape(self._difference.shape)
                self.xp.multiply(self._difference, alpha, out=dx)


@register_layer
class SigmoidCrossEntropyLossLayer(LossLayer):
    """loss = -sum(t log s(x) + (1 - t) log(1 - s(x))) / normalizer, s the sigmoid, computed
    stably as max(x, 0) - x t + log(1 + exp(-|x|)). Normalisation BATCH_SIZE by default;
    targets equal to ignore_label contribute nothing (and count as invalid for VALID)."""

    type = "SigmoidCrossEntropyLoss"

    def layer_setup(self, bottom, top):
        lp = self.param.loss_param
        self.ignore_label = int(lp.ignore_label) if lp.HasField("ignore_label") else None
        self.mode = normalization_mode(lp, caffe_pb2.LossParameter.BATCH_SIZE)
        self._sigmoid = None

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        if bottom[0].count != bottom[1].count:
            raise self.error(f"scores and targets need the same count, got shapes "
                             f"{bottom[0].shape} and {bottom[1].shape}")
        self._outer = bottom[0].shape[0]
        self._inner = count(bottom[0].shape, 1)
        if self._sigmoid is None or self._sigmoid.shape != bottom[0].shape:
            self._sigmoid = self.xp.zeros(bottom[0].shape, dtype=self.dtype)

    def _valid(self, target):
        """Mask of targets that count, or None when no ignore_label is set."""
        if self.ignore_label is None:
            return None
        return target.astype(self.xp.int64) != self.ignore_label

    def forward(self, bottom, top):
        xp = self.xp
        x = bottom[0].data
        t = bottom[1].data.reshape(x.shape)
        s = self._sigmoid
        xp.multiply(x, 0.5, out=s)
        xp.tanh(s, out=s)
        s *= 0.5
        s += 0.5
        losses = xp.abs(x)
        xp.negative(losses, out=losses)
        xp.exp(losses, out=losses)
        xp.log1p(losses, out=losses)
        losses += xp.maximum(x, 0)
        losses -= x * t
        valid = self._valid(t)
        if valid is not None:
            losses *= valid
        valid_count = None if valid is None else valid.sum()
        self._normalizer = normalizer(self, self.mode, self._outer, self._inner, valid_count)
        top[0].data[...] = losses.sum() / self._normalizer

    def backward(self, top, propagate_down, bottom):
        self.reject_label_gradient(propagate_down)
        if not propagate_down[0]:
            return
        t = bottom[1].data.reshape(bottom[0].shape)
        dx = bottom[0].diff
        self.xp.subtract(self._sigmoid, t, out=dx)
        valid = self._valid(t)
        if valid is not None:
            dx *= valid
        dx *= top[0].diff / self._normalizer
