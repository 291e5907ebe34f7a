"""Concat: join bottoms along one axis."""

from __future__ import annotations

from math import prod

from ..cpu.parallel import for_each_chunk
from .base import Layer
from .layer_util import canonical_axis
from .registry import register_layer


def axis_slices(axis: int, sizes) -> list[tuple]:
    """Index tuples selecting consecutive runs of `sizes` along `axis`."""
    out, start = [], 0
    for size in sizes:
        out.append((slice(None),) * axis + (slice(start, start + size),))
        start += size
    return out


def legacy_axis(layer, param, num_axes: int, legacy_field: str) -> int:
    """The axis from `axis`, or from the legacy `concat_dim`/`slice_dim`; not both."""
    if param.HasField("axis") and param.HasField(legacy_field):
        raise layer.error(f"set either axis or {legacy_field}, not both")
    if param.HasField(legacy_field):
        axis = int(getattr(param, legacy_field))
        if axis >= num_axes:
            raise layer.error(f"{legacy_field} {axis} is out of range for a {num_axes}-D input")
        return axis
    return canonical_axis(layer, int(param.axis), num_axes)


@register_layer
class ConcatLayer(Layer):
    """Concatenate along `axis` (default 1; legacy concat_dim); other dimensions must match."""

    type = "Concat"
    min_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.concat_param
        if p.HasField("axis") and p.HasField("concat_dim"):
            raise self.error("set either axis or concat_dim, not both")

    def reshape(self, bottom, top):
        first = bottom[0].shape
        self.axis = legacy_axis(self, self.param.concat_param, len(first), "concat_dim")
        for i, b in enumerate(bottom[1:], start=1):
            other = b.shape
            if len(other) != len(first) or any(
                    d != e for k, (d, e) in enumerate(zip(first, other)) if k != self.axis):
                raise self.error(f"bottom[{i}] shape {other} does not match bottom[0] shape "
                                 f"{first} outside the concat axis {self.axis}")
        shape = list(first)
        shape[self.axis] = sum(b.shape[self.axis] for b in bottom)
        top[0].reshape(shape)
        self._slices = axis_slices(self.axis, [b.shape[self.axis] for b in bottom])
        if len(bottom) == 1:
            top[0].share_data(bottom[0])

    def _by_sample(self, body, shape):
        """body(start, stop) over chunks of the first axis on the CPU cores (kernels.parallel);
        with axis 0 one chunk (each bottom is then one contiguous copy)."""
        if self.axis == 0 or not shape:
            body(0, shape[0] if shape else 0)
            return
        for_each_chunk(self.xp, shape[0], body, item_elements=prod(shape[1:]),
                       cache_sized=False, runner=self.ctx.chunk_runner)

    def forward(self, bottom, top):
        if len(bottom) == 1:
            top[0].share_data(bottom[0])
            return
        y = top[0].data

        def samples(start, stop):
            for b, index in zip(bottom, self._slices):
                y[start:stop][index] = b.data[start:stop]

        self._by_sample(samples, y.shape)

    def backward(self, top, propagate_down, bottom):
        dy = top[0].diff

        def samples(start, stop):
            for b, index, down in zip(bottom, self._slices, propagate_down):
                if down:
                    b.diff[start:stop] = dy[start:stop][index]

        self._by_sample(samples, dy.shape)
