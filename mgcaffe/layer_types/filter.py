"""Filter: keep the items whose selector is non-zero (Caffe's FilterLayer).

Bottoms: K blobs to filter, then the selector (N, 1, ...) with N items; tops: the K blobs
restricted to the selected items (in order). As in Caffe, the tops of the first reshape keep
all N items (the selector's values are not known at setup); each forward sizes the tops to
the items its selector picks (the net reshapes the layers after it). Items not selected get a zero
gradient; the selector cannot take one.
"""

from __future__ import annotations

from .base import Layer
from .registry import register_layer


@register_layer
class Filter(Layer):
    """Pass on the items of each bottom whose selector value is non-zero."""

    type = "Filter"
    min_bottom = 2
    min_top = 1

    def allow_force_backward(self, bottom_index):
        return bottom_index != self._selector_index

    def layer_setup(self, bottom, top):
        if len(top) != len(bottom) - 1:
            raise self.error(f"needs one top per filtered bottom ({len(bottom) - 1}), got "
                             f"{len(top)}")
        self._selector_index = len(bottom) - 1
        self._first_reshape = True

    def reshape(self, bottom, top):
        selector = bottom[-1]
        if selector.num_axes < 1 or any(d != 1 for d in selector.shape[1:]):
            raise self.error(f"selector blob dimensions must be singletons (1), except the "
                             f"first; got shape {selector.shape}")
        for i, blob in enumerate(bottom[:-1]):
            if blob.num_axes < 1 or blob.shape[0] != selector.shape[0]:
                raise self.error(f"bottom[{i}] (shape {blob.shape}) must have the selector's "
                                 f"first dimension {selector.shape[0]}")
        self._select(bottom)
        n = int(self._indices.size)
        if self._first_reshape:
            n = selector.shape[0]
            self._first_reshape = False
        for blob, out in zip(bottom, top):
            out.reshape((n,) + blob.shape[1:])

    def _select(self, bottom):
        self._indices = self.xp.nonzero(bottom[-1].data.reshape(-1))[0]

    def forward(self, bottom, top):
        self._select(bottom)
        n = int(self._indices.size)
        for blob, out in zip(bottom, top):
            out.reshape((n,) + blob.shape[1:])
            out.data[...] = blob.data[self._indices]

    def backward(self, top, propagate_down, bottom):
        if propagate_down[self._selector_index]:
            raise self.error("cannot backpropagate to the selector (the last bottom)")
        for i, out in enumerate(top):
            if propagate_down[i]:
                bottom[i].diff[...] = 0
                bottom[i].diff[self._indices] = out.diff
