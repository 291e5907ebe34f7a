"""Less common Caffe losses: MultinomialLogisticLoss, HingeLoss, ContrastiveLoss."""

from __future__ import annotations

from ..backend import to_host
from ..proto import caffe_pb2
from .layer_util import count
from .loss_base import LossLayer
from .registry import register_layer

#: Caffe clips probabilities here before the log (kLOG_THRESHOLD).
LOG_THRESHOLD = 1e-20


def class_labels(layer, labels_blob, num: int, classes: int):
    """Labels (one per row) as ints on the device; an out-of-range label is a LayerError."""
    if labels_blob.count != num:
        raise layer.error(f"needs one label per row: {num} rows, {labels_blob.count} labels "
                          f"(shape {labels_blob.shape})")
    labels = labels_blob.data.reshape(num).astype(layer.xp.int64)
    bad = (labels < 0) | (labels >= classes)

    def error():
        label = int(to_host(labels[bad])[0])
        return layer.error(f"label {label} is out of range for {classes} classes")

    layer.check_on_device(bad.any(), error)  # on the GPU: read back with the loss
    return layer.xp.where(bad, 0, labels)  # never out of bounds until the check is read


class _RowLoss(LossLayer):
    """Scores seen as (N, dim) rows with one integer label per row."""

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self._rows = (bottom[0].shape[0], count(bottom[0].shape, 1))
        if bottom[1].count != self._rows[0]:
            raise self.error(f"needs one label per row: {self._rows[0]} rows, "
                             f"{bottom[1].count} labels (shape {bottom[1].shape})")


@register_layer
class MultinomialLogisticLossLayer(_RowLoss):
    """loss = -sum_n log(max(p[n, label_n], 1e-20)) / N, bottom[0] holding probabilities."""

    type = "MultinomialLogisticLoss"

    def forward(self, bottom, top):
        xp = self.xp
        num, dim = self._rows
        p = bottom[0].data.reshape(num, dim)
        self._labels = class_labels(self, bottom[1], num, dim)
        picked = xp.take_along_axis(p, self._labels[:, None], axis=1)
        self._picked = xp.maximum(picked, self.dtype.type(LOG_THRESHOLD))
        top[0].data[...] = -xp.log(self._picked).sum() / num

    def backward(self, top, propagate_down, bottom):
        self.reject_label_gradient(propagate_down)
        if not propagate_down[0]:
            return
        xp = self.xp
        num, dim = self._rows
        dx = bottom[0].diff.reshape(num, dim)
        scale = -top[0].diff / num
        one_hot = xp.arange(dim)[None, :] == self._labels[:, None]
        xp.multiply(one_hot, scale / self._picked, out=dx)


@register_layer
class HingeLossLayer(_RowLoss):
    """One-vs-all hinge: t = +1 for the label's class, -1 otherwise; margins
    max(0, 1 - t x); loss = sum(margins) / N (L1) or sum(margins^2) / N (L2)."""

    type = "HingeLoss"

    def layer_setup(self, bottom, top):
        self.norm = self.param.hinge_loss_param.norm
        if self.norm not in (caffe_pb2.HingeLossParameter.L1, caffe_pb2.HingeLossParameter.L2):
            raise self.error(f"unknown norm {self.norm}; expected L1 or L2")

    def forward(self, bottom, top):
        xp = self.xp
        num, dim = self._rows
        x = bottom[0].data.reshape(num, dim)
        labels = class_labels(self, bottom[1], num, dim)
        # sign = -t: +1 off the label, -1 on it.
        self._sign = 1 - 2 * (xp.arange(dim)[None, :] == labels[:, None]).astype(self.dtype)
        margins = x * self._sign
        margins += 1
        xp.maximum(margins, 0, out=margins)
        self._margins = margins
        total = margins.sum() if self.norm == caffe_pb2.HingeLossParameter.L1 else \
            (margins * margins).sum()
        top[0].data[...] = total / num

    def backward(self, top, propagate_down, bottom):
        self.reject_label_gradient(propagate_down)
        if not propagate_down[0]:
            return
        xp = self.xp
        num, dim = self._rows
        dx = bottom[0].diff.reshape(num, dim)
        scale = top[0].diff / num
        if self.norm == caffe_pb2.HingeLossParameter.L1:
            xp.multiply(xp.sign(self._margins), self._sign, out=dx)
        else:
            xp.multiply(self._margins, self._sign, out=dx)
            dx *= 2
        dx *= scale


@register_layer
class ContrastiveLossLayer(LossLayer):
    """Siamese loss on pairs (a, b) with similarity y (bottom[2], nonzero = similar):
    loss = sum(y d^2 + (1 - y) max(margin - d, 0)^2) / (2 N), d = ||a - b||;
    legacy_version uses max(margin - d^2, 0) for dissimilar pairs. Like Caffe, the
    dissimilar gradient divides by d + 1e-4."""

    type = "ContrastiveLoss"
    exact_num_bottom = 3

    def allow_force_backward(self, bottom_index):
        return bottom_index != 2

    def layer_setup(self, bottom, top):
        p = self.param.contrastive_loss_param
        self.margin = float(p.margin)
        self.legacy = bool(p.legacy_version)

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        num = bottom[0].shape[0]
        if bottom[1].shape != bottom[0].shape:
            raise self.error(f"the pair inputs need the same shape, got {bottom[0].shape} and "
                             f"{bottom[1].shape}")
        if bottom[2].count != num:
            raise self.error(f"needs one similarity label per pair: {num} pairs, "
                             f"{bottom[2].count} labels")
        self._rows = (num, count(bottom[0].shape, 1))

    def forward(self, bottom, top):
        xp = self.xp
        num, dim = self._rows
        self._diff = bottom[0].data.reshape(num, dim) - bottom[1].data.reshape(num, dim)
        dist_sq = (self._diff * self._diff).sum(axis=1)
        similar = bottom[2].data.reshape(num).astype(xp.int64) != 0
        if self.legacy:
            gap = self.margin - dist_sq
            dissimilar = xp.maximum(gap, 0)
        else:
            dist = xp.sqrt(dist_sq)
            gap = self.margin - dist
            dissimilar = xp.maximum(gap, 0) ** 2
            self._dist = dist
        self._similar, self._gap = similar, gap
        losses = xp.where(similar, dist_sq, dissimilar)
        top[0].data[...] = losses.sum() / self.dtype.type(2 * num)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[2]:
            raise self.error("cannot backpropagate to the similarity labels (bottom[2])")
        xp = self.xp
        num, _ = self._rows
        if self.legacy:
            beta = -xp.ones_like(self._gap)
        else:
            beta = -self._gap / (self._dist + self.dtype.type(1e-4))
        beta = xp.where(self._gap > 0, beta, 0)
        factor = xp.where(self._similar, 1, beta).astype(self.dtype)[:, None]
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                alpha = top[0].diff * self.dtype.type(sign / num)
                dx = bottom[i].diff.reshape(self._diff.shape)
                xp.multiply(self._diff, factor, out=dx)
                dx *= alpha
