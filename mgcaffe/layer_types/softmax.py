"""Softmax and SoftmaxWithLoss (the multinomial logistic loss of a softmax, fused)."""

from __future__ import annotations

import numpy as np

from ..backend import to_host
from ..kernels.cuda import softmax_loss as cuda_softmax_loss
from ..proto import caffe_pb2
from .base import Layer
from .choice.softmax_loss import choose_softmax_loss
from .layer_util import canonical_axis, count
from .loss_base import LossLayer, normalization_mode, normalizer
from .registry import register_layer

#: Caffe clips probabilities at FLT_MIN before the log.
FLT_MIN = float(np.finfo(np.float32).tiny)


def softmax_dims(layer, shape, axis: int) -> tuple[int, int, int, int]:
    """(axis, outer, channels, inner) for a softmax over `axis` of `shape`."""
    axis = canonical_axis(layer, axis, len(shape))
    return axis, count(shape, 0, axis), shape[axis], count(shape, axis + 1)


def softmax_into(xp, x, y):
    """y = softmax of x over axis 1 of (outer, channels, inner) arrays (max subtracted first)."""
    xp.subtract(x, x.max(axis=1, keepdims=True), out=y)
    xp.exp(y, out=y)
    y /= y.sum(axis=1, keepdims=True)


@register_layer
class SoftmaxLayer(Layer):
    """y = exp(x) / sum(exp(x)) over `axis` (default 1). May run in place."""

    type = "Softmax"
    exact_num_bottom = 1
    exact_num_top = 1

    def reshape(self, bottom, top):
        _, *self._dims = softmax_dims(self, bottom[0].shape, int(self.param.softmax_param.axis))
        if top[0] is not bottom[0]:
            top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        softmax_into(self.xp, bottom[0].data.reshape(self._dims),
                     top[0].data.reshape(self._dims))

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        # dx = (dy - sum(dy * y)) * y over the softmax axis; needs only y, so in place works.
        y = top[0].data.reshape(self._dims)
        dy = top[0].diff.reshape(self._dims)
        dot = (dy * y).sum(axis=1, keepdims=True)
        dx = bottom[0].diff.reshape(self._dims)
        self.xp.subtract(dy, dot, out=dx)
        dx *= y


