"""Crop: cut bottom[0] to the shape of bottom[1] from `axis` on, at given offsets."""

from __future__ import annotations

from .base import Layer
from .layer_util import canonical_axis
from .registry import register_layer


@register_layer
class CropLayer(Layer):
    """Axes >= axis (default 2) take bottom[1]'s size, starting at offset (none: 0; one: the
    same for every cropped axis; else one per cropped axis). Gradient only into bottom[0]."""

    type = "Crop"
    exact_num_bottom = 2
    exact_num_top = 1

    def allow_force_backward(self, bottom_index):
        return bottom_index == 0

    def reshape(self, bottom, top):
        p = self.param.crop_param
        big, ref = bottom[0].shape, bottom[1].shape
        if len(big) != len(ref):
            raise self.error(f"bottoms need the same number of axes, got {big} and {ref}")
        axis = canonical_axis(self, int(p.axis), len(big))
        offsets = [int(o) for o in p.offset]
        cropped = len(big) - axis
        if len(offsets) not in (0, 1, cropped):
            raise self.error(f"{len(offsets)} offsets for {cropped} cropped axes; give 0, 1 "
                             f"or {cropped}")
        index, shape = [], []
        for i in range(len(big)):
            if i < axis:
                index.append(slice(None))
                shape.append(big[i])
                continue
            offset = 0 if not offsets else offsets[0 if len(offsets) == 1 else i - axis]
            if offset + ref[i] > big[i]:
                raise self.error(f"axis {i}: offset {offset} + size {ref[i]} exceeds the "
                                 f"input size {big[i]}")
            index.append(slice(offset, offset + ref[i]))
            shape.append(ref[i])
        self._index = tuple(index)
        top[0].reshape(shape)

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data[self._index]

    def backward(self, top, propagate_down, bottom):
        # bottom[1] only gives the shape: Caffe never writes its diff (which stays at its zero
        # initialisation), so propagate_down[1] is accepted and yields a zero gradient.
        if len(propagate_down) > 1 and propagate_down[1]:
            bottom[1].diff[...] = 0
        if propagate_down[0]:
            dx = bottom[0].diff
            dx[...] = 0
            dx[self._index] = top[0].diff
