"""BatchReindex: top[i] = bottom[0][index[i]] along axis 0 (Caffe's BatchReindexLayer).

bottom[1] is a 1-D blob of item indices into bottom[0] (repeats allowed); the top has
len(index) items. The backward sums the gradients of repeated items; the indices cannot take
a gradient.
"""

from __future__ import annotations

from .base import Layer
from .embed import scatter_add
from .registry import register_layer


@register_layer
class BatchReindex(Layer):
    """Gather items of bottom[0] by the indices in bottom[1]."""

    type = "BatchReindex"
    exact_num_bottom = 2
    exact_num_top = 1

    def allow_force_backward(self, bottom_index):
        return bottom_index != 1

    def reshape(self, bottom, top):
        if bottom[1].num_axes != 1:
            raise self.error(f"the indices (bottom[1]) must be 1-D, got shape "
                             f"{bottom[1].shape}")
        if bottom[0].num_axes < 1:
            raise self.error("bottom[0] needs at least one axis")
        top[0].reshape((bottom[1].shape[0],) + bottom[0].shape[1:])

    def _indices(self, bottom):
        index = bottom[1].data.astype(self.xp.int64)
        if index.size:
            low, high = int(index.min()), int(index.max())
            if low < 0:
                raise self.error("index specified for reindex layer was negative")
            if high >= bottom[0].shape[0]:
                raise self.error(f"index {high} specified for reindex layer is not below the "
                                 f"batch size {bottom[0].shape[0]}")
        return index

    def forward(self, bottom, top):
        index = self._indices(bottom)
        if index.size:
            self.xp.take(bottom[0].data, index, axis=0, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to the indices (bottom[1])")
        if not propagate_down[0]:
            return
        bottom[0].diff[...] = 0
        index = self._indices(bottom)
        if index.size:
            scatter_add(self.xp, bottom[0].diff, index, top[0].diff)
