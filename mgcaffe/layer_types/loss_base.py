"""What loss layers share: the scalar top, the label checks and Caffe's normalisation modes."""

from __future__ import annotations

from ..proto import caffe_pb2
from .base import Layer

_Norm = caffe_pb2.LossParameter


class LossLayer(Layer):
    """Two bottoms (prediction, target/label), one scalar top carrying loss weight 1 by
    default. bottom[1] holds labels that cannot receive a gradient unless a subclass says so.
    """

    is_loss = True
    auto_top_blobs = True
    exact_num_bottom = 2
    exact_num_top = 1

    def allow_force_backward(self, bottom_index):
        return bottom_index != 1

    def reshape(self, bottom, top):
        if bottom[0].num_axes == 0 or bottom[1].num_axes == 0 or \
                bottom[0].shape[0] != bottom[1].shape[0]:
            raise self.error(f"the data and label need the same first dimension, got "
                             f"{bottom[0].shape} and {bottom[1].shape}")
        top[0].reshape(())

    def reject_label_gradient(self, propagate_down):
        """Caffe's rule: a label bottom cannot be backpropagated to."""
        if len(propagate_down) > 1 and propagate_down[1]:
            raise self.error("cannot backpropagate to the label input (bottom[1])")


def normalization_mode(loss_param, default) -> int:
    """The LossParameter mode: `normalization` if set, else the legacy `normalize` bool
    (true: VALID, false: BATCH_SIZE), else `default`."""
    if loss_param.HasField("normalization"):
        return loss_param.normalization
    if loss_param.HasField("normalize"):
        return _Norm.VALID if loss_param.normalize else _Norm.BATCH_SIZE
    return default


def normalizer(layer, mode, outer: int, inner: int, valid_count=None):
    """Caffe's divisor for the summed loss, at least 1 (a batch with every label ignored
    gives loss 0, not NaN). `valid_count` (an array on the layer's device, or None when no
    label is ignored) serves VALID; the result stays on the device in that case."""
    if mode == _Norm.FULL:
        return float(max(1, outer * inner))
    if mode == _Norm.VALID:
        if valid_count is None:
            return float(max(1, outer * inner))
        return layer.xp.maximum(valid_count, 1).astype(layer.dtype)
    if mode == _Norm.BATCH_SIZE:
        return float(max(1, outer))
    if mode == _Norm.NONE:
        return 1.0
    raise layer.error(f"unknown normalization mode {mode}; expected FULL, VALID, BATCH_SIZE "
                      f"or NONE")
