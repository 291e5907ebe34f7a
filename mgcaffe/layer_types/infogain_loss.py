"""InfogainLoss: softmax, then -sum_l H[label, l] log p_l (Caffe's InfogainLossLayer).

bottom[0]: scores, softmax over infogain_param.axis (default 1); bottom[1]: labels, one per
outer x inner position; the infogain matrix H (L x L, L = the number of classes) is
bottom[2] when given, else read from the BlobProto file infogain_loss_param.source. With
H = identity this is SoftmaxWithLoss. Optional top[1]: the probabilities. Normalisation VALID
by default (the deprecated `normalize` is refused, as Caffe does); ignore_label. Probabilities
are clipped at 1e-20 in the log. Gradient (Caffe's): (p_l * sum_m H[label, m] - H[label, l])
times loss_weight / normalizer; none into the labels or H.
"""

from __future__ import annotations

from ..errors import MgcaffeError
from ..formats.protoio import read_binaryproto
from .loss_base import LossLayer, normalizer
from .registry import register_layer
from .softmax import softmax_dims, softmax_into

LOG_THRESHOLD = 1e-20


@register_layer
class InfogainLoss(LossLayer):
    """Multinomial logistic loss weighted by an infogain matrix; see the module docstring."""

    type = "InfogainLoss"
    exact_num_bottom = None
    min_bottom = 2
    max_bottom = 3
    exact_num_top = None
    min_top = 1
    max_top = 2

    def allow_force_backward(self, bottom_index):
        return bottom_index == 0

    def layer_setup(self, bottom, top):
        lp = self.param.loss_param
        if lp.HasField("normalize"):
            raise self.error('loss_param.normalize is deprecated here; use "normalization"')
        self.ignore_label = int(lp.ignore_label) if lp.HasField("ignore_label") else None
        self.mode = lp.normalization
        self.axis = int(self.param.infogain_loss_param.axis)
        self._matrix = None
        if len(bottom) < 3:
            source = self.param.infogain_loss_param.source
            if not source:
                raise self.error("infogain matrix source must be specified "
                                 "(infogain_loss_param.source, or a third bottom)")
            try:
                self._matrix = self.xp.asarray(read_binaryproto(source, dtype=self.dtype))
            except (OSError, MgcaffeError, ValueError) as exc:
                raise self.error(f"cannot read the infogain matrix {source!r}: {exc}") from None

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        _, outer, channels, inner = softmax_dims(self, bottom[0].shape, self.axis)
        self._dims = (outer, channels, inner)
        if bottom[1].count != outer * inner:
            raise self.error(f"number of labels must match number of predictions: "
                             f"{bottom[1].count} labels for {outer * inner} predictions "
                             f"(scores of shape {bottom[0].shape}, axis {self.axis})")
        h = bottom[2] if len(bottom) > 2 else self._matrix
        size = h.count if len(bottom) > 2 else int(h.size)
        if size != channels * channels:
            raise self.error(f"the infogain matrix needs {channels} x {channels} values, "
                             f"found {size}")
        if len(top) > 1:
            top[1].reshape(bottom[0].shape)
        self._prob = self.xp.zeros(self._dims, dtype=self.dtype)

    def _h(self, bottom):
        channels = self._dims[1]
        h = bottom[2].data if len(bottom) > 2 else self._matrix
        return h.reshape(channels, channels)

    def _labels(self, bottom):
        xp = self.xp
        outer, channels, inner = self._dims
        raw = bottom[1].data.reshape(outer, inner).astype(xp.int64)
        valid = (raw != self.ignore_label) if self.ignore_label is not None else \
            xp.ones(raw.shape, dtype=bool)
        bad = valid & ((raw < 0) | (raw >= channels))
        self.check_on_device(bad.any(), lambda: self.error(
            f"a label is out of range for {channels} classes"))  # GPU: read with the loss
        return xp.where(valid & ~bad, raw, 0), valid

    def forward(self, bottom, top):
        xp = self.xp
        softmax_into(xp, bottom[0].data.reshape(self._dims), self._prob)
        labels, valid = self._labels(bottom)
        rows = self._h(bottom)[labels]                     # (outer, inner, L)
        logp = xp.log(xp.maximum(self._prob, self.dtype.type(LOG_THRESHOLD)))
        losses = -(rows * logp.transpose(0, 2, 1)).sum(axis=2) * valid
        count = valid.sum() if self.ignore_label is not None else None
        self._normalizer = normalizer(self, self.mode, self._dims[0], self._dims[2], count)
        top[0].data[...] = losses.sum() / self._normalizer
        if len(top) > 1:
            top[1].data[...] = self._prob.reshape(top[1].shape)

    def backward(self, top, propagate_down, bottom):
        self.reject_label_gradient(propagate_down)
        if len(propagate_down) > 2 and propagate_down[2]:
            raise self.error("cannot backpropagate to the infogain matrix (bottom[2])")
        if not propagate_down[0]:
            return
        h = self._h(bottom)
        labels, valid = self._labels(bottom)
        row_sums = h.sum(axis=1)[labels]                    # (outer, inner)
        rows = h[labels].transpose(0, 2, 1)                 # (outer, L, inner)
        dx = bottom[0].diff.reshape(self._dims)
        dx[...] = self._prob * row_sums[:, None, :] - rows
        dx *= valid[:, None, :]
        dx *= top[0].diff / self._normalizer

