"""PReLU: a ReLU whose negative slope is learned, per channel or shared."""

from __future__ import annotations

from .layer_util import count, ensure_param_blob, filler_param
from .neuron import NeuronLayer
from .registry import register_layer


@register_layer
class PReLULayer(NeuronLayer):
    """y = max(x, 0) + a_c * min(x, 0), with one slope a_c per channel (axis 1) or one in all.

    blobs[0] has shape (C,), or () with channel_shared; the default filler is constant 0.25.
    Its gradient accumulates, as every parameter diff does.
    """

    type = "PReLU"
    # The slope gradient needs x, which an in-place forward overwrites.
    needs_input = True

    def layer_setup(self, bottom, top):
        p = self.param.prelu_param
        if bottom[0].num_axes < 2:
            raise self.error(f"needs an input with at least 2 axes, got shape {bottom[0].shape}")
        self.channel_shared = bool(p.channel_shared)
        shape = () if self.channel_shared else (bottom[0].shape[1],)
        filler = filler_param(p.filler, p.HasField("filler"), "constant", 0.25)
        ensure_param_blob(self, 0, shape, filler, "slope")

    def reshape(self, bottom, top):
        if bottom[0].num_axes < 2:
            raise self.error(f"needs an input with at least 2 axes, got shape {bottom[0].shape}")
        if not self.channel_shared and bottom[0].shape[1] != self.blobs[0].count:
            raise self.error(f"input has {bottom[0].shape[1]} channels but the slope blob has "
                             f"{self.blobs[0].count}")
        super().reshape(bottom, top)

    def _view(self, array):
        """(N, C, spatial) view of an input-shaped array."""
        shape = array.shape
        return array.reshape(shape[0], shape[1], count(shape, 2))

    def _slope(self):
        a = self.blobs[0].data
        return a if self.channel_shared else a.reshape(1, -1, 1)

    def forward(self, bottom, top):
        self.keep_input(bottom, top)
        xp = self.xp
        x, y = self._view(bottom[0].data), self._view(top[0].data)
        negative = xp.minimum(x, 0)
        negative *= self._slope()
        xp.maximum(x, 0, out=y)
        y += negative

    def backward(self, top, propagate_down, bottom):
        xp = self.xp
        x = self._view(self.input_data(bottom, top))
        dy = self._view(top[0].diff)
        nonpositive = x <= 0
        # Parameter gradient first: in place, the bottom diff below overwrites the top diff.
        if self.param_propagate_down[0]:
            contribution = dy * x
            contribution *= nonpositive
            if self.channel_shared:
                self.blobs[0].diff[...] += contribution.sum()
            else:
                self.blobs[0].diff[...] += contribution.sum(axis=(0, 2))
        if propagate_down[0]:
            slope = nonpositive * self._slope()
            slope += ~nonpositive
            xp.multiply(dy, slope, out=self._view(bottom[0].diff))
