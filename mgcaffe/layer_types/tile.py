"""Tile: repeat the block of axes from `axis` on, `tiles` times along that axis."""

from __future__ import annotations

from .base import Layer
from .layer_util import canonical_axis, count
from .registry import register_layer


@register_layer
class TileLayer(Layer):
    """top.shape[axis] = tiles * bottom.shape[axis]; each outer slice is repeated whole."""

    type = "Tile"
    exact_num_bottom = 1
    exact_num_top = 1

    def reshape(self, bottom, top):
        p = self.param.tile_param
        shape = list(bottom[0].shape)
        axis = canonical_axis(self, int(p.axis), len(shape))
        self.tiles = int(p.tiles)
        if self.tiles < 1:
            raise self.error(f"tiles must be >= 1, got {self.tiles}")
        self._outer = count(shape, 0, axis)
        self._inner = count(shape, axis)
        shape[axis] *= self.tiles
        top[0].reshape(shape)

    def forward(self, bottom, top):
        x = bottom[0].data.reshape(self._outer, 1, self._inner)
        y = top[0].data.reshape(self._outer, self.tiles, self._inner)
        y[...] = x

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = top[0].diff.reshape(self._outer, self.tiles, self._inner)
        dx = bottom[0].diff.reshape(self._outer, self._inner)
        dy.sum(axis=1, out=dx)
