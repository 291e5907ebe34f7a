"""Im2col: the convolution's column buffer as a layer (Caffe's Im2colLayer).

Reads kernel, pad, stride and dilation from convolution_param (num_output is not used), for
any number of spatial axes after `axis`. Top shape: the bottom's, with the channel axis
multiplied by prod(kernel) and each spatial axis replaced by its convolution output size;
per item the top is Caffe's (C * prod(kernel), positions) column matrix. Backward is col2im
(the sum of the column gradients at each input position).
"""

from __future__ import annotations

from math import prod

from ..kernels.im2col_nd import col2im_nd, im2col_nd, output_shape
from .base import Layer
from .convolution import spatial_pair
from .layer_util import canonical_axis
from .registry import register_layer


@register_layer
class Im2col(Layer):
    """Unroll each convolution window into a column."""

    type = "Im2col"
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.convolution_param
        shape = bottom[0].shape
        self.axis = canonical_axis(self, int(p.axis), len(shape))
        self.num_spatial = len(shape) - self.axis - 1
        if self.num_spatial < 1:
            raise self.error(f"needs at least 1 spatial axis after axis {self.axis}, got "
                             f"shape {shape}")
        n = self.num_spatial
        self.kernel = spatial_pair(self, p, "kernel", None, n)
        self.pad = spatial_pair(self, p, "pad", 0, n)
        self.stride = spatial_pair(self, p, "stride", 1, n)
        self.dilation = spatial_pair(self, p, "dilation", 1, n)
        for name, values in (("kernel", self.kernel), ("stride", self.stride),
                             ("dilation", self.dilation)):
            if min(values) <= 0:
                raise self.error(f"{name} dimensions must be positive, got {values}")

    def _geometry(self):
        return self.kernel, self.pad, self.stride, self.dilation

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if len(shape) != self.axis + 1 + self.num_spatial:
            raise self.error(f"expected {self.num_spatial} spatial axes after axis "
                             f"{self.axis}, got shape {shape}")
        self._image = (prod(shape[:self.axis]),) + shape[self.axis:]
        out = output_shape(shape[self.axis + 1:], *self._geometry())
        if min(out) <= 0:
            raise self.error(f"input {shape[self.axis + 1:]} gives an empty output {out}")
        top[0].reshape(shape[:self.axis] + (shape[self.axis] * prod(self.kernel),) + out)

    def forward(self, bottom, top):
        cols = im2col_nd(bottom[0].data.reshape(self._image), *self._geometry())
        top[0].data[...] = cols.reshape(top[0].shape)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        n, c, *spatial = self._image
        out = top[0].shape[self.axis + 1:]
        cols = top[0].diff.reshape((n, c) + self.kernel + out)
        bottom[0].diff[...] = col2im_nd(cols, spatial, *self._geometry()).reshape(
            bottom[0].shape)
