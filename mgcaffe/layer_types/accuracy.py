"""Accuracy and ArgMax: read-outs of scores, with no gradient."""

from __future__ import annotations

from ..backend import to_host
from .base import Layer
from .layer_util import canonical_axis, count
from .registry import register_layer


class _NoBackward(Layer):
    """A layer Caffe gives no backward: force_backward may not reach it, and asking for a
    gradient is an error."""

    def allow_force_backward(self, bottom_index):
        return False

    def backward(self, top, propagate_down, bottom):
        if any(propagate_down):
            raise self.error(f"{self.type} has no gradient; it cannot propagate down")


@register_layer
class AccuracyLayer(_NoBackward):
    """top[0] = fraction of non-ignored positions whose label is among the top_k scores.

    A position counts when fewer than top_k other classes score at least as high as the
    label's class (so a tie goes against the label, as in Caffe). Optional top[1]: accuracy
    per class (0 for a class with no labels).
    """

    type = "Accuracy"
    exact_num_bottom = 2
    min_top = 1
    max_top = 2

    def layer_setup(self, bottom, top):
        p = self.param.accuracy_param
        self.top_k = int(p.top_k)
        self.ignore_label = int(p.ignore_label) if p.HasField("ignore_label") else None

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        axis = canonical_axis(self, int(self.param.accuracy_param.axis), len(shape))
        self._dims = (count(shape, 0, axis), shape[axis], count(shape, axis + 1))
        outer, classes, inner = self._dims
        if self.top_k < 1 or self.top_k > classes:
            raise self.error(f"top_k {self.top_k} must be between 1 and the number of classes "
                             f"{classes}")
        if bottom[1].count != outer * inner:
            raise self.error(f"label count {bottom[1].count} must equal the number of "
                             f"predictions {outer * inner} for scores of shape {shape}")
        top[0].reshape(())
        if len(top) > 1:
            top[1].reshape((classes,))

    def forward(self, bottom, top):
        xp = self.xp
        outer, classes, inner = self._dims
        scores = bottom[0].data.reshape(self._dims)
        raw = bottom[1].data.reshape(outer, inner).astype(xp.int64)
        valid = raw != self.ignore_label if self.ignore_label is not None else \
            xp.ones(raw.shape, dtype=bool)
        bad = valid & ((raw < 0) | (raw >= classes))

        def error():
            label = int(to_host(raw[bad])[0])
            return self.error(f"label {label} is out of range for {classes} classes")

        self.check_on_device(bad.any(), error)  # on the GPU: read back with the loss
        labels = xp.where(valid & ~bad, raw, 0)  # in bounds until the check is read
        true_score = xp.take_along_axis(scores, labels[:, None, :], axis=1)
        # Classes scoring >= the label's, the label itself included.
        at_least = (scores >= true_score).sum(axis=1)
        correct = (at_least <= self.top_k) & valid
        total = valid.sum()
        top[0].data[...] = correct.sum() / xp.maximum(total, 1)
        if len(top) > 1:
            flat = labels.reshape(-1)
            per_class = xp.bincount(flat, weights=valid.reshape(-1).astype(self.dtype),
                                    minlength=classes)
            hits = xp.bincount(flat, weights=correct.reshape(-1).astype(self.dtype),
                               minlength=classes)
            top[1].data[...] = hits / xp.maximum(per_class, 1)


@register_layer
class ArgMaxLayer(_NoBackward):
    """The indices (or values, or both) of the top_k largest scores.

    With `axis`: along that axis, top shape = input shape with shape[axis] = top_k, holding
    values if out_max_val else indices. Without: over all but the first axis, top shape
    (N, 1 or 2, top_k) (plus trailing 1s up to the input's rank); with out_max_val the
    indices come first, then the values. Ties go to the larger index (Caffe's sort order).
    """

    type = "ArgMax"
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.argmax_param
        self.top_k = int(p.top_k)
        self.out_max_val = bool(p.out_max_val)
        self.has_axis = p.HasField("axis")
        if self.top_k < 1:
            raise self.error(f"top_k must be >= 1, got {self.top_k}")

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if self.has_axis:
            self.axis = canonical_axis(self, int(self.param.argmax_param.axis), len(shape))
            dim = shape[self.axis]
            out = list(shape)
            out[self.axis] = self.top_k
        else:
            if not shape:
                raise self.error("needs an input with at least 1 axis")
            dim = count(shape, 1)
            out = [1] * max(len(shape), 3)
            out[0] = shape[0]
            out[2] = self.top_k
            if self.out_max_val:
                out[1] = 2
        if self.top_k > dim:
            raise self.error(f"top_k {self.top_k} exceeds the {dim} values it chooses from")
        top[0].reshape(out)

    def forward(self, bottom, top):
        xp = self.xp
        x = bottom[0].data
        if self.has_axis:
            rows = xp.moveaxis(x, self.axis, -1)
        else:
            rows = x.reshape(x.shape[0], -1)
        indices, values = self._top_k(rows)
        if self.has_axis:
            result = values if self.out_max_val else indices.astype(self.dtype)
            top[0].data[...] = xp.moveaxis(result, -1, self.axis)
            return
        parts = [indices.astype(self.dtype)] + ([values] if self.out_max_val else [])
        top[0].data[...] = xp.stack(parts, axis=1).reshape(top[0].shape)

    def _top_k(self, rows):
        """Indices and values of the top_k along the last axis, largest first; a tie picks
        the larger index, as Caffe's sort of (value, index) pairs does."""
        xp = self.xp
        dim = rows.shape[-1]
        work = rows.astype(self.dtype, copy=True)
        positions = xp.arange(dim)
        indices, values = [], []
        for _ in range(self.top_k):
            # argmax of the reversed row finds the last occurrence of the maximum.
            index = (dim - 1) - xp.argmax(work[..., ::-1], axis=-1)
            indices.append(index)
            values.append(xp.take_along_axis(rows, index[..., None], axis=-1)[..., 0])
            work = xp.where(positions == index[..., None], -xp.inf, work)
        return xp.stack(indices, axis=-1), xp.stack(values, axis=-1).astype(self.dtype)
