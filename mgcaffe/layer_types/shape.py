"""Layers that only move or share data: Split, Flatten, Reshape, Silence."""

from __future__ import annotations

from ..cpu.parallel import for_each_chunk
from .base import Layer
from .layer_util import canonical_axis, count
from .registry import register_layer


@register_layer
class SplitLayer(Layer):
    """One bottom shared by several tops (the Net inserts these where a blob feeds several
    layers). Forward shares the data; backward sums the tops' diffs into the bottom diff."""

    type = "Split"
    exact_num_bottom = 1
    min_top = 1

    def reshape(self, bottom, top):
        for t in top:
            if t is bottom[0]:
                raise self.error("cannot run in place")
            t.reshape(bottom[0].shape)
            t.share_data(bottom[0])

    def forward(self, bottom, top):
        # Re-share in case the bottom's array was replaced since reshape.
        for t in top:
            t.share_data(bottom[0])

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = self.xp
        dx = bottom[0].diff.reshape(-1)
        diffs = [t.diff.reshape(-1) for t in top]

        def part(start, stop):
            if len(diffs) == 1:
                xp.copyto(dx[start:stop], diffs[0][start:stop])
                return
            xp.add(diffs[0][start:stop], diffs[1][start:stop], out=dx[start:stop])
            for d in diffs[2:]:
                xp.add(dx[start:stop], d[start:stop], out=dx[start:stop])

        # One long stretch per thread: numpy's adds run on one core (GoogleNet's 4-top splits
        # at batch 8: 0.6-0.75x the time on two threads).
        for_each_chunk(xp, dx.size, part, cache_sized=False, runner=self.ctx.chunk_runner)


class _ViewLayer(Layer):
    """A top that is a reshaped view of the bottom's data. The diff is copied back rather
    than shared, so that zeroing one blob's diff never clears another's."""

    exact_num_bottom = 1
    exact_num_top = 1

    def top_shape(self, shape) -> list[int]:
        raise NotImplementedError

    def reshape(self, bottom, top):
        if top[0] is bottom[0]:
            raise self.error("cannot run in place")
        shape = self.top_shape(bottom[0].shape)
        if count(shape) != bottom[0].count:
            raise self.error(f"output shape {tuple(shape)} does not hold the "
                             f"{bottom[0].count} values of input shape {bottom[0].shape}")
        top[0].reshape(shape)
        top[0].share_data(bottom[0])

    def forward(self, bottom, top):
        # Re-share in case the bottom's array was replaced since reshape.
        top[0].share_data(bottom[0])

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = top[0].diff.reshape(bottom[0].shape)


@register_layer
class FlattenLayer(_ViewLayer):
    """Collapse axes axis..end_axis (defaults 1 and -1) into one."""

    type = "Flatten"

    def top_shape(self, shape):
        p = self.param.flatten_param
        start = canonical_axis(self, int(p.axis), len(shape))
        end = canonical_axis(self, int(p.end_axis), len(shape), "end_axis")
        if end < start:
            raise self.error(f"end_axis {end} comes before axis {start}")
        return [*shape[:start], count(shape, start, end + 1), *shape[end + 1:]]


@register_layer
class ReshapeLayer(_ViewLayer):
    """Replace axes axis..axis+num_axes-1 by reshape_param.shape, where 0 copies the input
    dimension at that position and one -1 is inferred from the count."""

    type = "Reshape"

    def layer_setup(self, bottom, top):
        dims = [int(d) for d in self.param.reshape_param.shape.dim]
        if dims.count(-1) > 1:
            raise self.error(f"shape {dims} has more than one -1 dimension")
        if any(d < -1 for d in dims):
            raise self.error(f"shape {dims} has a dimension below -1")
        self.dims = dims

    def top_shape(self, shape):
        p = self.param.reshape_param
        n = len(shape)
        start = int(p.axis) if p.axis >= 0 else n + int(p.axis) + 1
        if not 0 <= start <= n:
            raise self.error(f"axis {p.axis} is out of range for a {n}-D input")
        if p.num_axes < -1:
            raise self.error(f"num_axes must be >= 0, or -1 for all; got {p.num_axes}")
        end = n if p.num_axes == -1 else start + int(p.num_axes)
        if end > n:
            raise self.error(f"axis + num_axes = {end} is out of range for a {n}-D input")
        new = list(self.dims)
        for i, d in enumerate(new):
            if d == 0:
                if start + i >= n:
                    raise self.error(f"shape dim {i} is 0 (copy) but the input has no axis "
                                     f"{start + i}")
                new[i] = shape[start + i]
        out = [*shape[:start], *new, *shape[end:]]
        if -1 in new:
            known = count([d for d in out if d != -1])
            total = count(shape)
            if known == 0 or total % known:
                raise self.error(f"input count {total} is not divisible by the product of the "
                                 f"specified dimensions ({known})")
            out[start + new.index(-1)] = total // known
        return out


@register_layer
class SilenceLayer(Layer):
    """Consumes bottoms and produces nothing (keeps unused blobs from being net outputs)."""

    type = "Silence"
    min_bottom = 1
    exact_num_top = 0

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        pass

    def backward(self, top, propagate_down, bottom):
        for b, down in zip(bottom, propagate_down):
            if down:
                b.diff[...] = 0