@register_layer
class SoftmaxWithLossLayer(LossLayer):
    """loss = sum over non-ignored positions of -log(max(p[label], FLT_MIN)) / normalizer.

    bottom[0]: scores, softmax over `softmax_param.axis` (default 1); bottom[1]: labels (a
    float blob of integer values, one per outer*inner position). Optional top[1]: the
    probabilities. Normalisation VALID by default (legacy `normalize`); ignore_label.

    On a GPU the layer's `choice` is `gpu-cuda-kernels` (float32, float64: one CUDA kernel
    forward and one backward, kernels/cuda_softmax_loss.py) or `gpu-array-code`.
    """

    type = "SoftmaxWithLoss"
    min_top = 1
    max_top = 2
    exact_num_top = None

    def layer_setup(self, bottom, top):
        lp = self.param.loss_param
        self.ignore_label = int(lp.ignore_label) if lp.HasField("ignore_label") else None
        self.mode = normalization_mode(lp, caffe_pb2.LossParameter.VALID)
        self._prob = None
        self._rows = None  # arange(outer), the plain path's row indices

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        _, outer, channels, inner = softmax_dims(self, bottom[0].shape,
                                                 int(self.param.softmax_param.axis))
        self._dims = (outer, channels, inner)
        if bottom[1].count != outer * inner:
            raise self.error(f"label count {bottom[1].count} must equal the number of "
                             f"predictions {outer * inner} (outer {outer} x inner {inner}) for "
                             f"scores of shape {bottom[0].shape}")
        if len(top) > 1:
            top[1].reshape(bottom[0].shape)
        if self._prob is None or self._prob.shape != bottom[0].shape:
            self._prob = self.xp.zeros(bottom[0].shape, dtype=self.dtype)
        self.choice = choose_softmax_loss(inner, self.ignore_label is not None, self.dtype,
                                          self.choice_target(), self.ctx.rules.softmax_loss)

    def _kernels(self) -> bool:
        choice = getattr(self, "choice", None)
        return choice is not None and choice.path == "gpu-cuda-kernels"

    def _label_error(self, bottom, channels):
        """The error for the first label out of range (read from the host; after the deferred
        device check found one)."""
        raw = to_host(bottom[1].data).reshape(-1).astype(np.int64)
        valid = raw != self.ignore_label if self.ignore_label is not None else True
        label = int(raw[valid & ((raw < 0) | (raw >= channels))][0])
        return self.error(f"label {label} is out of range for {channels} classes "
                          f"(expected 0 <= label < {channels}"
                          + (f" or ignore_label {self.ignore_label})"
                             if self.ignore_label is not None else ")"))

    def _labels(self, bottom):
        """(labels as ints with ignored ones set to 0, valid mask), both (outer, inner)."""
        xp = self.xp
        outer, channels, inner = self._dims
        raw = bottom[1].data.reshape(outer, inner).astype(xp.int64)
        valid = raw != self.ignore_label if self.ignore_label is not None else \
            xp.ones(raw.shape, dtype=bool)
        bad = valid & ((raw < 0) | (raw >= channels))

        def error():
            label = int(to_host(raw[bad])[0])
            return self.error(f"label {label} is out of range for {channels} classes "
                              f"(expected 0 <= label < {channels}"
                              + (f" or ignore_label {self.ignore_label})"
                                 if self.ignore_label is not None else ")"))

        # On the GPU no host wait of its own: read back with the loss (check_on_device).
        self.check_on_device(bad.any(), error)
        # (a bad label indexes class 0 until the check is read: never out of bounds)
        return xp.where(valid & ~bad, raw, 0), valid

    def _plain(self) -> bool:
        """The common case, run with fewer numpy calls: the CPU, one prediction per sample
        (inner 1), no ignore_label, no probability top (a tiny layer: its time is per-call
        overhead, 0.1-0.2 ms in a LeNet pass for some 20 calls)."""
        return self.choice.path == "plain"

    def _forward_plain(self, bottom, top):
        outer, channels, _ = self._dims
        prob = self._prob.reshape(outer, channels)
        x = bottom[0].data.reshape(outer, channels)
        np.subtract(x, x.max(axis=1, keepdims=True), out=prob)
        np.exp(prob, out=prob)
        prob /= prob.sum(axis=1, keepdims=True)
        labels = bottom[1].data.reshape(outer).astype(np.intp)
        # As unsigned, a negative label is huge: one comparison checks both ends.
        if (labels.view(np.uintp) >= channels).any():
            bad = labels[(labels < 0) | (labels >= channels)]
            raise self.error(f"label {int(bad[0])} is out of range for {channels} classes "
                             f"(expected 0 <= label < {channels})")
        rows = self._rows
        if rows is None or rows.shape[0] != outer:
            rows = self._rows = np.arange(outer)
        picked = prob[rows, labels]
        np.maximum(picked, self.dtype.type(FLT_MIN), out=picked)
        np.log(picked, out=picked)
        self._normalizer = normalizer(self, self.mode, outer, 1)
        top[0].data[...] = -picked.sum() / self._normalizer
        self._saved_labels = labels

    def _forward_kernels(self, bottom, top):
        """Forward as one CUDA kernel and one reduction of its statistics (no host wait: the
        label check is read back with the loss)."""
        xp = self.xp
        outer, channels, inner = self._dims
        stats = self.scratch(0, (3, outer * inner))
        cuda_softmax_loss.softmax_loss_forward(bottom[0].data, bottom[1].data, self._prob,
                                               stats, self._dims, self.ignore_label)
        sums = stats.sum(axis=1)
        valid_count = sums[cuda_softmax_loss.STAT_VALID] \
            if self.ignore_label is not None else None
        self._normalizer = normalizer(self, self.mode, outer, inner, valid_count)
        xp.divide(sums[cuda_softmax_loss.STAT_LOSS], self._normalizer, out=top[0].data)
        self.check_on_device(sums[cuda_softmax_loss.STAT_BAD],
                             lambda: self._label_error(bottom, channels))
        if len(top) > 1:
            xp.copyto(top[1].data, self._prob)

    def forward(self, bottom, top):
        xp = self.xp
        if len(top) == 1 and self._plain():
            return self._forward_plain(bottom, top)
        if self._kernels():
            return self._forward_kernels(bottom, top)
        prob = self._prob.reshape(self._dims)
        softmax_into(xp, bottom[0].data.reshape(self._dims), prob)
        labels, valid = self._labels(bottom)
        picked = xp.take_along_axis(prob, labels[:, None, :], axis=1)[:, 0, :]
        losses = -xp.log(xp.maximum(picked, self.dtype.type(FLT_MIN)))
        losses *= valid
        valid_count = valid.sum() if self.ignore_label is not None else None
        self._normalizer = normalizer(self, self.mode, self._dims[0], self._dims[2], valid_count)
        top[0].data[...] = losses.sum() / self._normalizer
        if len(top) > 1:
            xp.copyto(top[1].data, self._prob)
        self._saved_labels, self._saved_valid = labels, valid

    def backward(self, top, propagate_down, bottom):
        self.reject_label_gradient(propagate_down)
        if not propagate_down[0]:
            return
        xp = self.xp
        outer, channels, inner = self._dims
        if self._kernels():
            scale = xp.divide(top[0].diff, self._normalizer).reshape(1)
            cuda_softmax_loss.softmax_loss_backward(self._prob, bottom[1].data, scale,
                                                    bottom[0].diff, self._dims,
                                                    self.ignore_label)
            return
        if self._plain() and self._saved_labels.ndim == 1:
            # Caffe's order: dx = prob, dx[label] -= 1, dx *= weight / normalizer.
            dx = bottom[0].diff.reshape(outer, channels)
            np.copyto(dx, self._prob.reshape(outer, channels))
            dx[self._rows, self._saved_labels] -= 1
            dx *= top[0].diff / self._normalizer
            return
        dx = bottom[0].diff.reshape(self._dims)
        xp.copyto(dx, self._prob.reshape(self._dims))
        one_hot = xp.arange(channels).reshape(1, -1, 1) == self._saved_labels[:, None, :]
        dx -= one_hot
        dx *= self._saved_valid[:, None, :]
        dx *= top[0].diff / self._normalizer
