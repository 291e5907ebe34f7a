"""Embed: a lookup table from integer indices to learned vectors (Caffe's EmbedLayer).

Bottom: indices (any shape) holding integers in [0, input_dim). Top: bottom.shape +
(num_output,). Weight (input_dim, num_output) from weight_filler; bias (num_output,) from
bias_filler when bias_term (default true). The indices cannot take a gradient.
"""

from __future__ import annotations

from .base import Layer
from .layer_util import ensure_param_blob
from .registry import register_layer


def scatter_add(xp, target, indices, values):
    """target[indices[k]] += values[k], repeated indices accumulating (ufunc.at semantics)."""
    if hasattr(xp.add, "at"):
        xp.add.at(target, indices, values)
    else:  # older CuPy
        import cupyx  # noqa: PLC0415 - only reached on such a CuPy

        cupyx.scatter_add(target, indices, values)


@register_layer
class Embed(Layer):
    """top[..., :] = weight[bottom[...]] (+ bias)."""

    type = "Embed"
    exact_num_bottom = 1
    exact_num_top = 1

    def allow_force_backward(self, bottom_index):
        return False

    def layer_setup(self, bottom, top):
        p = self.param.embed_param
        self.num_output = int(p.num_output)
        self.input_dim = int(p.input_dim)
        if self.num_output <= 0:
            raise self.error("embed_param.num_output must be positive")
        if self.input_dim <= 0:
            raise self.error("embed_param.input_dim must be positive")
        self.bias_term = bool(p.bias_term)
        ensure_param_blob(self, 0, (self.input_dim, self.num_output), p.weight_filler, "weight")
        if self.bias_term:
            ensure_param_blob(self, 1, (self.num_output,), p.bias_filler, "bias")
        if len(self.blobs) != 1 + self.bias_term:
            raise self.error(f"expected {1 + self.bias_term} parameter blobs, found "
                             f"{len(self.blobs)}")

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape + (self.num_output,))

    def _indices(self, bottom):
        xp = self.xp
        values = bottom[0].data.reshape(-1)
        index = values.astype(xp.int64)
        if values.size:
            if bool((index != values).any()):
                raise self.error("non-integer input (the indices must be whole numbers)")
            low, high = int(index.min()), int(index.max())
            if low < 0 or high >= self.input_dim:
                raise self.error(f"index out of range: found {low if low < 0 else high}, "
                                 f"expected 0 <= index < input_dim = {self.input_dim}")
        return index

    def forward(self, bottom, top):
        out = top[0].data.reshape(-1, self.num_output)
        self.xp.take(self.blobs[0].data, self._indices(bottom), axis=0, out=out)
        if self.bias_term:
            out += self.blobs[1].data

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            raise self.error("cannot backpropagate to the indices (bottom[0])")
        top_diff = top[0].diff.reshape(-1, self.num_output)
        if self.param_propagate_down[0]:
            scatter_add(self.xp, self.blobs[0].diff, self._indices(bottom), top_diff)
        if self.bias_term and self.param_propagate_down[1]:
            self.blobs[1].diff += top_diff.sum(axis=0)
