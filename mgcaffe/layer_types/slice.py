"""Slice: split one bottom along an axis into several tops."""

from __future__ import annotations

from .base import Layer
from .concat import axis_slices, legacy_axis
from .registry import register_layer


@register_layer
class SliceLayer(Layer):
    """Cut bottom[0] along `axis` (default 1; legacy slice_dim) at `slice_point`s, or into
    equal parts when no slice_point is given."""

    type = "Slice"
    exact_num_bottom = 1
    min_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.slice_param
        if p.HasField("axis") and p.HasField("slice_dim"):
            raise self.error("set either axis or slice_dim, not both")
        self.slice_points = [int(s) for s in p.slice_point]

    def _sizes(self, length: int, num_tops: int) -> list[int]:
        points = self.slice_points
        if not points:
            if length % num_tops:
                raise self.error(f"{num_tops} tops do not evenly divide the slice axis of "
                                 f"length {length}")
            return [length // num_tops] * num_tops
        if len(points) != num_tops - 1:
            raise self.error(f"{len(points)} slice_point values for {num_tops} tops; expected "
                             f"{num_tops - 1}")
        bounds = [0, *points, length]
        sizes = [b - a for a, b in zip(bounds, bounds[1:])]
        if any(s <= 0 for s in sizes[:-1]) or sizes[-1] < 0:
            raise self.error(f"slice_point {points} must increase strictly and stay within the "
                             f"slice axis of length {length}")
        return sizes

    def reshape(self, bottom, top):
        shape = list(bottom[0].shape)
        self.axis = legacy_axis(self, self.param.slice_param, len(shape), "slice_dim")
        sizes = self._sizes(shape[self.axis], len(top))
        for t, size in zip(top, sizes):
            shape[self.axis] = size
            t.reshape(shape)
        self._slices = axis_slices(self.axis, sizes)
        if len(top) == 1:
            top[0].share_data(bottom[0])

    def forward(self, bottom, top):
        if len(top) == 1:
            top[0].share_data(bottom[0])
            return
        x = bottom[0].data
        for t, index in zip(top, self._slices):
            t.data[...] = x[index]

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dx = bottom[0].diff
        for t, index in zip(top, self._slices):
            dx[index] = t.diff
